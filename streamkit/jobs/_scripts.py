"""The job queue's Lua scripts: every state change of a job is one of these.

One room, over 600 lines, on purpose: the scripts share ``_COMMON`` (the key helpers,
the counters, the transitions several scripts make), and a job's states are easiest to
check with every transition on one page.

Pure (no trio, no Redis client): the runtime loads them through
:class:`streamkit._redis.LuaScript`. Every script touches the keys of one shard only,
all sharing the shard's hash tag, so each stays a single-slot script on Redis Cluster.

Each script gets the shard's fixed keys (see :class:`~streamkit.jobs._layout.ShardKeys`):
``KEYS[1..3]`` the ready streams (high, normal, low), ``KEYS[4]`` the schedule,
``KEYS[5]`` the dead-letter stream, ``KEYS[6]`` the completion stream that result
waiters read, ``KEYS[7]`` the counters; ``ARGV[1]`` is the shard's key base, from which
a job's own keys are derived (same hash tag).

Times come from the server's clock (``TIME``), never a client's, except an absolute
``at=`` that the caller asked for. Job fields:

=============  =================================================================
field          meaning
=============  =================================================================
``name``       the job's name (which function runs it)
``args``       its arguments, JSON ``[args, kwargs]``
``status``     scheduled, waiting, sent, executing, retry, success, dead, aborted,
               expired
``prio``       0 high, 1 normal, 2 low: which ready stream it goes to
``tries``      times it was started; ``max_tries`` is retries + 1
``entry``      its entry id in the ready stream while it is queued or running
``owner``      the token of the claim running it now (fencing)
``lost``       times a worker died while running it (poison detection)
``result``     the JSON result; ``error`` the last error, JSON
``hist``       the tries, a line per start (``s,TRY,MS,WORKER``) and end
               (``e,TRY,MS,OUTCOME[,ERROR TYPE]``; outcome success, retry, dead,
               aborted, released, lost), the newest ~2 KB
``w``          set when someone waits for the result: finishing then notifies
=============  =================================================================
"""

from __future__ import annotations

__all__ = [
    "ABORT_LUA",
    "CLAIM_LUA",
    "COUNTS_LUA",
    "ENQUEUE_LUA",
    "FINISH_LUA",
    "GROUP",
    "PROGRESS_LUA",
    "PURGE_LUA",
    "RECOVER_LUA",
    "RENEW_LUA",
    "REPLAY_LUA",
    "SETTLE_LUA",
    "WATCH_LUA",
]

#: The consumer group of every ready stream.
GROUP = "workers"
#: Dependents a script settles per call, beside its own work (see ``settle_some``).
SETTLE_BUDGET = 100
#: Scheduled jobs a claim moves to their ready streams per call, at most.
DUE_BUDGET = 100
#: Pending entries a count reads per call, at most.
PENDING_BUDGET = 250
#: Pending entries a hand-back reads per call, at most (it writes for each).
HAND_BACK_BUDGET = 100

