-- Moves a processor's consumer group on one partition: forgets the group (and its
-- pending entries) and creates it again at a position, creating the stream if it does
-- not exist yet; to rebuild the processor's state, deletes its state of the partition
-- (tables, windows and their windows' hashes, watermark, outbox) in the same step. A
-- lease held on the partition (a worker running it) is taken in the same step: the lock
-- gets a value of the reset's own, with a fresh fencing token, for what was left of the
-- lease, so the holder's next fenced read, commit or extension is refused and it starts
-- the partition again once the lock is free, from the new position and the state as
-- Redis holds it (a running worker's cached values and watermark never meet the
-- replay). One atomic step per partition; running it twice leaves the same state.
--
-- KEYS: stream, lock, fence (the lock's fencing counter), state... (the keys of the
--   state to delete: first the windows indexes, as many as ARGV windows, whose windows'
--   hashes go too)
-- TAG: {partition}
-- ARGV: group, after ('$', or the id of the last entry to count as delivered),
--   entries_read (-1: unknown), owner (the owner the lock is taken as), windows (the
--   number of windows indexes in KEYS), (values_prefix, closed_prefix)... (per index:
--   its windows' hashes are the prefix and each window's start)
-- REPLY: {deleted: int (the keys deleted), taken: int (1: a held lease was taken)}

local stream, lock, fence, group = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
if redis.call('EXISTS', stream) == 1 then
  redis.call('XGROUP', 'DESTROY', stream, group)
end
local entries_read = tonumber(ARGV[3])
if entries_read >= 0 then
  redis.call('XGROUP', 'CREATE', stream, group, ARGV[2], 'MKSTREAM', 'ENTRIESREAD', entries_read)
else
  redis.call('XGROUP', 'CREATE', stream, group, ARGV[2], 'MKSTREAM')
end

local taken = 0
local left = redis.call('PTTL', lock)
if left > 0 then
  -- The holder's lease ends within `left` at the latest: the lock stays the reset's
  -- until then, so no one can think the old lease still valid once it is free again.
  local token = redis.call('INCR', fence)
  redis.call('SET', lock, ARGV[4] .. ':' .. token, 'PX', left)
  taken = 1
end

local deleted = 0
local windows = tonumber(ARGV[5])
local state = 3
for i = 1, windows do
  local index = KEYS[state + i]
  local values, closed = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  for _, member in ipairs(redis.call('ZRANGE', index, 0, -1)) do
    local start = string.match(member, '^(%d+)')
    deleted = deleted + redis.call('UNLINK', values .. start, closed .. start)
  end
end
for i = state + 1, #KEYS do deleted = deleted + redis.call('UNLINK', KEYS[i]) end
return {deleted, taken}
