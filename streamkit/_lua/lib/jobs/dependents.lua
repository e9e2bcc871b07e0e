-- Workflows: hand_to(d, x, ok, data, detail, cause, st, now) hands a waiting job the end
-- of a job it depends on (releasing it when it was the last), and settle(id, ok, now)
-- queues the dependents of a job that ended, to be settled (lib/jobs/settling).
--
-- A job fed by the jobs it depends on (field 'feed': 'c' a chain's next step, given its
-- one dependency's result; 'n' a chord's callback, given the list of its dependencies'
-- results, in the order of 'order'; 'f' a failure callback, given the failure of its one
-- dependency; 'g' a group's gather node, run by no worker, whose result is its
-- dependencies' results) collects them in fields 'in:DEP' as they end, and they are put
-- first among its positional arguments when it is queued.
--#include lib/jobs/record
--#include lib/jobs/queue
--#include lib/jobs/ends

-- value put first among the positional arguments of args ('[[...],{...}]', as every
-- streamkit producer writes them); any other shape is left as it is.
local function prepend(args, value)
  if string.sub(args, 1, 3) == '[[]' then return '[[' .. value .. string.sub(args, 3) end
  if string.sub(args, 1, 2) == '[[' then return '[[' .. value .. ',' .. string.sub(args, 3) end
  return args
end

-- The inputs a fed job collected, in the order of its dependencies, and their fields.
local function collected(k)
  local order = cjson.decode(redis.call('HGET', k, 'order') or '[]')
  local fields, parts = {}, {}
  for i, dep in ipairs(order) do fields[i] = 'in:' .. dep end
  if #fields > 0 then
    local values = redis.call('HMGET', k, unpack(fields))
    for i = 1, #fields do parts[i] = values[i] or 'null' end
  end
  return parts, fields
end

-- A waiting job whose dependencies all ended as it needs: schedule or queue it (fed
-- its inputs); a gather node ends at once, with its inputs as its result.
local settle
local function release_waiting(id, k, name, now)
  local f = redis.call('HMGET', k, 'feed', 'xp')
  if f[2] then redis.call('DEL', B .. ':xpend:' .. id) end
  if f[1] then
    local parts, fields = collected(k)
    if #fields > 0 then redis.call('HDEL', k, unpack(fields)) end
    if f[1] == 'g' then
      redis.call('HSET', k, 'result', '[' .. table.concat(parts, ',') .. ']')
      mark_final(id, k, name, 'waiting', 'success', now)
      settle(id, true)
      return
    end
    local value = parts[1] or 'null'
    if f[1] == 'n' then value = '[' .. table.concat(parts, ',') .. ']' end
    redis.call('HSET', k, 'args', prepend(redis.call('HGET', k, 'args') or '[[],{}]', value))
  end
  local due = tonumber(redis.call('HGET', k, 'due') or '0')
  if due > now then
    redis.call('ZADD', SCHED, due, id)
    redis.call('HSET', k, 'status', 'scheduled')
    move(name, 'waiting', 'scheduled')
  else
    push(id, k, name, 'waiting', 'sent')
  end
end

-- Hand waiting job d the end of job x (its status st): its result, or its failure.
-- A failure callback of a job that succeeded is not needed: it ends aborted.
local function hand_to(d, x, ok, data, detail, cause, st, now)
  local k = jkey(d)
  local f = redis.call('HMGET', k, 'status', 'name', 'feed', 'xp')
  if f[1] ~= 'waiting' then return end
  local name, feed = f[2], f[3]
  if ok and feed == 'f' then
    if f[4] then redis.call('DEL', B .. ':xpend:' .. d) end
    redis.call('HSET', k, 'error', cjson.encode({type = 'NotNeeded',
      message = 'job ' .. x .. ' succeeded: no failure to handle'}))
    mark_final(d, k, name, 'waiting', 'aborted', now)
    settle(d, false)
    return
  end
  if ok or feed == 'f' then
    if feed then redis.call('HSET', k, 'in:' .. x, data) end
    if redis.call('HINCRBY', k, 'pending', -1) <= 0 then release_waiting(d, k, name, now) end
    return
  end
  if f[4] then redis.call('DEL', B .. ':xpend:' .. d) end
  local message
  if st == 'unknown' then
    message = 'job ' .. x .. ' it depends on is unknown (never enqueued, or its record expired)'
  else
    message = 'job ' .. x .. ' it depends on ended ' .. st
    if detail then message = message .. ': ' .. detail end
  end
  mark_dead(d, k, name, 'waiting', cjson.encode({type = 'DependencyFailed', message = message,
    cause = cause or message}), now)
  settle(d, false)
end

-- A job ended: release (ok) or kill (not ok) the jobs waiting on it, transitively.
-- A job may have very many dependents, so no script walks them all: the job's set of
-- dependents is renamed to a set of its own (later dependents of a replayed or
-- re-enqueued job go to a new one), queued on SETTLE, and settle_some works through
-- that queue a bounded number of dependents per call. Any call that settles continues
-- with the budget it has; the worker that ended the job calls jobs/settle until
-- nothing is left, and every claim continues it too. Dependents on other shards (or
-- queues) are in a set of their own ('xdeps'): settling one of them queues a message
-- on XOUT, which the workers deliver (jobs/deliver, on the dependent's shard).
settle = function(id, ok)
  local k = jkey(id)
  if redis.call('HEXISTS', k, 'dependents') == 0 then return end
  local st = redis.call('HGET', k, 'status') or 'gone'
  for remote, kind in ipairs({'deps', 'xdeps'}) do
    local dk = B .. ':' .. kind .. ':' .. id
    if redis.call('EXISTS', dk) == 1 then
      local sk = B .. ':settling:' .. redis.call('INCR', B .. ':settling')
      redis.call('RENAME', dk, sk)
      redis.call('RPUSH', SETTLE, cjson.encode({sk, ok and 1 or 0, id, st, remote - 1}))
    end
  end
end