#: Shared by every script: key helpers, counters, and the transitions that several
#: scripts make (queue a job, end it dead, settle the jobs waiting on it).
_COMMON = (
    r"""
local B = ARGV[1]
local Q = {KEYS[1], KEYS[2], KEYS[3]}
local SCHED, DEAD, DONE, COUNTS = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local GROUP = 'workers'
local SETTLE_BUDGET = """
    + str(SETTLE_BUDGET)
    + r"""
local FINAL = {success = true, dead = true, aborted = true, expired = true}

-- A job's history (field 'hist'): one line per try's start or end, the newest
-- HIST_MAX bytes kept. Callers read and write the field with the HMGET/HSET they make
-- anyway, so the hot path pays no extra call.
local HIST_MAX = 2048
local function hist_add(h, line)
  h = (h or '') .. line .. '\n'
  if #h > HIST_MAX then
    local cut = string.find(h, '\n', #h - HIST_MAX, true)
    if cut then h = string.sub(h, cut + 1) end
  end
  return h
end
local function hist_end(try, now, outcome, err)
  local line = 'e,' .. try .. ',' .. now .. ',' .. outcome
  if err then
    local kind = string.match(err, '"type":"([^"]*)"')
    if kind then line = line .. ',' .. kind end
  end
  return line
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function jkey(id) return B .. ':job:' .. id end

local function move(name, from, to)
  if from then redis.call('HINCRBY', COUNTS, from .. '|' .. name, -1) end
  if to then redis.call('HINCRBY', COUNTS, to .. '|' .. name, 1) end
end

local function notify(id, k, status)
  if redis.call('HEXISTS', k, 'w') == 1 then
    redis.call('XADD', DONE, 'MAXLEN', '~', 10000, '*', 'id', id, 's', status)
  end
end

local function expire_later(k)
  local ttl = tonumber(redis.call('HGET', k, 'ttl') or '0')
  if ttl and ttl > 0 then redis.call('EXPIRE', k, ttl) end
end

-- Put a job on its ready stream (status: 'sent', or kept as 'retry').
local function push(id, k, name, from, status)
  local prio = tonumber(redis.call('HGET', k, 'prio') or '1')
  local e = redis.call('XADD', Q[prio + 1], '*', 'id', id)
  redis.call('HSET', k, 'status', status, 'entry', e)
  move(name, from, status)
end

local function unqueue(k)
  local prio = tonumber(redis.call('HGET', k, 'prio') or '1')
  local e = redis.call('HGET', k, 'entry')
  if e then
    redis.call('XACK', Q[prio + 1], GROUP, e)
    redis.call('XDEL', Q[prio + 1], e)
  end
end

-- End a job dead: record the error, add it to the dead-letter stream.
local function mark_dead(id, k, name, from, err, now)
  local d = redis.call('XADD', DEAD, '*', 'id', id, 'name', name)
  redis.call('HSET', k, 'status', 'dead', 'error', err, 'finished', now, 'owner', '',
    'dead_entry', d)
  redis.call('PERSIST', k)
  move(name, from, 'dead')
  notify(id, k, 'dead')
end

-- End a job in a final state other than dead (success, aborted, expired).
local function mark_final(id, k, name, from, status, now)
  redis.call('HSET', k, 'status', status, 'finished', now, 'owner', '')
  move(name, from, status)
  notify(id, k, status)
  expire_later(k)
end

-- A waiting job whose dependencies all succeeded: schedule or queue it.
local function release_waiting(id, k, name, now)
  local due = tonumber(redis.call('HGET', k, 'due') or '0')
  if due > now then
    redis.call('ZADD', SCHED, due, id)
    redis.call('HSET', k, 'status', 'scheduled')
    move(name, 'waiting', 'scheduled')
  else
    push(id, k, name, 'waiting', 'sent')
  end
end

-- A job ended: release (ok) or kill (not ok) the jobs waiting on it, transitively.
-- A job may have very many dependents, so no script walks them all: the job's set of
-- dependents is renamed to a set of its own (later dependents of a replayed or
-- re-enqueued job go to a new one), queued on SETTLE, and settle_some works through
-- that queue a bounded number of dependents per call. Any call that settles continues
-- with the budget it has; the worker that ended the job calls SETTLE_LUA until
-- nothing is left, and every claim continues it too.
local SETTLE = B .. ':settle'
local function settle(id, ok, now)
  local k = jkey(id)
  if redis.call('HEXISTS', k, 'dependents') == 0 then return end
  local dk = B .. ':deps:' .. id
  if redis.call('EXISTS', dk) == 0 then return end
  local sk = B .. ':settling:' .. redis.call('INCR', B .. ':settling')
  redis.call('RENAME', dk, sk)
  redis.call('RPUSH', SETTLE, cjson.encode({sk, ok and 1 or 0, id,
    redis.call('HGET', k, 'status') or 'gone'}))
end

-- Settle up to budget dependents (at least one queued job's worth of work); returns
-- how many jobs still have dependents to settle.
local function settle_some(now, budget)
  while budget > 0 do
    local head = redis.call('LINDEX', SETTLE, 0)
    if not head then return 0 end
    local item = cjson.decode(head)
    local sk, ok, top, st = item[1], item[2] == 1, item[3], item[4]
    local dependents = redis.call('SPOP', sk, budget)
    budget = budget - math.max(1, #dependents)
    for _, d in ipairs(dependents) do
      local k = jkey(d)
      if redis.call('HGET', k, 'status') == 'waiting' then
        local name = redis.call('HGET', k, 'name')
        if ok then
          if redis.call('HINCRBY', k, 'pending', -1) <= 0 then release_waiting(d, k, name, now) end
        else
          mark_dead(d, k, name, 'waiting', cjson.encode({type = 'DependencyFailed',
            message = 'job ' .. top .. ' it depends on ended ' .. st}), now)
          settle(d, false, now)
        end
      end
    end
    if redis.call('EXISTS', sk) == 0 then redis.call('LPOP', SETTLE) end
  end
  return redis.call('LLEN', SETTLE)
end

-- Start a job read from (or reclaimed on) a ready stream; append it to out.
local function start(out, p, eid, id, consumer, now, lost, max_lost)
  local k = jkey(id)
  local f = redis.call('HMGET', k, 'status', 'name', 'args', 'tries', 'max_tries', 'expires',
    'owner', 'abort', 'started', 'hist')
  local hist = f[10]
  local st, name = f[1], f[2]
  if st == 'executing' and not lost then
    -- taken over by another worker meanwhile (this one was paused after reading it)
    return
  end
  if not st or FINAL[st] or (st ~= 'sent' and st ~= 'retry' and st ~= 'executing') then
    redis.call('XACK', Q[p], GROUP, eid)
    redis.call('XDEL', Q[p], eid)
    return
  end
  if f[8] then
    -- aborted while a try ran, which ended (or its worker stopped) before the abort
    -- reached it: no new try
    redis.call('XACK', Q[p], GROUP, eid)
    redis.call('XDEL', Q[p], eid)
    redis.call('HSET', k, 'error', cjson.encode({type = 'Aborted', message = f[8]}))
    mark_final(id, k, name, st, 'aborted', now)
    settle(id, false, now)
    return
  end
  local tries, max_tries = tonumber(f[4] or '0'), tonumber(f[5])
  if lost and f[7] and string.sub(f[7], 1, #consumer + 1) == consumer .. ':' then
    -- claimed by this very worker in a reply that was lost (it never ran): not spent
    tries = tries - 1
  elseif lost and f[7] and f[7] ~= '' then
    -- its worker died while running it: that try is spent
    local n = redis.call('HINCRBY', k, 'lost', 1)
    hist = hist_add(hist, hist_end(tries, now, 'lost'))
    if tries >= max_tries or n >= max_lost then
      redis.call('HSET', k, 'hist', hist)
      redis.call('XACK', Q[p], GROUP, eid)
      redis.call('XDEL', Q[p], eid)
      local why
      if n >= max_lost then
        why = 'its worker died while running it ' .. n .. ' times (max_deliveries)'
      else
        why = 'its worker died while running its last try'
      end
      mark_dead(id, k, name, st, cjson.encode({type = 'WorkerLost', message = why}), now)
      settle(id, false, now)
      return
    end
  end
  local expires = tonumber(f[6] or '0') or 0
  if expires > 0 and now > expires and not f[9] then
    -- not started in time (a job that started once is retried, put back or replayed
    -- whatever the time)
    redis.call('XACK', Q[p], GROUP, eid)
    redis.call('XDEL', Q[p], eid)
    mark_final(id, k, name, st, 'expired', now)
    settle(id, false, now)
    return
  end
  tries = tries + 1
  local token = consumer .. ':' .. tries
  redis.call('HSET', k, 'status', 'executing', 'owner', token, 'worker', consumer,
    'started', now, 'tries', tries, 'entry', eid,
    'hist', hist_add(hist, 's,' .. tries .. ',' .. now .. ',' .. consumer))
  if tries > 1 then redis.call('HDEL', k, 'progress') end
  move(name, st, 'executing')
  table.insert(out, {id, name, f[3], tries, token, p - 1})
end
"""
)

