-- The producer's idempotent append (see streamkit._idempotent): appends and trims as
-- lib/append does, once per marker. The marker records the new ids for `ttl` seconds;
-- a retry that finds it returns the ids it recorded instead of appending again. The
-- markers of finished appends are deleted after the append, never before.
--
-- KEYS: stream, marker, finished... (markers of finished appends, to delete)
-- TAG: {partition}
-- ARGV: keep (partition_size), cap (max_len; 0: none), ttl (the marker's, in seconds),
--   retry (1 on a retry: the marker may exist already), entry... (see lib/append)
-- REPLY: {ids: [str], dropped: int (unprocessed entries the hard cap dropped),
--   before: int (1: the marker was there, appended by an earlier try; else 0)}
--#include lib/append

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
    local bar = string.find(seen, '|', 1, true)
    local done = {}
    for id in string.gmatch(string.sub(seen, bar + 1), '[^,]+') do done[#done + 1] = id end
    return {done, tonumber(string.sub(seen, 1, bar - 1)), 1}
  end
end
local ids, dropped = append_and_trim(KEYS[1], 5, tonumber(ARGV[1]), tonumber(ARGV[2]))
redis.call('SET', KEYS[2], dropped .. '|' .. table.concat(ids, ','), 'EX', ARGV[3])
forget_finished()
return {ids, dropped, 0}
