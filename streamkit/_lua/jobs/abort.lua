-- Aborts a job. The outcome is 'aborted' (it was not running and is now aborted),
-- 'requested' (it is running: its worker cancels it), 'unknown', or the final status it
-- had reached already.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, id, reason
-- REPLY: {outcome: str, settling: int (jobs with dependents left to settle)}
--#include lib/clock
--#include lib/jobs/settling

local function unqueue(k)
  local prio = tonumber(redis.call('HGET', k, 'prio') or '1')
  local e = redis.call('HGET', k, 'entry')
  if e and e ~= '' then
    redis.call('XACK', Q[prio + 1], GROUP, e)
    redis.call('XDEL', Q[prio + 1], e)
  end
end

local id, reason = ARGV[2], ARGV[3]
local now = now_ms()
local function abort()
  local k = jkey(id)
  local f = redis.call('HMGET', k, 'status', 'name')
  local st, name = f[1], f[2]
  if not st then return 'unknown' end
  if FINAL[st] then return st end
  if st == 'executing' then
    redis.call('HSET', k, 'abort', reason)
    return 'requested'
  end
  unqueue(k)
  redis.call('ZREM', SCHED, id)
  if st == 'waiting' and redis.call('HEXISTS', k, 'xp') == 1 then
    redis.call('DEL', B .. ':xpend:' .. id)
  end
  redis.call('HSET', k, 'error', cjson.encode({type = 'Aborted', message = reason}))
  mark_final(id, k, name, st, 'aborted', now)
  settle(id, false)
  return 'aborted'
end
local outcome = abort()
return {outcome, settle_some(now, K.SETTLE_BUDGET)}