#: Add jobs of one name. ARGV: base, name, then the batch's defaults: priority,
#: delay_ms (relative, 0: none), max_tries, result_ttl_s, dedupe_window_s (for jobs
#: with an id of the caller's), expires_ms (absolute; negative: relative to now; 0:
#: none); then per job: id, args (JSON), options ("" for the defaults, else a JSON
#: object with any of p (priority), d (delay_ms), a (at_ms, absolute), e (expires_ms),
#: w (1: dedupe by id), after (ids of jobs that must succeed first)).
#: Returns 1 per new job, 0 per duplicate.
ENQUEUE_LUA = (
    _COMMON
    + r"""
local now = now_ms()
local name = ARGV[2]
local d_prio, d_delay, max_tries, ttl = ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6]
local window, d_expires = tonumber(ARGV[7]), tonumber(ARGV[8])
local out = {}
for i = 9, #ARGV, 3 do
  local id, args, opts = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local prio, delay, at, expires, dedupe, after = d_prio, d_delay, 0, d_expires, false, nil
  if opts ~= '' then
    local o = cjson.decode(opts)
    if o.p then prio = tostring(o.p) end
    if o.d then delay = o.d end
    if o.a then
      at = o.a
      if not o.d then delay = 0 end  -- its own time, not the batch's default delay
    end
    if o.e then expires = o.e end
    dedupe = o.w == 1
    after = o.after
  end
  local k = jkey(id)
  local fresh = true
  if dedupe then
    local st = redis.call('HGET', k, 'status')
    local marked = redis.call('SET', B .. ':once:' .. id, '1', 'NX', 'EX', window)
    if not marked or (st and not FINAL[st]) then fresh = false end
    if fresh and st then
      -- an earlier run's record, outside the window: the new run replaces it
      if st == 'dead' then
        local d = redis.call('HGET', k, 'dead_entry')
        if d then redis.call('XDEL', DEAD, d) end
        move(redis.call('HGET', k, 'name'), 'dead', nil)
      end
      redis.call('DEL', k)
    end
  end
  if fresh then
    local due = 0
    if delay > 0 then due = now + delay elseif at > 0 then due = at end
    redis.call('HSET', k, 'name', name, 'args', args, 'prio', prio, 'max_tries', max_tries,
      'ttl', ttl, 'enqueued', now)
    if expires ~= 0 then
      if expires < 0 then expires = now - expires end
      redis.call('HSET', k, 'expires', expires)
    end
    if due > 0 then redis.call('HSET', k, 'due', due) end
    local pending, failed = 0, nil
    for _, dep in ipairs(after or {}) do
      local ds = redis.call('HGET', jkey(dep), 'status')
      if ds == 'success' then
        -- done already
      elseif not ds or FINAL[ds] then
        failed = failed or ('job ' .. dep .. ' it depends on ' .. (ds and ('ended ' .. ds)
          or 'is unknown (never enqueued, or its record expired)'))
      else
        redis.call('SADD', B .. ':deps:' .. dep, id)
        redis.call('HSET', jkey(dep), 'dependents', 1)
        pending = pending + 1
      end
    end
    if failed then
      mark_dead(id, k, name, nil, cjson.encode({type = 'DependencyFailed', message = failed}),
        now)
    elseif pending > 0 then
      redis.call('HSET', k, 'status', 'waiting', 'pending', pending)
      move(name, nil, 'waiting')
    elseif due > now then
      redis.call('ZADD', SCHED, due, id)
      redis.call('HSET', k, 'status', 'scheduled')
      move(name, nil, 'scheduled')
    else
      push(id, k, name, nil, 'sent')
    end
    table.insert(out, 1)
  else
    table.insert(out, 0)
  end
end
return out
"""
)

