-- settle_some(now, budget): settle the dependents of ended jobs (see settle in
-- lib/jobs/dependents), a bounded number per call.
--#include lib/jobs/handed
--#include lib/jobs/dependents

-- Settle up to budget dependents (at least one queued job's worth of work); returns
-- how many jobs still have dependents to settle, plus the messages to other shards
-- waiting to be delivered.
local function settle_some(now, budget)
  if redis.call('EXISTS', SETTLE, XOUT) == 0 then return 0 end
  while budget > 0 do
    local head = redis.call('LINDEX', SETTLE, 0)
    if not head then break end
    local item = cjson.decode(head)
    local sk, ok, top, st, remote = item[1], item[2] == 1, item[3], item[4], item[5] == 1
    local dependents = redis.call('SPOP', sk, budget)
    budget = budget - math.max(1, #dependents)
    if #dependents > 0 then
      local data, detail, cause = handed(top, ok, st)
      for _, d in ipairs(dependents) do
        if remote then
          local t = cjson.decode(d)
          redis.call('RPUSH', XOUT, cjson.encode({t[1], t[2], t[3], top, ok and 1 or 0, data,
            detail or false, cause or false, st}))
        else
          hand_to(d, top, ok, data, detail, cause, st, now)
        end
      end
    end
    if redis.call('EXISTS', sk) == 0 then redis.call('LPOP', SETTLE) end
  end
  return redis.call('LLEN', SETTLE) + redis.call('LLEN', XOUT)
end
