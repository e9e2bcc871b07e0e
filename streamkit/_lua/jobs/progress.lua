-- Reports progress, fenced.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, id, token, progress (JSON)
-- REPLY: 1 | 0 (fenced out)
--#include lib/jobs/record

local k = jkey(ARGV[2])
if redis.call('HGET', k, 'owner') ~= ARGV[3] then return 0 end
redis.call('HSET', k, 'progress', ARGV[4])
return 1
