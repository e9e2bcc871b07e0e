-- push(id, k, name, from, status): put a job on its ready stream.
--#include lib/jobs/shard
--#include lib/jobs/counters

-- Put a job on its ready stream (status: 'sent', or kept as 'retry').
local function push(id, k, name, from, status)
  local prio = tonumber(redis.call('HGET', k, 'prio') or '1')
  local e = redis.call('XADD', Q[prio + 1], '*', 'id', id)
  redis.call('HSET', k, 'status', status, 'entry', e)
  move(name, from, status)
end
