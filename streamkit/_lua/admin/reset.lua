-- Moves a processor's consumer group on one partition: forgets the group (and its
-- pending entries) and creates it again at a position, creating the stream if it does
-- not exist yet; to rebuild the processor's state, deletes its state of the partition
-- (tables, windows and their windows' hashes, watermark, outbox) in the same step. One
-- atomic step per partition; running it twice leaves the same state.
--
-- KEYS: stream, state... (the keys of the state to delete: first the windows indexes,
--   as many as ARGV windows, whose windows' hashes go too)
-- TAG: {partition}
-- ARGV: group, after ('$', or the id of the last entry to count as delivered),
--   entries_read (-1: unknown), windows (the number of windows indexes in KEYS),
--   (values_prefix, closed_prefix)... (per index: its windows' hashes are the prefix
--   and each window's start)
-- REPLY: int (the keys deleted)

local stream, group = KEYS[1], ARGV[1]
if redis.call('EXISTS', stream) == 1 then
  redis.call('XGROUP', 'DESTROY', stream, group)
end
local entries_read = tonumber(ARGV[3])
if entries_read >= 0 then
  redis.call('XGROUP', 'CREATE', stream, group, ARGV[2], 'MKSTREAM', 'ENTRIESREAD', entries_read)
else
  redis.call('XGROUP', 'CREATE', stream, group, ARGV[2], 'MKSTREAM')
end

local deleted = 0
local windows = tonumber(ARGV[4])
for i = 1, windows do
  local index = KEYS[1 + i]
  local values, closed = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  for _, member in ipairs(redis.call('ZRANGE', index, 0, -1)) do
    local start = string.match(member, '^(%d+)')
    deleted = deleted + redis.call('UNLINK', values .. start, closed .. start)
  end
end
for i = 2, #KEYS do deleted = deleted + redis.call('UNLINK', KEYS[i]) end
return deleted
