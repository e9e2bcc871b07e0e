-- Reports progress, fenced: a fraction and message (progress(), as JSON [fraction,
-- message]; "" to leave it), and the job's own value (current_job().progress(value), as
-- JSON; absent to leave it).
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, id, token, progress (JSON, or ""), value (JSON; optional)
-- REPLY: 1 | 0 (fenced out)
--#include lib/jobs/record
--#include lib/jobs/events

local k = jkey(ARGV[2])
local f = redis.call('HMGET', k, 'owner', 'name')
if f[1] ~= ARGV[3] then return 0 end
if ARGV[4] ~= '' then redis.call('HSET', k, 'progress', ARGV[4]) end
if ARGV[5] then redis.call('HSET', k, 'pv', ARGV[5]) end
job_event(ARGV[2], f[2], 'progress', ARGV[5] or ARGV[4])
return 1
