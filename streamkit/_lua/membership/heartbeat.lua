-- A member's heartbeat, and a look at the heartbeats of the members it watches (the
-- reaper's fast path, in the same call: a member costs Redis one call a tick, not two)
-- and at the group's state (gone after a FLUSHALL, a DEL or a restart that lost it: the
-- member rejoins within a heartbeat rather than at its next refresh).
-- allow-oom: Redis at maxmemory (noeviction) refuses SET, even on an existing key; a
-- member whose heartbeats are refused looks dead to the others. A heartbeat overwrites
-- one small key, so it is allowed past maxmemory; the look only reads.
--
-- FLAGS: allow-oom
-- KEYS: beat, state, watched... (the heartbeats of the members it watches)
-- TAG: {group}
-- ARGV: value, ttl (in ms)
-- REPLY: int (how many of the watched heartbeats exist; -1 if the group's state is gone)
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
-- One EXISTS for the state and the watched heartbeats: all there is the usual case.
local found = redis.call('EXISTS', unpack(KEYS, 2))
if found < #KEYS - 1 and redis.call('EXISTS', KEYS[2]) == 0 then
  return -1
end
return found - 1
