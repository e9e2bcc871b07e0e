-- Shared by every job script: the shard's keys, key helpers, counters, limits and pauses,
-- and the transitions that several scripts make (queue a job, end it dead, settle the
-- jobs waiting on it). What a job's hash holds and where a shard keeps its limits:
-- streamkit/jobs/_scripts.py; its keys: streamkit/jobs/_layout.py.

local B = ARGV[1]
local Q = {KEYS[1], KEYS[2], KEYS[3]}
local SCHED, DEAD, DONE, COUNTS = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local GROUP = K.JOB_GROUP
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
          unpark(pk, math.min(free, K.UNPARK_BUDGET))
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
    redis.call('ZADD', WAKE, 'NX', now + K.CONC_RECHECK_MS, as)
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
        at = now + K.CONC_RECHECK_MS
      end
      if free > 0 then unpark(pk, math.min(free, K.UNPARK_BUDGET)) end
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