#: Claim jobs for a worker. ARGV: base, consumer, count, lease_ms, reclaim (0/1),
#: max_deliveries, the tries the worker runs (JSON object: job id -> token; a worker
#: never takes a job over from itself), then triples (priority, entry id, job id) of
#: entries a blocking read delivered already. Moves due scheduled jobs to their ready
#: streams first, then starts up to ``count`` jobs, higher priorities first; delivered
#: entries beyond that are handed back (left pending, reclaimable at once).
#: Moves at most ``DUE_BUDGET`` scheduled jobs per call (the next call moves the
#: rest: ``next_due_ms`` is then in the past), and settles dependents on the way.
#: Returns {jobs, next_due_ms or -1, now_ms, jobs with dependents left to settle};
#: each job is {id, name, args, tries, token, priority}.
CLAIM_LUA = (
    _COMMON
    + r"""
local consumer, want = ARGV[2], tonumber(ARGV[3])
local lease, reclaim, max_lost = tonumber(ARGV[4]), ARGV[5] == '1', tonumber(ARGV[6])
local mine = cjson.decode(ARGV[7])
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', SCHED, '-inf', now, 'LIMIT', 0, """
    + str(DUE_BUDGET)
    + r""")
for _, id in ipairs(due) do
  redis.call('ZREM', SCHED, id)
  local k = jkey(id)
  local st = redis.call('HGET', k, 'status')
  if st == 'scheduled' then
    push(id, k, redis.call('HGET', k, 'name'), st, 'sent')
  elseif st == 'retry' then
    push(id, k, redis.call('HGET', k, 'name'), st, 'retry')
  end
end
-- Priority by priority: what the blocking read delivered, what dead workers left
-- (reclaim), then new entries. XREADGROUP's COUNT is per stream, so the read may have
-- delivered more than this worker has room for, and a read woken by one stream misses
-- the others: entries that do not fit are handed back at once, as a graceful stop does.
local delivered = {{}, {}, {}}
for a = 8, #ARGV, 3 do
  table.insert(delivered[tonumber(ARGV[a]) + 1], {ARGV[a + 1], ARGV[a + 2]})
end
local out = {}
for p = 1, 3 do
  for _, d in ipairs(delivered[p]) do
    if #out < want then
      start(out, p, d[1], d[2], consumer, now, false, max_lost)
    else
      redis.call('XCLAIM', Q[p], GROUP, consumer, 0, d[1], 'IDLE', lease + 1, 'JUSTID')
    end
  end
  if #out < want and redis.call('EXISTS', Q[p]) == 1 then
    if reclaim then
      local r = redis.call('XAUTOCLAIM', Q[p], GROUP, consumer, lease, '0-0', 'COUNT',
        want - #out)
      for _, entry in ipairs(r[2]) do
        local fields = entry[2]
        local id = fields and fields[2]
        if id and mine[id] and redis.call('HGET', jkey(id), 'owner') == mine[id] then
          -- this worker runs it (its renewals were late: a blocked event loop, a slow
          -- Redis): XAUTOCLAIM just renewed its lease
        elseif id then
          start(out, p, entry[1], id, consumer, now, true, max_lost)
        else
          redis.call('XACK', Q[p], GROUP, entry[1])
        end
      end
    end
    if #out < want then
      local r = redis.call('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', want - #out,
        'STREAMS', Q[p], '>')
      if r then
        for _, entry in ipairs(r[1][2]) do
          start(out, p, entry[1], entry[2][2], consumer, now, false, max_lost)
        end
      end
    end
  end
end
local nxt = redis.call('ZRANGE', SCHED, 0, 0, 'WITHSCORES')
local next_due = -1
if nxt[2] then next_due = tonumber(nxt[2]) end
return {out, next_due, now, settle_some(now, SETTLE_BUDGET)}
"""
)

