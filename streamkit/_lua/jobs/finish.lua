-- Finishes jobs, fenced. Per job: id, token, outcome (ok, retry, dead, aborted,
-- release; or p: not an outcome, the try's last progress value as data, set before
-- its outcome in the same call), data (result or error JSON), number (retry delay ms; for ok, 1 to keep the
-- result, plus twice the number of records the try emitted), then for ok each emitted
-- record: its stream key (a partition on a server; the shard's outbox, under its tag,
-- on Redis Cluster), the entries to keep when trimming (0: none), its field count and
-- fields. The records are appended only when the success is committed. A retry or
-- release of a job whose abort was requested while it ran ends it aborted. Per job the
-- reply says 1 if committed, 0 if this claim no longer owns it (nothing was written
-- for it), 2 if this claim finished it already (sent again after a reply was lost:
-- nothing more is written). A job whose try streamed output (jobs/stream) gets its
-- outcome appended to its output stream when it ends here (success, aborted, dead).
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, lease_ms, job... (id, token, outcome, data, number, then its emitted
--   records: see above)
-- REPLY: {replies: [int], settling: int (jobs with dependents left to settle)}
--#include lib/jobs/batched
--#include lib/clock
--#include lib/jobs/history
--#include lib/jobs/numbers
--#include lib/jobs/slots
--#include lib/jobs/settling
--#include lib/trim
--#include lib/jobs/ended

batch_moves()
local lease = tonumber(ARGV[2])
local now = now_ms()
local out = {}
-- Per priority, the entries of the jobs that ended: acknowledged and removed at the
-- end of the call, a few commands for them all (lib/jobs/ended).
local ENDED = {{}, {}, {}}
-- Append the records a successful try emitted (ARGV from `at`, `n` of them).
local function append_emitted(at, n)
  for _ = 1, n do
    local key, keep, count = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    redis.call('XADD', key, '*', unpack(ARGV, at + 3, at + 2 + 2 * count))
    if keep > 0 then trim_processed(key, redis.call('XLEN', key), keep, 1) end
    at = at + 3 + 2 * count
  end
end

-- End job id's output stream (current_job().stream) with its outcome; on success it
-- expires with the result (ttl_s), else it keeps the expiry of its last chunk.
local function end_output(id, status, ttl_s)
  local output = B .. ':out:' .. id
  redis.call('XADD', output, '*', 'e', status)
  local ttl = tonumber(ttl_s or '0')
  if status == 'success' and ttl and ttl > 0 then redis.call('EXPIRE', output, ttl) end
end

-- Where the records a try emitted end, from `at` (`n` of them): the next job's index.
local function after_emitted(at, n)
  for _ = 1, n do at = at + 3 + 2 * tonumber(ARGV[at + 2]) end
  return at
end

local a = 3
while a <= #ARGV do
  local id, token, outcome, data, number = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    tonumber(ARGV[a + 4])
  local emitted, emitted_at = 0, a + 5
  if outcome == 'ok' and number > 1 then
    emitted = math.floor(number / 2)
    number = number % 2
  end
  a = after_emitted(emitted_at, emitted)
  local k = jkey(id)
  -- (a limit's key, lk, and the worker, for a try over, are read when needed: each field
  -- read costs a no-op job's finish about 0.3 us)
  local f = redis.call('HMGET', k, 'owner', 'name', 'prio', 'entry', 'status', 'w', 'ttl',
    'dependents', 'tries', 'abort', 'hist', 'lim', 'sq')
  if outcome == 'p' then
    -- the try's last progress value, before its outcome (fenced like it)
    if f[1] == token and f[5] == 'executing' then
      redis.call('HSET', k, 'pv', data)
      job_event(id, f[2], 'progress', data)
      table.insert(out, 1)
    else
      table.insert(out, 0)
    end
  elseif f[1] ~= token or f[5] ~= 'executing' then
    -- the token is worker:tries: its try was the last one started, and it is over
    local worker = f[9] and redis.call('HGET', k, 'worker')
    if worker and worker .. ':' .. f[9] == token then
      table.insert(out, 2)
    else
      table.insert(out, 0)
    end
  else
    local name, p, e = f[2], tonumber(f[3]) + 1, f[4]
    if f[10] and (outcome == 'retry' or outcome == 'release') then
      -- aborted while this try ran: no other try
      outcome, data = 'aborted', cjson.encode({type = 'Aborted', message = f[10]})
    end
    local ended = (outcome == 'release' and 'released') or (outcome == 'ok' and 'success')
      or outcome
    local hist = hist_add(f[11], hist_end(f[9], num(now), ended, outcome ~= 'ok' and data or nil))
    if f[12] then release_slots(id, name, f[12], redis.call('HGET', k, 'lk')) end
    if outcome == 'release' then
      local consumer = string.match(token, '^(.*):%d+$')
      redis.call('XCLAIM', Q[p], GROUP, consumer, 0, e, 'IDLE', lease + 1, 'JUSTID')
      redis.call('HSET', k, 'owner', '', 'status', 'sent', 'hist', hist)
      redis.call('HINCRBY', k, 'tries', -1)
      move(name, 'executing', 'sent')
      job_event(id, name, 'released', nil)
    else
      local ended_here = ENDED[p]
      ended_here[#ended_here + 1] = e
      if outcome == 'ok' then
        -- the hot path, inlined: mark_final and settle with the fields read above (its
        -- entry emptied, not deleted: a final job's entry is never read again)
        if number == 1 then
          redis.call('HSET', k, 'status', 'success', 'finished', num(now), 'owner', '',
            'entry', '', 'result', data, 'hist', hist)
        else
          redis.call('HSET', k, 'status', 'success', 'finished', num(now), 'owner', '',
            'entry', '', 'hist', hist)
        end
        move(name, 'executing', 'success')
        job_event(id, name, 'succeeded', nil)
        if emitted > 0 then append_emitted(emitted_at, emitted) end
        if f[13] then end_output(id, 'success', f[7]) end
        if f[6] then
          redis.call('XADD', DONE, 'MAXLEN', '~', 10000, '*', 'id', id, 's', 'success')
        end
        local ttl = tonumber(f[7] or '0')
        if ttl and ttl > 0 then redis.call('EXPIRE', k, f[7]) end
        if f[8] then settle(id, true) end
      elseif outcome == 'retry' then
        redis.call('HDEL', k, 'entry')
        redis.call('HSET', k, 'status', 'retry', 'error', data, 'owner', '', 'hist', hist)
        redis.call('ZADD', SCHED, now + number, id)
        move(name, 'executing', 'retry')
        job_event(id, name, 'retried', data)
      elseif outcome == 'aborted' then
        redis.call('HDEL', k, 'entry')
        if f[13] then end_output(id, 'aborted', nil) end
        redis.call('HSET', k, 'error', data, 'hist', hist)
        mark_final(id, k, name, 'executing', 'aborted', now)
        settle(id, false)
      else
        redis.call('HDEL', k, 'entry')
        if f[13] then end_output(id, 'dead', nil) end
        redis.call('HSET', k, 'hist', hist)
        mark_dead(id, k, name, 'executing', data, now)
        settle(id, false)
      end
    end
    table.insert(out, 1)
  end
end
for p = 1, 3 do
  if #ENDED[p] > 0 then remove_ended(p, ENDED[p]) end
end
local settling = settle_some(now, K.SETTLE_BUDGET)
flush_moves()
return {out, settling}
