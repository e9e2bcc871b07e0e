-- The claim's side of limits and pauses: limits_take(...) (whether a job may start under
-- its limits now, taking its share), hold(...) (hold a job back), wake_some(now, budget)
-- (let out held jobs whose limits have room again), flush_limits() (before the claim
-- returns); parks_known(possible), held_back() and armed() tell and read this call's
-- state. See lib/jobs/slots for how limits hold jobs back.
--#include lib/jobs/slots
--#include lib/jobs/numbers

-- Jobs held back by this call.
local HELD = 0
-- The claim knows whether park lists may exist from its first EXISTS (see
-- parks_possible).
local function parks_known(possible) PARKS = possible end
local function held_back() return HELD end
-- Whether this call armed a wake-up (a job was held back by a limit).
local function armed() return ARMED end

-- The keys of a job's rate windows (the name's, the limit key's; nil where it has none).
local function rate_keys(v, name, lk)
  local nr, kr
  if v[1] > 0 then nr = name_key(':rl:', name) end
  if lk and v[4] > 0 then kr = B .. ':rl:k:' .. name .. ':' .. lk end
  return nr, kr
end
-- What a reason says of it: NAME or NAME:KEY.
local function limited_as(key) return string.sub(key, #B + 7) end

-- A rate window is a sorted set of the starts in it, grouped: a member per call that
-- took places, scored by the call's time (all its places have it), named after the
-- call's first place and followed by '#' and the number of places (a window written
-- before groups holds a member per start, with no '#'). Its count of starts is kept
-- beside it, in B .. ':rn:' .. SCOPE, with the same expiry. So a job's place costs no
-- command of its own, and a window moves a group at a time: every start of a group
-- leaves the window at the same moment.
local function starts_of(member) return tonumber(string.match(member, '#(%d+)$') or '1') end
local function count_key(rk) return B .. ':rn:' .. string.sub(rk, #B + 5) end
-- The starts in window rk: its count, or (a window written before counts) its members'.
local function rate_count(rk)
  local n = redis.call('GET', count_key(rk))
  if n then return tonumber(n) end
  local members = redis.call('ZRANGE', rk, 0, -1)
  if #members == 0 then return 0 end
  local total = 0
  for _, m in ipairs(members) do total = total + starts_of(m) end
  local ttl = redis.call('PTTL', rk)
  if ttl > 0 then
    redis.call('SET', count_key(rk), total, 'PX', ttl)
  else
    redis.call('SET', count_key(rk), total)
  end
  return total
end

-- What this call knows of the rate windows, kept up to date by its own writes (a script
-- runs alone): RATE[window key], {size, longest window, places to add, the first of
-- them, their time} of a rate window (its count, read once, plus the places this call
-- took). The places a call takes are added as one group (a ZADD, an INCRBY and their
-- PEXPIREs) per window: before the window is read again (rate_flush), and when the
-- claim ends (flush_limits).
local RATE, RATED = {}, {}
local function rate_window(rk)
  local w = RATE[rk]
  if not w then
    w = {rate_count(rk), 0, 0, nil, nil}
    RATE[rk] = w
    RATED[#RATED + 1] = rk
  end
  return w
end
local function rate_flush(rk)
  local w = RATE[rk]
  if w and w[3] > 0 then
    local ck = count_key(rk)
    -- (a group added again, the same call's reply lost and the call made again in the
    -- same millisecond, is counted once)
    if redis.call('ZADD', rk, w[5], w[4] .. '#' .. w[3]) == 1 then
      redis.call('INCRBY', ck, w[3])
    end
    redis.call('PEXPIRE', rk, w[2])
    redis.call('PEXPIRE', ck, w[2])
    w[3], w[4] = 0, nil
  end
end
-- Drop the groups of window rk that started at or before now - window; its count after.
local function rate_trim(rk, now, window)
  rate_flush(rk)
  local before = rate_count(rk)
  local old = redis.call('ZRANGEBYSCORE', rk, '-inf', now - window)
  if #old == 0 then return before end
  local size = before
  for _, m in ipairs(old) do size = size - starts_of(m) end
  redis.call('ZREMRANGEBYSCORE', rk, '-inf', now - window)
  if size <= 0 or redis.call('EXISTS', rk) == 0 then
    redis.call('DEL', count_key(rk))
    return 0
  end
  redis.call('DECRBY', count_key(rk), before - size)
  return size
end
local function flush_limits()
  for _, rk in ipairs(RATED) do rate_flush(rk) end
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
    w[1] = rate_trim(rk, now, window)
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
local function rate_take(rk, window, id, tries, now)
  -- its place in the window, added with the call's others when the claim ends (see
  -- flush_limits)
  if not rk then return end
  local w = RATE[rk]
  if w[3] == 0 then
    w[4] = id .. ':' .. num(tries) .. ':' .. now
    w[5] = now
  end
  w[1] = w[1] + 1
  w[3] = w[3] + 1
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
    rate_take(nr, v[2], id, tries, at)
    rate_take(kr, v[5], id, tries, at)
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
        local size = rate_trim(sk, now, per)
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
