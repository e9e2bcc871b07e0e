-- Adds, changes or removes a runtime schedule (on shard 0). Bumps the schedules'
-- version, which workers watch.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, op ('set' or 'del'), name, spec... (its JSON, for 'set')
-- REPLY: int (1, or for 'del' whether there was such a schedule)
--#include lib/jobs/shard

local op, name = ARGV[2], ARGV[3]
local n = 1
if op == 'set' then
  redis.call('HSET', B .. ':crontab', name, ARGV[4])
else
  n = redis.call('HDEL', B .. ':crontab', name)
end
redis.call('INCR', B .. ':crontab:v')
return n
