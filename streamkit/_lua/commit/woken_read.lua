-- The fenced reads of quiet partitions, sent right behind the blocking XREAD that waits
-- for them (on its connection, so Redis runs it the moment the XREAD returns). Reads new
-- entries only ('>') and acknowledges nothing (the call may run long after it was sent:
-- a frozen worker's would acknowledge late). Per partition, -1 says it read nothing and
-- the caller is to read the partition the usual way: the read failed (which that read
-- reports), or entries were delivered to the reader unseen (which that read finds: see
-- lib/unseen).
--
-- KEYS: (stream, lock)... (per partition)
-- TAG: none (the partitions' keys are in many slots: only for a client of one server,
--   see streamkit._redis.run_blocking_between)
-- ARGV: group, count, (lease, consumer, seen)... (per partition; seen: the id of the
--   last entry its reader saw)
-- REPLY: [0 (the lease is not ours) | -1 (read it the usual way)
--   | {ids: [str], fields: [str], widths: int | [int]} (as commit/read's; empty when
--   nothing new came)]
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

local replies = {}
for p = 1, #KEYS / 2 do
  if redis.call('GET', KEYS[2 * p]) ~= ARGV[3 * p] then
    replies[p] = 0
  else
    local ok, reply = pcall(read, KEYS[2 * p - 1], ARGV[3 * p + 1], ARGV[3 * p + 2])
    replies[p] = ok and reply or -1
  end
end
return replies
