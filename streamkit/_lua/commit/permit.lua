-- The fence of a read sent as plain commands (the fetcher's fast read): run inside the
-- MULTI/EXEC transaction `MULTI, this, XREADGROUP ... STREAMS stream permit > >, DEL
-- permit, XREVRANGE stream + - COUNT 1, EXEC`. If the lease is ours, it acknowledges
-- the consumer's finished events (trimming what every group processed) and creates the
-- permit: an empty stream with the consumer group, which the XREADGROUP names beside
-- the partition's stream. Redis checks every stream of an XREADGROUP for the group
-- before it reads any, so without the permit the read fails (NOGROUP) having delivered
-- nothing; the DEL behind it removes the permit in the same transaction. Whatever goes
-- wrong with this script (not ours, not loaded, refused), there is no permit and the
-- read changes nothing: the fence holds by the permit's absence. The XREADGROUP's reply
-- comes from Redis directly, not through Lua, which would convert every entry twice.
-- Entries delivered to the consumer after the last one its reader saw (see lib/unseen)
-- are read from the history by the usual read (commit/read): no permit then either.
--
-- KEYS: stream, lock, permit
-- TAG: {partition}
-- ARGV: lease, group, consumer, seen (the id of the last entry the reader saw), keep
--   (entries to keep when trimming; 0: do not trim), acks (the number of ids to
--   acknowledge), id...
-- REPLY: -1 (the lease is not ours: nothing acknowledged, no permit)
--   | {acked: int, permit: int (1: made; 0: entries were delivered unseen, read them
--   the usual way)}
--#include lib/trim
--#include lib/unseen

local key, permit, group = KEYS[1], KEYS[3], ARGV[2]
-- (A permit is never left behind by a transaction; if one ever were, it goes now.)
redis.call('DEL', permit)
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end

local acks = tonumber(ARGV[6])
local acked = 0
if acks > 0 then
  acked = redis.call('XACK', key, group, unpack(ARGV, 7, 6 + acks))
  trim_processed(key, redis.call('XLEN', key), tonumber(ARGV[5]), acks)
end
if unseen_from(key, group, ARGV[3], ARGV[4]) ~= '>' then return {acked, 0} end
redis.call('XGROUP', 'CREATE', permit, group, '$', 'MKSTREAM')
return {acked, 1}
