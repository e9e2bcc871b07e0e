-- hist_add(h, line) and hist_end(try, now, outcome, err): the lines of a job's history.

-- A job's history (field 'hist'): one line per try's start or end, the newest
-- HIST_MAX bytes kept. Callers read and write the field with the HMGET/HSET they make
-- anyway, so the hot path pays no extra call.
local HIST_MAX = 2048
local function hist_add(h, line)
  h = (h or '') .. line .. '\n'
  if #h > HIST_MAX then
    local cut = string.find(h, '\n', #h - HIST_MAX, true)
    if cut then h = string.sub(h, cut + 1) end
  end
  return h
end
local function hist_end(try, now, outcome, err)
  local line = 'e,' .. try .. ',' .. now .. ',' .. outcome
  if err then
    local kind = string.match(err, '"type":"([^"]*)"')
    if kind then line = line .. ',' .. kind end
  end
  return line
end
