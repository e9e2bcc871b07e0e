-- Claims jobs for a worker. Moves due scheduled jobs to their ready streams first, lets
-- out the held jobs whose limits have room again, then starts up to `count` jobs, higher
-- priorities first, holding back those over a limit or of a paused job name; delivered
-- entries beyond that are handed back (left pending, reclaimable at once). While the
-- whole queue is paused it starts nothing. Moves at most K.DUE_BUDGET scheduled jobs,
-- looks at K.WAKE_BUDGET limit scopes and holds back at most max(count, K.READ_BUDGET)
-- ready entries per call (the next call does the rest: next_due is then in the past),
-- and settles dependents on the way. `mine`: the tries the worker runs (JSON object: job id
-- -> token; a worker never takes a job over from itself); then the entries a blocking
-- read delivered already.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, consumer, count, lease_ms, reclaim (0/1), max_deliveries, mine,
--   (priority, entry, id)...
-- REPLY: {jobs: [{id: str, name: str, args: str, tries: int, token: str, priority: int,
--   enqueued: str | int, headers: str}], next_due: int (ms; -1: none), now: int (ms),
--   settling: int (jobs with dependents left to settle), paused: int (1: the queue is
--   paused)}
--#include lib/jobs/batched
--#include lib/clock
--#include lib/jobs/history
--#include lib/jobs/limits
--#include lib/jobs/settling

-- The paused job names ('*': the whole queue) while a claim runs; nil when none.
local PAUSED = nil

-- Start a job read from (or reclaimed on) a ready stream; append it to out.
local function start(out, p, eid, id, consumer, now, lost, max_lost)
  local k = jkey(id)
  -- The fields every start needs; those only some need (a limit's keys, a job taken
  -- over, a deadline) are read when needed: each field read costs a no-op job's claim
  -- about 0.3 us.
  local f = redis.call('HMGET', k, 'status', 'name', 'args', 'tries', 'expires', 'abort',
    'hist', 'lim', 'enqueued', 'hdr')
  local st, name, hist, lim = f[1], f[2], f[7], f[8]
  if st == 'executing' and not lost then
    -- taken over by another worker meanwhile (this one was paused after reading it)
    return
  end
  if not st or FINAL[st] or (st ~= 'sent' and st ~= 'retry' and st ~= 'executing') then
    redis.call('XACK', Q[p], GROUP, eid)
    redis.call('XDEL', Q[p], eid)
    return
  end
  -- a limit's key (lk) and whether it was let out of a park list (up)
  local lk, up = false, false
  if lim then
    local l = redis.call('HMGET', k, 'lk', 'up')
    lk, up = l[1], l[2]
  end
  if f[6] then
    -- aborted while a try ran, which ended (or its worker stopped) before the abort
    -- reached it: no new try
    redis.call('XACK', Q[p], GROUP, eid)
    redis.call('XDEL', Q[p], eid)
    redis.call('HSET', k, 'error', cjson.encode({type = 'Aborted', message = f[6]}))
    if lim and st == 'executing' then release_slots(id, name, lim, lk) end
    mark_final(id, k, name, st, 'aborted', now)
    settle(id, false)
    return
  end
  local tries = tonumber(f[4] or '0')
  local owner, max_tries = false, nil
  if lost then
    local o = redis.call('HMGET', k, 'owner', 'max_tries')
    owner, max_tries = o[1], tonumber(o[2])
  end
  if owner and string.sub(owner, 1, #consumer + 1) == consumer .. ':' then
    -- claimed by this very worker in a reply that was lost (it never ran): not spent
    tries = tries - 1
  elseif owner and owner ~= '' then
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
      if lim then release_slots(id, name, lim, lk) end
      mark_dead(id, k, name, st, cjson.encode({type = 'WorkerLost', message = why}), now)
      settle(id, false)
      return
    end
  end
  local expires = tonumber(f[5] or '0') or 0
  if expires > 0 and now > expires and not redis.call('HGET', k, 'started') then
    -- not started in time (a job that started once is retried, put back or replayed
    -- whatever the time)
    redis.call('XACK', Q[p], GROUP, eid)
    redis.call('XDEL', Q[p], eid)
    mark_final(id, k, name, st, 'expired', now)
    settle(id, false)
    return
  end
  if PAUSED and PAUSED[name] then
    if lim and st == 'executing' then release_slots(id, name, lim, lk) end
    if not lim then up = redis.call('HGET', k, 'up') end
    hold(p, eid, id, k, name, st, B .. ':park:p:' .. name, 'paused', up, tries, hist)
    return
  end
  if lim then
    local wait = limits_take(id, tries + 1, name, lim, lk, up, now)
    if wait then
      if st == 'executing' then release_slots(id, name, lim, lk) end
      hold(p, eid, id, k, name, st, wait[1], wait[2], up, tries, hist)
      return
    end
    if up then redis.call('HDEL', k, 'up') end
  end
  tries = tries + 1
  local try, at = num(tries), num(now)
  local token = consumer .. ':' .. try
  redis.call('HSET', k, 'status', 'executing', 'owner', token, 'worker', consumer,
    'started', at, 'tries', try, 'entry', eid,
    'hist', hist_add(hist, 's,' .. try .. ',' .. at .. ',' .. consumer))
  if tries > 1 then redis.call('HDEL', k, 'progress') end
  move(name, st, 'executing')
  job_event(id, name, 'started', try)
  table.insert(out, {id, name, f[3], tries, token, p - 1, f[9] or 0, f[10] or ''})
end

batch_moves()
local consumer, want = ARGV[2], tonumber(ARGV[3])
local lease, reclaim, max_lost = tonumber(ARGV[4]), ARGV[5] == '1', tonumber(ARGV[6])
local mine = cjson.decode(ARGV[7])
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', SCHED, '-inf', now, 'LIMIT', 0, K.DUE_BUDGET)
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
parks_known(false)
if marked > 0 then
  local c = redis.call('HGETALL', CTL)
  if #c > 0 then
    PAUSED = {}
    for i = 1, #c, 2 do PAUSED[c[i]] = true end
    marked = marked - 1
  end
  parks_known(marked > 0)
  wake_some(now, K.WAKE_BUDGET)
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
        if not id then
          redis.call('XACK', Q[p], GROUP, entry[1])
        elseif not (mine[id] and redis.call('HGET', jkey(id), 'owner') == mine[id]) then
          start(out, p, entry[1], id, consumer, now, true, max_lost)
        end
        -- (else this worker runs it, its renewals late: a blocked event loop, a slow
        -- Redis; XAUTOCLAIM just renewed its lease)
      end
    end
    -- Entries held back start nothing: read on, until K.READ_BUDGET were held back.
    while #out < want and held_back() < K.READ_BUDGET do
      local count = want - #out
      if held_back() > 0 then count = math.min(count, K.READ_BUDGET - held_back()) end
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
if waking or armed() then
  local w = redis.call('ZRANGE', WAKE, 0, 0, 'WITHSCORES')
  if w[2] and (next_due < 0 or tonumber(w[2]) < next_due) then next_due = tonumber(w[2]) end
end
flush_limits()
local settling = settle_some(now, K.SETTLE_BUDGET)
flush_moves()
return {out, next_due, now, settling, paused}
