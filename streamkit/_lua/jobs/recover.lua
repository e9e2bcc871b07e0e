-- Hands back the jobs a worker holds but does not run: those of a claim whose reply was
-- lost (the connection dropped, Redis restarted), or claimed and not started when it
-- stopped. Their tries are not spent; they are left for any worker to claim at once.
-- Reads at most `budget` of the worker's pending entries (cursors as for jobs/counts).
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, consumer, lease_ms, budget, cursor_high, cursor_normal, cursor_low,
--   running... (the ids of the jobs it runs)
-- REPLY: {handed_back: int, cursors: [str]}
--#include lib/jobs/record
--#include lib/jobs/pending
--#include lib/jobs/slots

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
