-- Forgets messages delivered from this shard's XOUT.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, message... (as read)
-- REPLY: int (how many are left to deliver)
--#include lib/jobs/shard

for a = 2, #ARGV do redis.call('LREM', XOUT, 1, ARGV[a]) end
return redis.call('LLEN', XOUT)
