-- Registers a result waiter: a job not final yet is marked so that finishing it
-- notifies.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, id
-- REPLY: nil (an unknown job) | {status: str, result: str | nil, error: str | nil}
--#include lib/jobs/record

local k = jkey(ARGV[2])
local f = redis.call('HMGET', k, 'status', 'result', 'error')
if not f[1] then return false end
if not FINAL[f[1]] then redis.call('HSET', k, 'w', '1') end
return f
