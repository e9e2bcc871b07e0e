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
--#include lib/jobs/common

BATCH = true
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
PARKS = false
if marked > 0 then
  local c = redis.call('HGETALL', CTL)
  if #c > 0 then
    PAUSED = {}
    for i = 1, #c, 2 do PAUSED[c[i]] = true end
    marked = marked - 1
  end
  PARKS = marked > 0
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
    -- Entries held back start nothing: read on, until K.READ_BUDGET were held back.
    while #out < want and HELD < K.READ_BUDGET do
      local count = want - #out
      if HELD > 0 then count = math.min(count, K.READ_BUDGET - HELD) end
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
local settling = settle_some(now, K.SETTLE_BUDGET)
flush_moves()
return {out, next_due, now, settling, paused}
