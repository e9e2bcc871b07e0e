-- Adds jobs, in order (a job may depend on one before it in the same call). Per job:
-- its id, its arguments (JSON), its options ("" for the batch's defaults, else a JSON
-- object with any of the options lib/jobs/options names). A job relayed from a
-- partition's outbox (option r: its source's marker key, under this shard's tag, and
-- its outbox entry id) is added only if its entry is after the marker's, which it then
-- becomes: a relay repeated after a crash adds nothing twice (streamkit._state_relay).
-- A debounced job (option b) merges into its key's pending job while that one is still
-- scheduled: the latest arguments, run debounce_ms from now but at most max_wait_ms
-- after the burst's first enqueue; else it becomes its key's pending job
-- (__jobs:{Q.S}:db:NAME:KEY, kept DEBOUNCE_KEEP_MS past its time). A throttled job
-- (option th) is dropped while its key's job accepted in the period lives
-- (__jobs:{Q.S}:th:NAME:KEY, expiring with the period).
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, name, priority, delay_ms (relative; 0: none), max_tries, result_ttl_s,
--   dedupe_window_s (for jobs with an id of the caller's), expires_ms (absolute;
--   negative: relative to now; 0: none), limits (the lim field; "" for none),
--   (id, args, options)...
-- REPLY: [int | str] (per job: 1 new, 0 a duplicate, or the id of the job a debounce
--   merged it into or a throttle kept)
--#include lib/jobs/batched
--#include lib/clock
--#include lib/jobs/options
--#include lib/jobs/record
--#include lib/jobs/queue
--#include lib/jobs/handed
--#include lib/jobs/dependents
--#include lib/stream_ids

-- The failure a failure callback gets for a job that is unknown.
local function unknown_job(id)
  return '{"id":' .. cjson.encode(id) .. ',"name":"","status":"unknown","error":null}'
end

-- A relayed job (r = {marker key, outbox id}): whether an earlier call added it.
local function relayed_before(r)
  local last = redis.call('GET', r[1])
  if last then
    local am, as = parse_id(r[2])
    local bm, bs = parse_id(last)
    -- (not after the last one relayed: relayed before)
    if am < bm or (am == bm and as <= bs) then return true end
  end
  redis.call('SET', r[1], r[2])
  return false
end

-- A debounced call of job id (b = {key, debounce_ms, max_wait_ms or 0}): the id of its
-- key's pending job, given the call's arguments and headers and pushed back, or nil when
-- none is pending (job id becomes the key's pending job).
local function debounced(id, name, b, args, hdr, now)
  local dk = B .. ':db:' .. name .. ':' .. b[1]
  local pending = redis.call('GET', dk)
  local due = now + b[2]
  if pending and redis.call('HGET', jkey(pending), 'status') == 'scheduled' then
    local pk = jkey(pending)
    local cap = tonumber(redis.call('HGET', pk, 'enqueued')) + b[3]
    if b[3] > 0 and due > cap then due = cap end
    redis.call('HSET', pk, 'args', args, 'due', due)
    if hdr then redis.call('HSET', pk, 'hdr', hdr) else redis.call('HDEL', pk, 'hdr') end
    redis.call('ZADD', SCHED, due, pending)
    redis.call('PEXPIRE', dk, math.max(due - now, 0) + K.DEBOUNCE_KEEP_MS)
    return pending
  end
  redis.call('SET', dk, id, 'PX', b[2] + K.DEBOUNCE_KEEP_MS)
  return nil
end

-- A throttled call of job id (th = {key, period_ms}): the id of the job its key
-- accepted in the period, or nil when there is none (job id is accepted).
local function throttled(id, name, th)
  local tk = B .. ':th:' .. name .. ':' .. th[1]
  if redis.call('SET', tk, id, 'NX', 'PX', th[2]) then return nil end
  return redis.call('GET', tk)
end

batch_moves()
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
    if o[OPT.name] then name = o[OPT.name] end
    if o[OPT.max_tries] then max_tries = o[OPT.max_tries] end
    if o[OPT.result_ttl_s] then ttl = o[OPT.result_ttl_s] end
    if o[OPT.limits] then lim = o[OPT.limits] end
    if o[OPT.dedupe_window_s] then win = o[OPT.dedupe_window_s] end
    if o[OPT.priority] then prio = tostring(o[OPT.priority]) end
    if o[OPT.delay_ms] then delay = o[OPT.delay_ms] end
    if o[OPT.at_ms] then
      at = o[OPT.at_ms]
      -- its own time, not the batch's default delay
      if not o[OPT.delay_ms] then delay = 0 end
    end
    if o[OPT.expires_ms] then expires = o[OPT.expires_ms] end
    dedupe = o[OPT.dedupe] == 1
  end
  local k = jkey(id)
  local fresh = not (o[OPT.relayed] and relayed_before(o[OPT.relayed]))
  local into = nil
  if fresh and o[OPT.debounce] then
    into = debounced(id, name, o[OPT.debounce], args, o[OPT.headers], now)
    delay, at = o[OPT.debounce][2], 0
  elseif fresh and o[OPT.throttle] then
    into = throttled(id, name, o[OPT.throttle])
  end
  if into then fresh = false end
  if dedupe and fresh then
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
    if o[OPT.limit_key] then redis.call('HSET', k, 'lk', o[OPT.limit_key]) end
    if o[OPT.headers] then redis.call('HSET', k, 'hdr', o[OPT.headers]) end
    if expires ~= 0 then
      if expires < 0 then expires = now - expires end
      redis.call('HSET', k, 'expires', expires)
    end
    if due > 0 then redis.call('HSET', k, 'due', due) end
    local remote = o[OPT.remote] or {}
    local deps = #(o[OPT.after] or {})
    for _ in pairs(remote) do deps = deps + 1 end
    if deps > 0 then
      -- Waiting first, for every dependency; each one already over is handed to it at
      -- once (the last one releases it), the others hand it their end when they end.
      redis.call('HSET', k, 'status', 'waiting', 'pending', deps)
      if o[OPT.feed] then
        redis.call('HSET', k, 'feed', o[OPT.feed], 'order',
          cjson.encode(o[OPT.order] or o[OPT.after]))
      end
      move(name, nil, 'waiting')
      for _, dep in ipairs(o[OPT.after] or {}) do
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
    job_event(id, name, 'enqueued', nil)
    table.insert(out, 1)
  else
    table.insert(out, into or 0)
  end
end
flush_moves()
return out
