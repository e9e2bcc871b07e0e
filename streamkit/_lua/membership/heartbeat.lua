-- A member's heartbeat, and a look at the heartbeats of the members it watches (the
-- reaper's fast path, in the same call: a member costs Redis one call a tick, not two).
-- allow-oom: Redis at maxmemory (noeviction) refuses SET, even on an existing key; a
-- member whose heartbeats are refused looks dead to the others. A heartbeat overwrites
-- one small key, so it is allowed past maxmemory; the look only reads.
--
-- FLAGS: allow-oom
-- KEYS: beat, watched... (the heartbeats of the members it watches)
-- TAG: {group}
-- ARGV: value, ttl (in ms)
-- REPLY: int (how many of the watched heartbeats exist)
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if #KEYS < 2 then
  return 0
end
return redis.call('EXISTS', unpack(KEYS, 2))
