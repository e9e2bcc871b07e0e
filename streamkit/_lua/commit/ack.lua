-- The fenced commit: applies the changes and acknowledges the consumer's finished events
-- (trimming what every group processed), if the lease is ours.
--
-- KEYS: stream, lock, written... (the keys the changes write)
-- TAG: {partition}
-- ARGV: lease, group, keep (entries to keep when trimming; 0: do not trim), acks (the
--   number of ids to acknowledge), id..., change... (see streamkit._commit)
-- REPLY: -1 (the lease is not ours: nothing written or acknowledged)
--   | int (the number acknowledged)
--#include lib/trim
--#include lib/changes

if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
local key = KEYS[1]

local acks = tonumber(ARGV[4])
apply_changes(5 + acks)
local acked = 0
if acks > 0 then
  acked = redis.call('XACK', key, ARGV[2], unpack(ARGV, 5, 4 + acks))
  trim_processed(key, redis.call('XLEN', key), tonumber(ARGV[3]), acks)
end
return acked
