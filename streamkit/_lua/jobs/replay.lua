-- Queues dead jobs again with their tries reset.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, id...
-- REPLY: [str] (the ids that were dead and are queued again)
--#include lib/jobs/dead
--#include lib/jobs/queue

return each_dead(function(id, k, name)
  redis.call('HSET', k, 'tries', 0, 'lost', 0, 'owner', '')
  redis.call('HDEL', k, 'dead_entry', 'finished', 'abort', 'progress')
  push(id, k, name, 'dead', 'sent')
end)
