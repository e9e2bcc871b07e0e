-- batch_moves() and flush_moves(): a script that moves many jobs (the claim, the finish)
-- batches its moves: after batch_moves(), they are summed per counter and applied once
-- per call, by flush_moves() before it returns, in the order first moved (two HINCRBYs a
-- job were a fifth of a no-op job's script time). Sets the state of lib/jobs/counters.
--#include lib/jobs/counters

local function batch_moves() BATCH = true end
local function flush_moves()
  for _, field in ipairs(MOVED) do redis.call('HINCRBY', COUNTS, field, MOVES[field]) end
  MOVES, MOVED = {}, {}
end
