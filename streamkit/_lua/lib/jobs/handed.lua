-- handed(id, ok, st): what the end of a job hands its dependents.
--#include lib/jobs/record

-- What the end of job id hands its dependents: its result if it succeeded; else the
-- failure a failure callback gets (JSON: id, name, status, error), the detail the
-- others' DependencyFailed message gives and the root cause it carries on.
local function handed(id, ok, st)
  local k = jkey(id)
  if ok then return redis.call('HGET', k, 'result') or 'null', nil, nil end
  local f = redis.call('HMGET', k, 'name', 'error')
  local detail, cause = nil, nil
  if f[2] then
    local decoded, e = pcall(cjson.decode, f[2])
    if decoded and type(e) == 'table' and e.type then
      if e.type == 'DependencyFailed' and e.cause then
        detail, cause = tostring(e.cause), tostring(e.cause)
      else
        detail = tostring(e.type) .. ': ' .. string.sub(tostring(e.message or ''), 1, 500)
        cause = 'job ' .. id .. ' ended ' .. st .. ': ' .. detail
      end
    end
  end
  cause = cause or ('job ' .. id .. ' ended ' .. st)
  local info = '{"id":' .. cjson.encode(id) .. ',"name":' .. cjson.encode(f[1] or '') ..
    ',"status":' .. cjson.encode(st) .. ',"error":' .. (f[2] or 'null') .. '}'
  return info, detail, cause
end
