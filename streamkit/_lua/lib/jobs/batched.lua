-- batch_moves() and flush_moves(): a script that moves many jobs (the claim, the finish,
-- the enqueue) batches its moves and its events: after batch_moves(), moves are summed
-- per counter and applied once per call, in the order first moved (two HINCRBYs a job
-- were a fifth of a no-op job's script time), and the call's events are one entry of the
-- event stream; flush_moves(), before the script returns, writes both. Sets the state
-- of lib/jobs/counters and lib/jobs/events.
--#include lib/jobs/counters
--#include lib/jobs/events

local function batch_moves()
  BATCH = true
  EVENTS_BATCH = true
end
local function flush_moves()
  for _, field in ipairs(MOVED) do redis.call('HINCRBY', COUNTS, field, MOVES[field]) end
  MOVES, MOVED = {}, {}
  flush_events()
end
