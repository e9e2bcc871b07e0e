-- A member's heartbeat. allow-oom: Redis at maxmemory (noeviction) refuses SET, even on
-- an existing key; a member whose heartbeats are refused looks dead to the others. A
-- heartbeat overwrites one small key, so it is allowed past maxmemory.
--
-- FLAGS: allow-oom
-- KEYS: beat
-- TAG: {group}
-- ARGV: value, ttl (in ms)
-- REPLY: ok
return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
