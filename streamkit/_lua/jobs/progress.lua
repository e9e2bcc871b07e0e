-- Reports progress, fenced: a fraction and message (progress(), as JSON [fraction,
-- message]; "" to leave it), and the job's own value (current_job().progress(value), as
-- JSON; absent to leave it).
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, id, token, progress (JSON, or ""), value (JSON; optional)
-- REPLY: 1 | 0 (fenced out)
--#include lib/jobs/record

local k = jkey(ARGV[2])
if redis.call('HGET', k, 'owner') ~= ARGV[3] then return 0 end
if ARGV[4] ~= '' then redis.call('HSET', k, 'progress', ARGV[4]) end
if ARGV[5] then redis.call('HSET', k, 'pv', ARGV[5]) end
return 1