#: Finish jobs, fenced. ARGV: base, lease_ms, then per job 5 fields: id, token,
#: outcome (ok, retry, dead, aborted, release), data (result or error JSON), number
#: (retry delay ms; for ok, 1 to keep the result). A retry or release of a job whose
#: abort was requested while it ran ends it aborted. Returns {replies, jobs with
#: dependents left to settle}: per job, 1 if committed, 0 if this claim no longer owns
#: it (nothing was written for it), 2 if this claim finished it already (sent again
#: after a reply was lost: nothing more is written).
FINISH_LUA = (
    _COMMON
    + r"""
local lease = tonumber(ARGV[2])
local now = now_ms()
local out = {}
for a = 3, #ARGV, 5 do
  local id, token, outcome, data, number = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    tonumber(ARGV[a + 4])
  local k = jkey(id)
  local f = redis.call('HMGET', k, 'owner', 'name', 'prio', 'entry', 'status', 'w', 'ttl',
    'dependents', 'worker', 'tries', 'abort', 'hist')
  if f[1] ~= token or f[5] ~= 'executing' then
    -- the token is worker:tries: its try was the last one started, and it is over
    if f[9] and f[10] and f[9] .. ':' .. f[10] == token then
      table.insert(out, 2)
    else
      table.insert(out, 0)
    end
  else
    local name, p, e = f[2], tonumber(f[3]) + 1, f[4]
    if f[11] and (outcome == 'retry' or outcome == 'release') then
      -- aborted while this try ran: no other try
      outcome, data = 'aborted', cjson.encode({type = 'Aborted', message = f[11]})
    end
    local ended = (outcome == 'release' and 'released') or (outcome == 'ok' and 'success')
      or outcome
    local hist = hist_add(f[12], hist_end(f[10], now, ended, outcome ~= 'ok' and data or nil))
    if outcome == 'release' then
      local consumer = string.match(token, '^(.*):%d+$')
      redis.call('XCLAIM', Q[p], GROUP, consumer, 0, e, 'IDLE', lease + 1, 'JUSTID')
      redis.call('HSET', k, 'owner', '', 'status', 'sent', 'hist', hist)
      redis.call('HINCRBY', k, 'tries', -1)
      move(name, 'executing', 'sent')
    else
      redis.call('XACK', Q[p], GROUP, e)
      redis.call('XDEL', Q[p], e)
      redis.call('HDEL', k, 'entry')
      if outcome == 'ok' then
        -- the hot path, inlined: mark_final and settle with the fields read above
        if number == 1 then
          redis.call('HSET', k, 'status', 'success', 'finished', now, 'owner', '', 'result', data,
            'hist', hist)
        else
          redis.call('HSET', k, 'status', 'success', 'finished', now, 'owner', '', 'hist', hist)
        end
        move(name, 'executing', 'success')
        if f[6] then redis.call('XADD', DONE, 'MAXLEN', '~', 10000, '*', 'id', id, 's', 'success') end
        local ttl = tonumber(f[7] or '0')
        if ttl and ttl > 0 then redis.call('EXPIRE', k, ttl) end
        if f[8] then settle(id, true, now) end
      elseif outcome == 'retry' then
        redis.call('HSET', k, 'status', 'retry', 'error', data, 'owner', '', 'hist', hist)
        redis.call('ZADD', SCHED, now + number, id)
        move(name, 'executing', 'retry')
      elseif outcome == 'aborted' then
        redis.call('HSET', k, 'error', data, 'hist', hist)
        mark_final(id, k, name, 'executing', 'aborted', now)
        settle(id, false, now)
      else
        redis.call('HSET', k, 'hist', hist)
        mark_dead(id, k, name, 'executing', data, now)
        settle(id, false, now)
      end
    end
    table.insert(out, 1)
  end
end
return {out, settle_some(now, SETTLE_BUDGET)}
"""
)

