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
``lim``        its limits, ``"rate,window_ms,conc,key_rate,key_window_ms,key_conc"``
               (0: none; absent for a job without limits); ``lk`` its limit key
``held``       why a ``held`` job waits (a limit or a pause); ``pk`` counts its
               parkings (an item of a park list names the parking it stands for);
               ``up`` is set while a job let out of a park list is queued
``hdr``        its headers, JSON (absent without headers)
=============  =================================================================

Limits and pauses (see :mod:`streamkit.jobs._limits`) keep their state under the
shard's base too: ``:rl:SCOPE`` (a sorted set, the starts in the rate window),
``:cc:SCOPE`` (a set, the jobs holding a concurrency slot), ``:park:KIND:SCOPE`` (a
list, the jobs held back, in order), ``:wake`` (a sorted set, the scopes to look at
again, by when), ``:lims`` (a hash, each parked scope's limit) and ``:ctl`` (a hash,
the paused job names; ``*`` for the whole queue). A scope is ``n:NAME`` (a job name's
limit) or ``k:NAME:KEY`` (a limit key's).
"""

from __future__ import annotations

__all__ = [
    "ABORT_LUA",
    "CLAIM_LUA",
    "CONTROL_LUA",
    "COUNTS_LUA",
    "DELIVERED_LUA",
    "DELIVER_LUA",
    "ENQUEUE_LUA",
    "FINISH_LUA",
    "GROUP",
    "LINK_LUA",
    "PROGRESS_LUA",
    "PURGE_LUA",
    "RECOVER_LUA",
    "RENEW_LUA",
    "REPLAY_LUA",
    "SCHEDULE_LUA",
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
#: Limit scopes a claim looks at again per call, at most (see ``wake_some``).
WAKE_BUDGET = 20
#: Held jobs let out of one park list per call, at most.
UNPARK_BUDGET = 100
#: Ready entries a claim holds back per call before it stops reading (it may hold back
#: up to the jobs it was asked for, if every one it read is held back).
READ_BUDGET = 100
#: How often a scope with jobs waiting for a concurrency slot is looked at again
#: (ms), beside the slot's release: a safety net for a release that let no one out.
CONC_RECHECK_MS = 2000

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

-- Limits and pauses. A job's 'lim' field holds its limits, its 'lk' field its limit
-- key. A job over a limit (or of a paused name) is held back: off its ready stream, in
-- the park list of what holds it, status 'held'; it is let out (queued again, marked
-- 'up', which lets it past the jobs still waiting) when the limit allows, by the
-- release of a slot or by a wake-up of its scope (the WAKE sorted set), or at resume.
local CTL, WAKE, LIMS = B .. ':ctl', B .. ':wake', B .. ':lims'
local UNPARK_BUDGET, CONC_RECHECK = """
    + str(UNPARK_BUDGET)
    + ", "
    + str(CONC_RECHECK_MS)
    + r"""
-- The paused job names ('*': the whole queue) while a claim runs; nil when none.
local PAUSED = nil
-- Set when a script armed a wake-up (a job was held back by a limit).
local ARMED = false
-- Jobs held back by this call.
local HELD = 0

-- A job's limits: its 'lim' text, parsed once per call into {rate, window_ms, conc,
-- key_rate, key_window_ms, key_conc} (0: none), and the keys they keep their state
-- in, B .. ':rl:' .. SCOPE (a rate window) and B .. ':cc:' .. SCOPE (a concurrency
-- set), a scope being 'n:NAME' or 'k:NAME:KEY'. A call claims or finishes many jobs,
-- mostly of a few kinds: a name's keys are joined once per call, a limit key's once
-- per job, and nothing else is made on the usual path (parsing, the tables and the
-- strings made per job were a good part of a limited job's script time). The park
-- list, wake-up and reason of a scope, needed only when a job is held back, are worked
-- out from its key then (see park_of, armed_as).
local PARSED = {}
local function parsed(lim)
  local v = PARSED[lim]
  if not v then
    v = {}
    for x in string.gmatch(lim, '[^,]+') do v[#v + 1] = tonumber(x) end
    for i = 1, 6 do v[i] = v[i] or 0 end
    PARSED[lim] = v
  end
  return v
end
local NAMED = {[':rl:'] = {}, [':cc:'] = {}}
local function name_key(kind, name)
  local keys = NAMED[kind]
  local k = keys[name]
  if not k then
    k = B .. kind .. 'n:' .. name
    keys[name] = k
  end
  return k
end
-- The limits of a job: its parsed 'lim', then the keys of its concurrency sets (the
-- name's, the limit key's; nil where it has none).
local function conc_keys(name, lim, lk)
  local v = parsed(lim)
  local nc, kc
  if v[3] > 0 then nc = name_key(':cc:', name) end
  if lk and v[6] > 0 then kc = B .. ':cc:k:' .. name .. ':' .. lk end
  return v, nc, kc
end
-- The keys of its rate windows (the name's, the limit key's; nil where it has none).
local function rate_keys(v, name, lk)
  local nr, kr
  if v[1] > 0 then nr = name_key(':rl:', name) end
  if lk and v[4] > 0 then kr = B .. ':rl:k:' .. name .. ':' .. lk end
  return nr, kr
end
-- Of the key of a limit's state: its wake-up and LIMS name ('cc:SCOPE', 'rl:SCOPE'),
-- and its park list.
local function armed_as(key) return string.sub(key, #B + 2) end
local function park_of(key) return B .. ':park:' .. string.sub(key, #B + 2) end
-- What a reason says of it: NAME or NAME:KEY.
local function limited_as(key) return string.sub(key, #B + 7) end

-- Whether a limit's park list may exist on this shard. A job held back by a limit
-- arms its scope's wake-up in WAKE, and a scope stays armed while its park list has
-- jobs (see wake_some): without WAKE, no limit holds a job back, and the checks of
-- park lists are skipped. Known once per call (the claim knows it from its first
-- EXISTS); a hold of this call arms WAKE (ARMED).
local PARKS = nil
local function parks_possible()
  if PARKS == nil then PARKS = redis.call('EXISTS', WAKE) == 1 end
  return PARKS or ARMED
end

-- What this call knows of the limits' keys, kept up to date by its own writes (a
-- script runs alone): CONC[slots key], the size of a concurrency set (its SCARD, read
-- once); RATE[window key], {size, longest window, places to add} of a rate window
-- (its ZCARD, read once, plus the places this call took). The places a call takes
-- are added in one ZADD (and one PEXPIRE) per window: before the window is read
-- again (rate_flush), and when the claim ends (flush_limits).
local CONC, RATE, RATED = {}, {}, {}
local function conc_size(ck)
  local n = CONC[ck] or redis.call('SCARD', ck)
  CONC[ck] = n
  return n
end
local function rate_window(rk)
  local w = RATE[rk]
  if not w then
    w = {redis.call('ZCARD', rk), 0, {}}
    RATE[rk] = w
    RATED[#RATED + 1] = rk
  end
  return w
end
local function rate_flush(rk)
  local w = RATE[rk]
  if w and #w[3] > 0 then
    local places = w[3]
    for i = 1, #places, 1000 do
      redis.call('ZADD', rk, unpack(places, i, math.min(i + 999, #places)))
    end
    redis.call('PEXPIRE', rk, w[2])
    w[3] = {}
  end
end
local function flush_limits()
  for _, rk in ipairs(RATED) do rate_flush(rk) end
end
"""
    + r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Whole numbers as text, each formatted once per call: Redis formats a number given
-- to redis.call with printf, and so does Lua one joined to a string; the hot path
-- passes the same few numbers (now, a try's number) for every job.
local NUMS = {}
local function num(n)
  local s = NUMS[n]
  if not s then
    s = string.format('%d', n)
    NUMS[n] = s
  end
  return s
end
local function jkey(id) return B .. ':job:' .. id end

-- The counters (COUNTS, a field per status|name). A script that moves many jobs sets
-- BATCH and calls flush_moves() before it returns: its moves are then summed per
-- counter and applied once per call, in the order first moved (two HINCRBYs a job
-- were a fifth of a no-op job's script time); the others apply each move at once.
local BATCH = false
local MOVES, MOVED = {}, {}
local function bump(field, by)
  if not BATCH then
    redis.call('HINCRBY', COUNTS, field, by)
  elseif MOVES[field] then
    MOVES[field] = MOVES[field] + by
  else
    MOVES[field] = by
    MOVED[#MOVED + 1] = field
  end
end
local function move(name, from, to)
  if from then bump(from .. '|' .. name, -1) end
  if to then bump(to .. '|' .. name, 1) end
end
local function flush_moves()
  for _, field in ipairs(MOVED) do redis.call('HINCRBY', COUNTS, field, MOVES[field]) end
  MOVES, MOVED = {}, {}
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

-- Let out up to count jobs held in park list pk (queued again, in order); items of
-- jobs no longer held there (aborted meanwhile, say) are dropped on the way.
local function unpark(pk, count)
  local moved, left = 0, count + 20
  while moved < count and left > 0 do
    local item = redis.call('LPOP', pk)
    if not item then break end
    left = left - 1
    local id, gen = string.match(item, '^(.*)|(%d+)$')
    if id then
      local k = jkey(id)
      local f = redis.call('HMGET', k, 'status', 'name', 'tries', 'pk')
      if f[1] == 'held' and f[4] == gen then
        redis.call('HSET', k, 'up', 1)
        redis.call('HDEL', k, 'held')
        local status = 'sent'
        if tonumber(f[3] or '0') > 0 then status = 'retry' end
        push(id, k, f[2], 'held', status)
        moved = moved + 1
      end
    end
  end
  return moved
end

-- Give back the concurrency slots a job held (it ended, failed, was put back or its
-- worker died), letting out as many jobs waiting for them as there are free slots.
-- A park list let out to its last job disarms its scope's wake-up at once, as the
-- wake-up would (nothing waits there), so that the calls after it find no WAKE (and
-- skip the checks of park lists) as soon as no limit holds a job back.
local function release_slot(id, ck, count)
  if ck and redis.call('SREM', ck, id) == 1 then
    if CONC[ck] then CONC[ck] = CONC[ck] - 1 end
    if parks_possible() then
      local pk = park_of(ck)
      if redis.call('EXISTS', pk) == 1 then
        local free = count - conc_size(ck)
        if free > 0 then
          unpark(pk, math.min(free, UNPARK_BUDGET))
          if redis.call('EXISTS', pk) == 0 then
            local as = armed_as(ck)
            redis.call('ZREM', WAKE, as)
            redis.call('HDEL', LIMS, as)
          end
        end
      end
    end
  end
end
local function release_slots(id, name, lim, lk)
  local v, nc, kc = conc_keys(name, lim, lk)
  release_slot(id, nc, v[3])
  release_slot(id, kc, v[6])
end

-- Hold a job back: off ready stream p (entry eid), into park list pk, waiting with
-- the reason why. A job let out before ('up') goes back to the head of the list.
local function hold(p, eid, id, k, name, st, pk, why, up, tries, hist)
  redis.call('XACK', Q[p], GROUP, eid)
  redis.call('XDEL', Q[p], eid)
  local item = id .. '|' .. redis.call('HINCRBY', k, 'pk', 1)
  if up then redis.call('LPUSH', pk, item) else redis.call('RPUSH', pk, item) end
  HELD = HELD + 1
  redis.call('HSET', k, 'status', 'held', 'held', why, 'owner', '', 'tries', tries,
    'hist', hist or '')
  redis.call('HDEL', k, 'entry', 'up')
  move(name, st, 'held')
end

-- Whether a job may start under its limits now. If it may, it takes its share (a
-- slot of each concurrency limit, a place in each rate window) and nil is returned;
-- otherwise nothing is taken and {park list, reason} is returned, the wake-up of
-- that scope armed. Jobs already waiting in a park list go first: a job not let out
-- of one ('up') waits behind them even if the limit has room.
local function conc_held(id, ck, count, waiting, now)
  if not ck then return nil end
  local pk = waiting and park_of(ck)
  -- (a job holding a slot already, a try put back, keeps it)
  if ((pk and redis.call('EXISTS', pk) == 1) or conc_size(ck) >= count)
      and redis.call('SISMEMBER', ck, id) == 0 then
    local as = armed_as(ck)
    redis.call('ZADD', WAKE, 'NX', now + CONC_RECHECK, as)
    ARMED = true
    redis.call('HSET', LIMS, as, count .. ',0')
    return {park_of(ck), 'concurrency ' .. count .. ' of ' .. limited_as(ck)}
  end
  return nil
end
local function rate_held(rk, count, window, waiting, now)
  if not rk then return nil end
  local w = rate_window(rk)
  local full = w[1] >= count
  if full then
    -- Starts out of the window are dropped only when they could matter: a window
    -- under its limit with them is under it without them (and holds at most the
    -- limit's count either way).
    rate_flush(rk)
    redis.call('ZREMRANGEBYSCORE', rk, '-inf', now - window)
    w[1] = redis.call('ZCARD', rk)
    full = w[1] >= count
  end
  if full or (waiting and redis.call('EXISTS', park_of(rk)) == 1) then
    local at = now
    if full then at = tonumber(redis.call('ZRANGE', rk, 0, 0, 'WITHSCORES')[2]) + window end
    local as = armed_as(rk)
    redis.call('ZADD', WAKE, 'LT', at, as)
    ARMED = true
    redis.call('HSET', LIMS, as, count .. ',' .. window)
    return {park_of(rk), 'rate limit ' .. count .. ' per ' .. window .. ' ms of ' ..
      limited_as(rk)}
  end
  return nil
end
local function conc_take(id, ck)
  if ck and redis.call('SADD', ck, id) == 1 and CONC[ck] then CONC[ck] = CONC[ck] + 1 end
end
local function rate_take(rk, window, place, now)
  -- its place in the window, added when the claim ends (see flush_limits); a place
  -- taken twice (the same try in the same millisecond) counts once in Redis and
  -- twice here, which errs on the safe side until the window is read again
  if not rk then return end
  local w = RATE[rk]
  local places = w[3]
  places[#places + 1] = now
  places[#places + 1] = place
  w[1] = w[1] + 1
  if window > w[2] then w[2] = window end
end
local function limits_take(id, tries, name, lim, lk, up, now)
  local v, nc, kc = conc_keys(name, lim, lk)
  local nr, kr = rate_keys(v, name, lk)
  -- Whether any of its scopes has jobs waiting, in one call (mostly none, and none to
  -- look for without WAKE). Every call of a job's limits costs it: they are counted,
  -- not spent by the way.
  local waiting = false
  if not up and parks_possible() then
    local parks = {}
    for _, k in ipairs({nc or false, kc or false, nr or false, kr or false}) do
      if k then parks[#parks + 1] = park_of(k) end
    end
    waiting = #parks > 0 and redis.call('EXISTS', unpack(parks)) > 0
  end
  local held = conc_held(id, nc, v[3], waiting, now) or conc_held(id, kc, v[6], waiting, now)
    or rate_held(nr, v[1], v[2], waiting, now) or rate_held(kr, v[4], v[5], waiting, now)
  if held then return held end
  conc_take(id, nc)
  conc_take(id, kc)
  if nr or kr then
    local at = num(now)
    local place = id .. ':' .. num(tries) .. ':' .. at
    rate_take(nr, v[2], place, at)
    rate_take(kr, v[5], place, at)
  end
  return nil
end

-- Look again at up to budget limit scopes whose wake-up is due: let out as many of
-- their held jobs as the limit has room for now, and arm the next wake-up while some
-- still wait. A concurrency scope first drops the slots of jobs that no longer run
-- (a record deleted by hand), a sample at a time.
local function wake_some(now, budget)
  local due = redis.call('ZRANGEBYSCORE', WAKE, '-inf', now, 'LIMIT', 0, budget)
  for _, scope in ipairs(due) do
    redis.call('ZREM', WAKE, scope)
    local pk = B .. ':park:' .. scope
    local spec = redis.call('HGET', LIMS, scope)
    if spec and redis.call('EXISTS', pk) == 1 then
      local n, per = string.match(spec, '^(%d+),(%d+)$')
      n, per = tonumber(n), tonumber(per)
      local sk = B .. ':' .. scope
      local free, at
      if string.sub(scope, 1, 2) == 'rl' then
        rate_flush(sk)
        redis.call('ZREMRANGEBYSCORE', sk, '-inf', now - per)
        local size = redis.call('ZCARD', sk)
        if RATE[sk] then RATE[sk][1] = size end
        free = n - size
        local oldest = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')[2]
        at = now + per
        if oldest then at = tonumber(oldest) + per end
      else
        for _, m in ipairs(redis.call('SRANDMEMBER', sk, 20)) do
          if redis.call('HGET', jkey(m), 'status') ~= 'executing' then
            redis.call('SREM', sk, m)
          end
        end
        CONC[sk] = redis.call('SCARD', sk)
        free = n - CONC[sk]
        at = now + CONC_RECHECK
      end
      if free > 0 then unpark(pk, math.min(free, UNPARK_BUDGET)) end
      if redis.call('EXISTS', pk) == 1 then
        redis.call('ZADD', WAKE, at, scope)
      else
        redis.call('HDEL', LIMS, scope)
      end
    else
      redis.call('HDEL', LIMS, scope)
    end
  end
end

local function unqueue(k)
  local prio = tonumber(redis.call('HGET', k, 'prio') or '1')
  local e = redis.call('HGET', k, 'entry')
  if e then
    redis.call('XACK', Q[prio + 1], GROUP, e)
    redis.call('XDEL', Q[prio + 1], e)
  end
end

-- End a job dead: record the error, add it to the dead-letter stream (not a
-- workflow's gather node: no worker runs it, nothing could replay it).
local function mark_dead(id, k, name, from, err, now)
  if redis.call('HGET', k, 'feed') == 'g' then
    redis.call('HSET', k, 'status', 'dead', 'error', err, 'finished', now, 'owner', '')
    move(name, from, 'dead')
    notify(id, k, 'dead')
    expire_later(k)
    return
  end
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

-- Workflows. A job fed by the jobs it depends on (field 'feed': 'c' a chain's next
-- step, given its one dependency's result; 'n' a chord's callback, given the list of
-- its dependencies' results, in the order of 'order'; 'f' a failure callback, given
-- the failure of its one dependency; 'g' a group's gather node, run by no worker,
-- whose result is its dependencies' results) collects them in fields 'in:DEP' as
-- they end, and they are put first among its positional arguments when it is queued.

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
      settle(id, true, now)
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

-- What the end of job id hands its dependents: its result if it succeeded; else the
-- failure a failure callback gets (JSON: id, name, status, error), the detail the
-- others' DependencyFailed message gives and the root cause it carries on.
local function handed(id, ok, st)
  local k = jkey(id)
  if ok then return redis.call('HGET', k, 'result') or 'null', nil, nil end
  local f = redis.call('HMGET', k, 'name', 'error')
  local detail, cause = nil, nil
  if f[2] then
    local decoded, e = pcall(cjson.decode, f[2])
    if decoded and type(e) == 'table' and e.type then
      if e.type == 'DependencyFailed' and e.cause then
        detail, cause = tostring(e.cause), tostring(e.cause)
      else
        detail = tostring(e.type) .. ': ' .. string.sub(tostring(e.message or ''), 1, 500)
        cause = 'job ' .. id .. ' ended ' .. st .. ': ' .. detail
      end
    end
  end
  cause = cause or ('job ' .. id .. ' ended ' .. st)
  local info = '{"id":' .. cjson.encode(id) .. ',"name":' .. cjson.encode(f[1] or '') ..
    ',"status":' .. cjson.encode(st) .. ',"error":' .. (f[2] or 'null') .. '}'
  return info, detail, cause
end

-- The failure a failure callback gets for a job that is unknown.
local function unknown_job(id)
  return '{"id":' .. cjson.encode(id) .. ',"name":"","status":"unknown","error":null}'
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
    settle(d, false, now)
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
  settle(d, false, now)
end

-- A job ended: release (ok) or kill (not ok) the jobs waiting on it, transitively.
-- A job may have very many dependents, so no script walks them all: the job's set of
-- dependents is renamed to a set of its own (later dependents of a replayed or
-- re-enqueued job go to a new one), queued on SETTLE, and settle_some works through
-- that queue a bounded number of dependents per call. Any call that settles continues
-- with the budget it has; the worker that ended the job calls SETTLE_LUA until
-- nothing is left, and every claim continues it too. Dependents on other shards (or
-- queues) are in a set of their own ('xdeps'): settling one of them queues a message
-- on XOUT, which the workers deliver (DELIVER_LUA, on the dependent's shard).
local SETTLE, XOUT = B .. ':settle', B .. ':xout'
settle = function(id, ok, now)
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

-- Start a job read from (or reclaimed on) a ready stream; append it to out.
local function start(out, p, eid, id, consumer, now, lost, max_lost)
  local k = jkey(id)
  local f = redis.call('HMGET', k, 'status', 'name', 'args', 'tries', 'max_tries', 'expires',
    'owner', 'abort', 'started', 'hist', 'lim', 'lk', 'up', 'enqueued', 'hdr')
  local hist = f[10]
  local st, name, lim = f[1], f[2], f[11]
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
    if lim and st == 'executing' then release_slots(id, name, lim, f[12]) end
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
      if lim then release_slots(id, name, lim, f[12]) end
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
  if PAUSED and PAUSED[name] then
    if lim and st == 'executing' then release_slots(id, name, lim, f[12]) end
    hold(p, eid, id, k, name, st, B .. ':park:p:' .. name, 'paused', f[13], tries, hist)
    return
  end
  if lim then
    local wait = limits_take(id, tries + 1, name, lim, f[12], f[13], now)
    if wait then
      if st == 'executing' then release_slots(id, name, lim, f[12]) end
      hold(p, eid, id, k, name, st, wait[1], wait[2], f[13], tries, hist)
      return
    end
    if f[13] then redis.call('HDEL', k, 'up') end
  end
  tries = tries + 1
  local try, at = num(tries), num(now)
  local token = consumer .. ':' .. try
  redis.call('HSET', k, 'status', 'executing', 'owner', token, 'worker', consumer,
    'started', at, 'tries', try, 'entry', eid,
    'hist', hist_add(hist, 's,' .. try .. ',' .. at .. ',' .. consumer))
  if tries > 1 then redis.call('HDEL', k, 'progress') end
  move(name, st, 'executing')
  table.insert(out, {id, name, f[3], tries, token, p - 1, f[14] or 0, f[15] or ''})
end

-- Read each priority's pending entries (a consumer's only, if given) in steps: from
-- its cursor in ARGV[first + p] ('-' to start, the last entry id read, '' when done),
-- at most budget entries in all, calling each(p, e, id) per entry (id nil for an
-- entry gone from the stream). Returns the cursors to go on from.
local function page_pending(first, budget, consumer, each)
  local cursors = {}
  for p = 1, 3 do
    local cursor = ARGV[first + p]
    cursors[p] = cursor
    if cursor ~= '' and budget > 0 then
      local start = '-'
      if cursor ~= '-' then start = '(' .. cursor end
      local pending
      if consumer then
        pending = redis.pcall('XPENDING', Q[p], GROUP, start, '+', budget, consumer)
      else
        pending = redis.pcall('XPENDING', Q[p], GROUP, start, '+', budget)
      end
      if type(pending) ~= 'table' or pending.err then pending = {} end
      for _, item in ipairs(pending) do
        local e = item[1]
        local entry = redis.call('XRANGE', Q[p], e, e)[1]
        each(p, e, entry and entry[2][2])
      end
      if #pending < budget then cursors[p] = '' else cursors[p] = pending[#pending][1] end
      budget = budget - #pending
    end
  end
  return cursors
end

-- For each id in ARGV[2..] whose job is dead: take it off the dead-letter stream and
-- call act(id, k, name). Returns those ids (replay and purge of dead jobs).
local function each_dead(act)
  local out = {}
  for a = 2, #ARGV do
    local id = ARGV[a]
    local k = jkey(id)
    local f = redis.call('HMGET', k, 'status', 'name', 'dead_entry')
    if f[1] == 'dead' then
      if f[3] then redis.call('XDEL', DEAD, f[3]) end
      act(id, k, f[2])
      table.insert(out, id)
    end
  end
  return out
end
"""
)

#: Add jobs. ARGV: base, name, then the batch's defaults: priority, delay_ms
#: (relative, 0: none), max_tries, result_ttl_s, dedupe_window_s (for jobs with an id
#: of the caller's), expires_ms (absolute; negative: relative to now; 0: none), limits
#: (the ``lim`` field, "" for none); then per job: id, args (JSON), options ("" for the
#: defaults, else a JSON object with any of p (priority), d (delay_ms), a (at_ms,
#: absolute), e (expires_ms), w (1: dedupe by id), after (ids of jobs on this shard
#: that must succeed first), x (jobs on other shards or queues it depends on: id ->
#: what the link script answered for it), k (limit key), h (headers, JSON text), and,
#: for a workflow's jobs, n (name), m (max_tries), t (result_ttl_s), l (limits), dw
#: (dedupe_window_s), f
#: (feed: c, n, f or g; see ``hand_to``), o (every dependency's id, in order)).
#: Jobs are added in order, so a job may depend on one before it in the same call.
#: Returns 1 per new job, 0 per duplicate.
ENQUEUE_LUA = (
    _COMMON
    + r"""
local now = now_ms()
local d_name = ARGV[2]
local d_prio, d_delay, d_tries, d_ttl = ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6]
local window, d_expires, d_lim = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local out = {}
for i = 10, #ARGV, 3 do
  local id, args, opts = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local name, prio, delay, at, expires, dedupe = d_name, d_prio, d_delay, 0, d_expires, false
  local max_tries, ttl, lim, win = d_tries, d_ttl, d_lim, window
  local o = {}
  if opts ~= '' then
    o = cjson.decode(opts)
    if o.n then name = o.n end
    if o.m then max_tries = o.m end
    if o.t then ttl = o.t end
    if o.l then lim = o.l end
    if o.dw then win = o.dw end
    if o.p then prio = tostring(o.p) end
    if o.d then delay = o.d end
    if o.a then
      at = o.a
      if not o.d then delay = 0 end  -- its own time, not the batch's default delay
    end
    if o.e then expires = o.e end
    dedupe = o.w == 1
  end
  local k = jkey(id)
  local fresh = true
  if dedupe then
    local st = redis.call('HGET', k, 'status')
    local marked = redis.call('SET', B .. ':once:' .. id, '1', 'NX', 'EX', win)
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
    if lim ~= '' then redis.call('HSET', k, 'lim', lim) end
    if o.k then redis.call('HSET', k, 'lk', o.k) end
    if o.h then redis.call('HSET', k, 'hdr', o.h) end
    if expires ~= 0 then
      if expires < 0 then expires = now - expires end
      redis.call('HSET', k, 'expires', expires)
    end
    if due > 0 then redis.call('HSET', k, 'due', due) end
    local remote = o.x or {}
    local deps = #(o.after or {})
    for _ in pairs(remote) do deps = deps + 1 end
    if deps > 0 then
      -- Waiting first, for every dependency; each one already over is handed to it at
      -- once (the last one releases it), the others hand it their end when they end.
      redis.call('HSET', k, 'status', 'waiting', 'pending', deps)
      if o.f then redis.call('HSET', k, 'feed', o.f, 'order', cjson.encode(o.o or o.after)) end
      move(name, nil, 'waiting')
      for _, dep in ipairs(o.after or {}) do
        local ds = redis.call('HGET', jkey(dep), 'status')
        if ds and not FINAL[ds] then
          redis.call('SADD', B .. ':deps:' .. dep, id)
          redis.call('HSET', jkey(dep), 'dependents', 1)
        else
          local data, detail, cause = unknown_job(dep), nil, nil
          if ds then data, detail, cause = handed(dep, ds == 'success', ds) end
          hand_to(id, dep, ds == 'success', data, detail, cause, ds or 'unknown', now)
        end
      end
      local linked = false
      for dep, r in pairs(remote) do
        if r[1] == 'linked' then
          redis.call('SADD', B .. ':xpend:' .. id, dep)
          linked = true
        else
          local detail, cause = r[3], r[4]
          if detail == '' then detail = nil end
          if cause == '' then cause = nil end
          hand_to(id, dep, r[1] == 'success', r[2] or unknown_job(dep), detail, cause, r[1], now)
        end
      end
      if linked then
        redis.call('HSET', k, 'xp', 1)
        -- ends delivered before this job existed (the link came first)
        local ek = B .. ':early:' .. id
        local early = redis.call('HGETALL', ek)
        for e = 1, #early, 2 do
          if redis.call('SREM', B .. ':xpend:' .. id, early[e]) == 1 then
            local it = cjson.decode(early[e + 1])
            local detail, cause = it[5], it[6]
            if detail == false then detail = nil end
            if cause == false then cause = nil end
            hand_to(id, early[e], it[3] == 1, it[4], detail, cause, it[7], now)
          end
        end
        redis.call('DEL', ek)
      end
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

#: Link jobs to jobs on this shard that they depend on, from another shard or queue.
#: ARGV: base, then pairs: the dependency's id, the dependent (JSON [queue, shard,
#: id]). Returns per pair {"linked"} (its end will be delivered to the dependent),
#: {"unknown"}, or, for a dependency already over, {status, result or failure,
#: detail, cause} (see ``handed``), which the dependent's enqueue takes in.
LINK_LUA = (
    _COMMON
    + r"""
local out = {}
for a = 2, #ARGV, 2 do
  local x, member = ARGV[a], ARGV[a + 1]
  local k = jkey(x)
  local st = redis.call('HGET', k, 'status')
  if not st then
    out[#out + 1] = {'unknown'}
  elseif FINAL[st] then
    local data, detail, cause = handed(x, st == 'success', st)
    out[#out + 1] = {st, data, detail or '', cause or ''}
  else
    redis.call('SADD', B .. ':xdeps:' .. x, member)
    redis.call('HSET', k, 'dependents', 1)
    out[#out + 1] = {'linked'}
  end
end
return out
"""
)

#: Deliver the ends of jobs on other shards to their dependents on this one. ARGV:
#: base, then per message its JSON [queue, shard, dependent id, job id, ok (1/0),
#: result or failure, detail, cause, status] (as queued on XOUT). Idempotent: a
#: dependent takes each job's end once (its 'xpend' set); one not enqueued yet finds
#: it when it is ('early'). Returns as ``settle_some``.
DELIVER_LUA = (
    _COMMON
    + r"""
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
return settle_some(now, SETTLE_BUDGET)
"""
)

#: Forget messages delivered from this shard's XOUT. ARGV: base, then the messages,
#: as read. Returns how many are left to deliver.
DELIVERED_LUA = (
    _COMMON
    + r"""
for a = 2, #ARGV do redis.call('LREM', XOUT, 1, ARGV[a]) end
return redis.call('LLEN', XOUT)
"""
)

#: Claim jobs for a worker. ARGV: base, consumer, count, lease_ms, reclaim (0/1),
#: max_deliveries, the tries the worker runs (JSON object: job id -> token; a worker
#: never takes a job over from itself), then triples (priority, entry id, job id) of
#: entries a blocking read delivered already. Moves due scheduled jobs to their ready
#: streams first, lets out the held jobs whose limits have room again, then starts up
#: to ``count`` jobs, higher priorities first, holding back those over a limit or of a
#: paused job name; delivered entries beyond that are handed back (left pending,
#: reclaimable at once). While the whole queue is paused it starts nothing.
#: Moves at most ``DUE_BUDGET`` scheduled jobs, looks at ``WAKE_BUDGET`` limit scopes
#: and holds back at most ``max(count, READ_BUDGET)`` ready entries per call (the next
#: call does the rest: ``next_due_ms`` is then in the past), and settles dependents on the way.
#: Returns {jobs, next_due_ms or -1, now_ms, jobs with dependents left to settle,
#: 1 if the queue is paused}; each job is {id, name, args, tries, token, priority,
#: enqueued_ms, headers JSON or ""}.
CLAIM_LUA = (
    _COMMON
    + r"""
BATCH = true
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
-- Pauses and limits: one call when there are none (the fast path).
local waking = false
local marked = redis.call('EXISTS', CTL, WAKE)
PARKS = false
if marked > 0 then
  local c = redis.call('HGETALL', CTL)
  if #c > 0 then
    PAUSED = {}
    for i = 1, #c, 2 do PAUSED[c[i]] = true end
    marked = marked - 1
  end
  PARKS = marked > 0
  wake_some(now, """
    + str(WAKE_BUDGET)
    + r""")
  waking = true
end
local delivered = {{}, {}, {}}
for a = 8, #ARGV, 3 do
  table.insert(delivered[tonumber(ARGV[a]) + 1], {ARGV[a + 1], ARGV[a + 2]})
end
local out = {}
local paused = 0
if PAUSED and PAUSED['*'] then
  -- the whole queue is paused: start nothing, hand back what a read delivered
  paused = 1
  want = 0
end
-- Priority by priority: what the blocking read delivered, what dead workers left
-- (reclaim), then new entries. XREADGROUP's COUNT is per stream, so the read may have
-- delivered more than this worker has room for, and a read woken by one stream misses
-- the others: entries that do not fit are handed back at once, as a graceful stop does.
local READ_BUDGET = """
    + str(READ_BUDGET)
    + r"""
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
    -- Entries held back start nothing: read on, until READ_BUDGET were held back.
    while #out < want and HELD < READ_BUDGET do
      local count = want - #out
      if HELD > 0 then count = math.min(count, READ_BUDGET - HELD) end
      local r = redis.call('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', count,
        'STREAMS', Q[p], '>')
      if not r then break end
      local entries = r[1][2]
      for _, entry in ipairs(entries) do
        start(out, p, entry[1], entry[2][2], consumer, now, false, max_lost)
      end
      if #entries < count then break end
    end
  end
end
local nxt = redis.call('ZRANGE', SCHED, 0, 0, 'WITHSCORES')
local next_due = -1
if nxt[2] then next_due = tonumber(nxt[2]) end
if waking or ARMED then
  local w = redis.call('ZRANGE', WAKE, 0, 0, 'WITHSCORES')
  if w[2] and (next_due < 0 or tonumber(w[2]) < next_due) then next_due = tonumber(w[2]) end
end
flush_limits()
local settling = settle_some(now, SETTLE_BUDGET)
flush_moves()
return {out, next_due, now, settling, paused}
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
BATCH = true
local lease = tonumber(ARGV[2])
local now = now_ms()
local out = {}
-- Per priority, the entries of the jobs that ended: acknowledged and deleted at the
-- end of the call, two commands for them all (XACK and XDEL each take many ids).
local ENDED = {{}, {}, {}}
for a = 3, #ARGV, 5 do
  local id, token, outcome, data, number = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    tonumber(ARGV[a + 4])
  local k = jkey(id)
  local f = redis.call('HMGET', k, 'owner', 'name', 'prio', 'entry', 'status', 'w', 'ttl',
    'dependents', 'worker', 'tries', 'abort', 'hist', 'lim', 'lk')
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
    local hist = hist_add(f[12], hist_end(f[10], num(now), ended, outcome ~= 'ok' and data or nil))
    if f[13] then release_slots(id, name, f[13], f[14]) end
    if outcome == 'release' then
      local consumer = string.match(token, '^(.*):%d+$')
      redis.call('XCLAIM', Q[p], GROUP, consumer, 0, e, 'IDLE', lease + 1, 'JUSTID')
      redis.call('HSET', k, 'owner', '', 'status', 'sent', 'hist', hist)
      redis.call('HINCRBY', k, 'tries', -1)
      move(name, 'executing', 'sent')
    else
      local ended_here = ENDED[p]
      ended_here[#ended_here + 1] = e
      redis.call('HDEL', k, 'entry')
      if outcome == 'ok' then
        -- the hot path, inlined: mark_final and settle with the fields read above
        if number == 1 then
          redis.call('HSET', k, 'status', 'success', 'finished', num(now), 'owner', '',
            'result', data, 'hist', hist)
        else
          redis.call('HSET', k, 'status', 'success', 'finished', num(now), 'owner', '',
            'hist', hist)
        end
        move(name, 'executing', 'success')
        if f[6] then
          redis.call('XADD', DONE, 'MAXLEN', '~', 10000, '*', 'id', id, 's', 'success')
        end
        local ttl = tonumber(f[7] or '0')
        if ttl and ttl > 0 then redis.call('EXPIRE', k, f[7]) end
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
for p = 1, 3 do
  if #ENDED[p] > 0 then
    redis.call('XACK', Q[p], GROUP, unpack(ENDED[p]))
    redis.call('XDEL', Q[p], unpack(ENDED[p]))
  end
end
local settling = settle_some(now, SETTLE_BUDGET)
flush_moves()
return {out, settling}
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
  if st == 'waiting' and redis.call('HEXISTS', k, 'xp') == 1 then
    redis.call('DEL', B .. ':xpend:' .. id)
  end
  redis.call('HSET', k, 'error', cjson.encode({type = 'Aborted', message = reason}))
  mark_final(id, k, name, st, 'aborted', now)
  settle(id, false, now)
  return 'aborted'
end
local outcome = abort()
return {outcome, settle_some(now, SETTLE_BUDGET)}
"""
)

#: Pause or resume a queue shard, or one job name on it. ARGV: base, "pause" or
#: "resume", the job name ("*": the whole queue), budget. Pausing marks it (the claim
#: script starts no job of a paused name, and holds them back; none at all while the
#: whole queue is paused). Resuming unmarks it and lets out up to ``budget`` of the
#: jobs that the pause of that name held back, in order. Returns {how many it holds
#: back still (call again until 0), how many it let out}.
CONTROL_LUA = (
    _COMMON
    + r"""
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
"""
)

#: Add, change or remove a runtime schedule (on shard 0). ARGV: base, "set" or "del",
#: name, its JSON (for "set"). Bumps the schedules' version, which workers watch.
#: Returns 1, or for "del" whether there was such a schedule.
SCHEDULE_LUA = (
    _COMMON
    + r"""
local op, name = ARGV[2], ARGV[3]
local n = 1
if op == 'set' then
  redis.call('HSET', B .. ':crontab', name, ARGV[4])
else
  n = redis.call('HDEL', B .. ':crontab', name)
end
redis.call('INCR', B .. ':crontab:v')
return n
"""
)

#: Settle the dependents of ended jobs (see ``settle``). ARGV: base, budget (the most
#: dependents settled in this call). Returns the jobs with dependents left to settle.
SETTLE_LUA = (
    _COMMON
    + r"""
settle_some(now_ms(), tonumber(ARGV[2]))
return redis.call('LLEN', SETTLE)
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
return each_dead(function(id, k, name)
  redis.call('HSET', k, 'tries', 0, 'lost', 0, 'owner', '')
  redis.call('HDEL', k, 'dead_entry', 'finished', 'abort', 'progress')
  push(id, k, name, 'dead', 'sent')
end)
"""
)

#: Delete dead jobs and their records. ARGV: base, ids. Returns the ids deleted.
PURGE_LUA = (
    _COMMON
    + r"""
return each_dead(function(id, k, name)
  redis.call('DEL', k)
  move(name, 'dead', nil)
end)
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
local lengths, running = {}, {}
for p = 1, 3 do lengths[p], running[p] = redis.call('XLEN', Q[p]), 0 end
-- entries of running jobs are pending in the group; a job put back by a graceful
-- stop is pending too, but queued
local cursors = page_pending(2, tonumber(ARGV[2]), nil, function(p, e, id)
  if id and redis.call('HGET', jkey(id), 'status') == 'executing' then
    running[p] = running[p] + 1
  end
end)
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
local cursors = page_pending(4, budget, consumer, function(p, e, id)
  if id and not running[id] then
    local k = jkey(id)
    local f = redis.call('HMGET', k, 'status', 'owner', 'name', 'lim', 'lk')
    local mine = f[2] and string.sub(f[2], 1, #consumer + 1) == consumer .. ':'
    if f[1] == 'executing' and mine then
      if f[4] then release_slots(id, f[3], f[4], f[5]) end
      redis.call('HSET', k, 'status', 'sent', 'owner', '')
      redis.call('HINCRBY', k, 'tries', -1)
      move(f[3], 'executing', 'sent')
    end
    redis.call('XCLAIM', Q[p], GROUP, consumer, 0, e, 'IDLE', lease + 1, 'JUSTID')
    n = n + 1
  end
end)
return {n, cursors}
"""
)
