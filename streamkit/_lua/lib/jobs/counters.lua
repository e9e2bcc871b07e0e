-- bump(field, by) and move(name, from, to): the counters of jobs per status and name.
--#include lib/jobs/shard

-- The counters (COUNTS, a field per status|name). move() applies each move at once,
-- unless the script batches its moves (lib/jobs/batched: batch_moves(), then
-- flush_moves() before it returns).
local BATCH = false
local MOVES, MOVED = {}, {}
local function bump(field, by)
  if not BATCH then
    redis.call('HINCRBY', COUNTS, field, by)
  elseif MOVES[field] then
    MOVES[field] = MOVES[field] + by
  else
    MOVES[field] = by
    MOVED[#MOVED + 1] = field
  end
end
local function move(name, from, to)
  if from then bump(from .. '|' .. name, -1) end
  if to then bump(to .. '|' .. name, 1) end
end
