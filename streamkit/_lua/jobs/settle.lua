-- Settles the dependents of ended jobs (see settle in lib/jobs/dependents).
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, budget (the most dependents settled in this call)
-- REPLY: int (the jobs with dependents left to settle)
--#include lib/clock
--#include lib/jobs/settling

settle_some(now_ms(), tonumber(ARGV[2]))
return redis.call('LLEN', SETTLE)