#: Renew the claims of running jobs. ARGV: base, consumer, then pairs (id, token).
#: Returns {lost ids, {id, abort reason} pairs}.
RENEW_LUA = (
    _COMMON
    + r"""
local consumer = ARGV[2]
local lost, aborts = {}, {}
for a = 3, #ARGV, 2 do
  local id, token = ARGV[a], ARGV[a + 1]
  local f = redis.call('HMGET', jkey(id), 'owner', 'prio', 'entry', 'abort')
  if f[1] == token and f[3] then
    redis.call('XCLAIM', Q[tonumber(f[2]) + 1], GROUP, consumer, 0, f[3], 'JUSTID')
    if f[4] then table.insert(aborts, {id, f[4]}) end
  else
    table.insert(lost, id)
  end
end
return {lost, aborts}
"""
)

#: Abort a job. ARGV: base, id, reason. Returns {outcome, jobs with dependents left
#: to settle}; the outcome is 'aborted' (it was not running and is now aborted),
#: 'requested' (it is running: its worker cancels it), 'unknown', or the final status
#: it had reached already.
ABORT_LUA = (
    _COMMON
    + r"""
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
  redis.call('HSET', k, 'error', cjson.encode({type = 'Aborted', message = reason}))
  mark_final(id, k, name, st, 'aborted', now)
  settle(id, false, now)
  return 'aborted'
end
local outcome = abort()
return {outcome, settle_some(now, SETTLE_BUDGET)}
"""
)

