-- The shard's counters, and per priority the length of its ready stream and how many of
-- its pending entries belong to running jobs (the rest are queued): read in steps of at
-- most `budget` pending entries. A cursor: '-' to start, the last entry id read, '' when
-- done.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, budget, cursor_high, cursor_normal, cursor_low
-- REPLY: {counters: [str] (a flat hash), lengths: [int], running: [int], cursors: [str]}
--#include lib/jobs/record
--#include lib/jobs/pending

local lengths, running = {}, {}
for p = 1, 3 do lengths[p], running[p] = redis.call('XLEN', Q[p]), 0 end
-- entries of running jobs are pending in the group; a job put back by a graceful
-- stop is pending too, but queued
local cursors = page_pending(2, tonumber(ARGV[2]), nil, function(p, _, id)
  if id and redis.call('HGET', jkey(id), 'status') == 'executing' then
    running[p] = running[p] + 1
  end
end)
return {redis.call('HGETALL', COUNTS), lengths, running, cursors}
