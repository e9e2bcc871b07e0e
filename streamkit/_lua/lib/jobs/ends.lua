-- mark_dead(id, k, name, from, err, now) and mark_final(id, k, name, from, status, now):
-- a job ends; its result waiters are notified, its record expires later, its event is
-- appended (lib/jobs/events).
--#include lib/jobs/shard
--#include lib/jobs/counters
--#include lib/jobs/events

local function notify(id, k, status)
  if redis.call('HEXISTS', k, 'w') == 1 then
    redis.call('XADD', DONE, 'MAXLEN', '~', 10000, '*', 'id', id, 's', status)
  end
end

local function expire_later(k)
  local ttl = tonumber(redis.call('HGET', k, 'ttl') or '0')
  if ttl and ttl > 0 then redis.call('EXPIRE', k, ttl) end
end

-- End a job dead: record the error, add it to the dead-letter stream (not a
-- workflow's gather node: no worker runs it, nothing could replay it).
local function mark_dead(id, k, name, from, err, now)
  if redis.call('HGET', k, 'feed') == 'g' then
    redis.call('HSET', k, 'status', 'dead', 'error', err, 'finished', now, 'owner', '')
    move(name, from, 'dead')
    notify(id, k, 'dead')
    expire_later(k)
    job_event(id, name, 'dead', err)
    return
  end
  local d = redis.call('XADD', DEAD, '*', 'id', id, 'name', name)
  redis.call('HSET', k, 'status', 'dead', 'error', err, 'finished', now, 'owner', '',
    'dead_entry', d)
  redis.call('PERSIST', k)
  move(name, from, 'dead')
  notify(id, k, 'dead')
  job_event(id, name, 'dead', err)
end

-- End a job in a final state other than dead (success, aborted, expired).
local function mark_final(id, k, name, from, status, now)
  redis.call('HSET', k, 'status', status, 'finished', now, 'owner', '')
  move(name, from, status)
  notify(id, k, status)
  expire_later(k)
  job_event(id, name, status == 'success' and 'succeeded' or status, nil)
end