#: Settle the dependents of ended jobs (see ``settle``). ARGV: base, budget (the most
#: dependents settled in this call). Returns the jobs with dependents left to settle.
SETTLE_LUA = (
    _COMMON
    + r"""
return settle_some(now_ms(), tonumber(ARGV[2]))
"""
)

#: Report progress, fenced. ARGV: base, id, token, JSON. Returns 1, or 0 if fenced out.
PROGRESS_LUA = (
    _COMMON
    + r"""
local k = jkey(ARGV[2])
if redis.call('HGET', k, 'owner') ~= ARGV[3] then return 0 end
redis.call('HSET', k, 'progress', ARGV[4])
return 1
"""
)

#: Register a result waiter. ARGV: base, id. Returns false for an unknown job, else
#: {status, result, error}; a job not final yet is marked so finishing it notifies.
WATCH_LUA = (
    _COMMON
    + r"""
local k = jkey(ARGV[2])
local f = redis.call('HMGET', k, 'status', 'result', 'error')
if not f[1] then return false end
if not FINAL[f[1]] then redis.call('HSET', k, 'w', '1') end
return f
"""
)

#: Queue dead jobs again with their tries reset. ARGV: base, ids. Returns the ids
#: that were dead and are queued again.
REPLAY_LUA = (
    _COMMON
    + r"""
local out = {}
for a = 2, #ARGV do
  local id = ARGV[a]
  local k = jkey(id)
  local f = redis.call('HMGET', k, 'status', 'name', 'dead_entry')
  if f[1] == 'dead' then
    if f[3] then redis.call('XDEL', DEAD, f[3]) end
    redis.call('HSET', k, 'tries', 0, 'lost', 0, 'owner', '')
    redis.call('HDEL', k, 'dead_entry', 'finished', 'abort', 'progress')
    push(id, k, f[2], 'dead', 'sent')
    table.insert(out, id)
  end
end
return out
"""
)

#: Delete dead jobs and their records. ARGV: base, ids. Returns the ids deleted.
PURGE_LUA = (
    _COMMON
    + r"""
local out = {}
for a = 2, #ARGV do
  local id = ARGV[a]
  local k = jkey(id)
  local f = redis.call('HMGET', k, 'status', 'name', 'dead_entry')
  if f[1] == 'dead' then
    if f[3] then redis.call('XDEL', DEAD, f[3]) end
    redis.call('DEL', k)
    move(f[2], 'dead', nil)
    table.insert(out, id)
  end
end
return out
"""
)

