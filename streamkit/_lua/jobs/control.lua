-- Pauses or resumes a queue shard, or one job name on it. Pausing marks it (the claim
-- script starts no job of a paused name, and holds them back; none at all while the
-- whole queue is paused). Resuming unmarks it and lets out up to `budget` of the jobs
-- that the pause of that name held back, in order.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, action ('pause' or 'resume'), name (the job name; '*': the whole queue),
--   budget
-- REPLY: {held: int (how many it holds back still: call again until 0), moved: int (how
--   many it let out)}
--#include lib/jobs/unpark

local action, name, budget = ARGV[2], ARGV[3], tonumber(ARGV[4])
if action == 'pause' then
  redis.call('HSET', CTL, name, 1)
  return {0, 0}
end
redis.call('HDEL', CTL, name)
if name == '*' then return {0, 0} end
local pk = B .. ':park:p:' .. name
local moved = unpark(pk, budget)
return {redis.call('LLEN', pk), moved}
