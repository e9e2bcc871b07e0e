-- Delivers the ends of jobs on other shards to their dependents on this one. Per
-- message, its JSON [queue, shard, dependent id, job id, ok (1/0), result or failure,
-- detail, cause, status] (as queued on XOUT). Idempotent: a dependent takes each job's
-- end once (its 'xpend' set); one not enqueued yet finds it when it is ('early').
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, message...
-- REPLY: int (jobs with dependents left to settle, plus messages to other shards
--   waiting to be delivered)
--#include lib/clock
--#include lib/jobs/settling

local now = now_ms()
for a = 2, #ARGV do
  local it = cjson.decode(ARGV[a])
  local d, x = it[3], it[4]
  if redis.call('EXISTS', jkey(d)) == 0 then
    local ek = B .. ':early:' .. d
    redis.call('HSET', ek, x, cjson.encode({it[1], it[2], it[5], it[6], it[7], it[8], it[9]}))
    redis.call('EXPIRE', ek, 86400)
  elseif redis.call('SREM', B .. ':xpend:' .. d, x) == 1 then
    local detail, cause = it[7], it[8]
    if detail == false then detail = nil end
    if cause == false then cause = nil end
    hand_to(d, x, it[5] == 1, it[6], detail, cause, it[9], now)
  end
end
return settle_some(now, K.SETTLE_BUDGET)