#: The shard's counters, and per priority the length of its ready stream and how many
#: of its pending entries belong to running jobs (the rest are queued): read in steps
#: of at most ``budget`` pending entries. ARGV: base, budget, then per priority a
#: cursor: '-' to start, the last entry id read, '' when done. Returns {counters (flat
#: hash), {stream lengths}, {running jobs among the entries read}, {cursors}}.
COUNTS_LUA = (
    _COMMON
    + r"""
local budget = tonumber(ARGV[2])
local lengths, running, cursors = {}, {}, {}
for p = 1, 3 do
  local cursor = ARGV[2 + p]
  lengths[p], running[p], cursors[p] = redis.call('XLEN', Q[p]), 0, cursor
  if cursor ~= '' and budget > 0 then
    local start = '-'
    if cursor ~= '-' then start = '(' .. cursor end
    -- entries of running jobs are pending in the group; a job put back by a graceful
    -- stop is pending too, but queued
    local pending = redis.pcall('XPENDING', Q[p], GROUP, start, '+', budget)
    if type(pending) ~= 'table' or pending.err then pending = {} end
    for _, item in ipairs(pending) do
      local entry = redis.call('XRANGE', Q[p], item[1], item[1])[1]
      local id = entry and entry[2][2]
      if id and redis.call('HGET', jkey(id), 'status') == 'executing' then
        running[p] = running[p] + 1
      end
    end
    if #pending < budget then cursors[p] = '' else cursors[p] = pending[#pending][1] end
    budget = budget - #pending
  end
end
return {redis.call('HGETALL', COUNTS), lengths, running, cursors}
"""
)

#: Hand back the jobs a worker holds but does not run: those of a claim whose reply
#: was lost (the connection dropped, Redis restarted), or claimed and not started when
#: it stopped. ARGV: base, consumer, lease_ms, budget, a cursor per priority (as for
#: COUNTS_LUA), then the ids of the jobs it runs. Their tries are not spent; they are
#: left for any worker to claim at once. Reads at most ``budget`` of the worker's
#: pending entries. Returns {how many were handed back, {cursors}}.
RECOVER_LUA = (
    _COMMON
    + r"""
local consumer, lease, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local running = {}
for a = 8, #ARGV do running[ARGV[a]] = true end
local n = 0
local cursors = {}
for p = 1, 3 do
  local cursor = ARGV[4 + p]
  cursors[p] = cursor
  if cursor ~= '' and budget > 0 then
    local start = '-'
    if cursor ~= '-' then start = '(' .. cursor end
    local pending = redis.pcall('XPENDING', Q[p], GROUP, start, '+', budget, consumer)
    if type(pending) ~= 'table' or pending.err then pending = {} end
    for _, item in ipairs(pending) do
      local e = item[1]
      local entry = redis.call('XRANGE', Q[p], e, e)[1]
      local id = entry and entry[2][2]
      if id and not running[id] then
        local k = jkey(id)
        local f = redis.call('HMGET', k, 'status', 'owner', 'name')
        if f[1] == 'executing' and f[2] and string.sub(f[2], 1, #consumer + 1) == consumer .. ':' then
          redis.call('HSET', k, 'status', 'sent', 'owner', '')
          redis.call('HINCRBY', k, 'tries', -1)
          move(f[3], 'executing', 'sent')
        end
        redis.call('XCLAIM', Q[p], GROUP, consumer, 0, e, 'IDLE', lease + 1, 'JUSTID')
        n = n + 1
      end
    end
    if #pending < budget then cursors[p] = '' else cursors[p] = pending[#pending][1] end
    budget = budget - #pending
  end
end
return {n, cursors}
"""
)
