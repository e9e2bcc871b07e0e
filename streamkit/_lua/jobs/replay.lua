-- Queues dead jobs again with their tries reset, saying when in the job's record.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, id...
-- REPLY: [str] (the ids that were dead and are queued again)
--#include lib/clock
--#include lib/jobs/dead
--#include lib/jobs/queue

local now = now_ms()
return each_dead(function(id, k, name)
  -- (`replayed`: when, for the job's history)
  redis.call('HSET', k, 'tries', 0, 'lost', 0, 'owner', '', 'replayed', now)
  redis.call('HDEL', k, 'dead_entry', 'finished', 'abort', 'progress')
  push(id, k, name, 'dead', 'sent')
end)
