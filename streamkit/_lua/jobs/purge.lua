-- Deletes dead jobs and their records.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, id...
-- REPLY: [str] (the ids deleted)
--#include lib/jobs/dead
--#include lib/jobs/counters

return each_dead(function(_, k, name)
  redis.call('DEL', k)
  move(name, 'dead', nil)
end)
