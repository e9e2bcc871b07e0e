-- Adds jobs, in order (a job may depend on one before it in the same call). Per job:
-- its id, its arguments (JSON), its options ("" for the batch's defaults, else a JSON
-- object with any of p (priority), d (delay_ms), a (at_ms, absolute), e (expires_ms), w
-- (1: dedupe by id), after (ids of jobs on this shard that must succeed first), x (jobs
-- on other shards or queues it depends on: id -> what jobs/link answered for it), k
-- (limit key), h (headers, JSON text), and, for a workflow's jobs, n (name), m
-- (max_tries), t (result_ttl_s), l (limits), dw (dedupe_window_s), f (feed: c, n, f or
-- g; see hand_to), o (every dependency's id, in order)).
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, name, priority, delay_ms (relative; 0: none), max_tries, result_ttl_s,
--   dedupe_window_s (for jobs with an id of the caller's), expires_ms (absolute;
--   negative: relative to now; 0: none), limits (the lim field; "" for none),
--   (id, args, options)...
-- REPLY: [int] (per job: 1 new, 0 a duplicate)
--#include lib/jobs/common

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
