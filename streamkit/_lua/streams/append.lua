-- The producer's idempotent append (see streamkit._idempotent): appends and trims as
-- lib/append does, once per marker. The marker records the new ids for `ttl` seconds;
-- a retry that finds it returns the ids it recorded instead of appending again. The
-- markers of finished appends are deleted after the append, never before.
--
-- KEYS: stream, marker, finished... (markers of finished appends, to delete)
-- TAG: {partition}
-- ARGV: keep (partition_size), cap (max_len; 0: none), ttl (the marker's, in seconds),
--   retry (1 on a retry: the marker may exist already), entry... (see lib/append)
-- REPLY: {first: str (the first of consecutive new ids), dropped: int (unprocessed
--   entries the hard cap dropped), before: int (1: the marker was there, appended by an
--   earlier try; else 0), count: int (how many ids)} | {ids: [str] (ids that are not
--   consecutive, one by one), dropped: int, before: int}
--#include lib/append

-- consecutive(ids): the first of `ids` if they follow one another in one millisecond
-- (ms-s, ms-(s+1), ...: one call's appends, as a rule), so that it and their number say
-- them all; else nil (the ids said one by one).
local function consecutive(ids)
  local n = #ids
  if n == 0 then return nil end
  local first, last = ids[1], ids[n]
  local dash = string.find(first, '-', 1, true)
  local seq = string.sub(first, dash + 1)
  -- (Sequence numbers past 2^53 are not compared as floats: said one by one.)
  if #seq > 15 or string.sub(last, 1, dash) ~= string.sub(first, 1, dash) then return nil end
  local tail = string.sub(last, dash + 1)
  if #tail > 15 or tonumber(tail) - tonumber(seq) ~= n - 1 then return nil end
  return first
end

-- Finished markers are deleted after the append, never before: Redis at maxmemory
-- lets a script that has written once write on (DEL would let XADD past the limit),
-- so the append is refused exactly when Redis is full.
local function forget_finished()
  for i = 3, #KEYS do redis.call('DEL', KEYS[i]) end
end
if ARGV[4] == '1' then
  local seen = redis.call('GET', KEYS[2])
  if seen then
    -- A write, so that a WAIT after this call (send(..., replicas=N)) waits for the
    -- replication stream to pass it, and so the earlier append too.
    redis.call('EXPIRE', KEYS[2], ARGV[3])
    forget_finished()
    -- The marker: "dropped|first+count", or "dropped|id,id,...".
    local bar = string.find(seen, '|', 1, true)
    local dropped = tonumber(string.sub(seen, 1, bar - 1))
    local plus = string.find(seen, '+', bar, true)
    if plus then
      return {string.sub(seen, bar + 1, plus - 1), dropped, 1, tonumber(string.sub(seen, plus + 1))}
    end
    local done = {}
    for id in string.gmatch(string.sub(seen, bar + 1), '[^,]+') do done[#done + 1] = id end
    return {done, dropped, 1}
  end
end
local ids, dropped = append_and_trim(KEYS[1], 5, tonumber(ARGV[1]), tonumber(ARGV[2]))
-- One call's ids follow one another, as a rule: the first and their number say them all,
-- in the marker and in the reply (a reply of 1,000 ids costs Redis more than the XADDs'
-- own work would suggest).
local first = consecutive(ids)
if first then
  redis.call('SET', KEYS[2], dropped .. '|' .. first .. '+' .. #ids, 'EX', ARGV[3])
  forget_finished()
  return {first, dropped, 0, #ids}
end
redis.call('SET', KEYS[2], dropped .. '|' .. table.concat(ids, ','), 'EX', ARGV[3])
forget_finished()
return {ids, dropped, 0}
