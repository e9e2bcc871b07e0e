-- The fenced reads of quiet partitions, sent right behind the blocking XREAD that waits
-- for them (on its connection, so Redis runs it the moment the XREAD returns). Reads new
-- entries only ('>') and acknowledges nothing (the call may run long after it was sent:
-- a frozen worker's would acknowledge late). Per partition, -1 says it read nothing and
-- the caller is to read the partition the usual way: the read failed (which that read
-- reports), or entries were delivered to the reader unseen (which that read finds: see
-- lib/unseen).
--
-- One XREAD first looks which partitions have entries after the last id their reader
-- knows (the wait's own ids): only those are read. A partition with nothing after it
-- has nothing new, nor anything delivered unseen (such entries would be newer than what
-- its reader knew when it went quiet), so a wait that times out costs Redis one look
-- for all its partitions, not three commands for each.
--
-- KEYS: (stream, lock)... (per partition)
-- TAG: none (the partitions' keys are in many slots: only for a client of one server,
--   see streamkit._redis.run_blocking_between)
-- ARGV: group, count, (lease, consumer, seen, last)... (per partition; seen: the id of
--   the last entry its reader saw; last: the id its wait waited after)
-- REPLY: [0 (the lease is not ours) | -1 (read it the usual way)
--   | {ids: [str], fields: [str], widths: int | [int]} (as commit/read's; empty when
--   nothing new came)] (per partition; none at all when nothing came in any)
--#include lib/flat
--#include lib/unseen

local group, count = ARGV[1], ARGV[2]
local function read(key, consumer, seen)
  if unseen_from(key, group, consumer, seen) ~= '>' then return -1 end
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
                           'STREAMS', key, '>')
  if not reply then return {{}, {}, 0} end
  local ids, fields, widths = flat(reply[1][2])
  return {ids, fields, widths}
end

local partitions = #KEYS / 2
local busy = {}
-- In looks of at most LOOK_STREAMS streams each: unpack() has a bound (about 8,000).
local LOOK_STREAMS = 1000
for first = 1, partitions, LOOK_STREAMS do
  local last = math.min(partitions, first + LOOK_STREAMS - 1)
  local look = {'XREAD', 'COUNT', 1, 'STREAMS'}
  for p = first, last do look[#look + 1] = KEYS[2 * p - 1] end
  for p = first, last do look[#look + 1] = ARGV[4 * p + 2] end
  for _, stream in ipairs(redis.call(unpack(look)) or {}) do busy[stream[1]] = true end
end

-- Nothing new anywhere (the wait timed out): an empty reply, not one per partition.
if next(busy) == nil then return {} end

local replies = {}
for p = 1, partitions do
  local key = KEYS[2 * p - 1]
  if not busy[key] then
    replies[p] = {{}, {}, 0}
  elseif redis.call('GET', KEYS[2 * p]) ~= ARGV[4 * p - 1] then
    replies[p] = 0
  else
    local ok, reply = pcall(read, key, ARGV[4 * p], ARGV[4 * p + 1])
    replies[p] = ok and reply or -1
  end
end
return replies
