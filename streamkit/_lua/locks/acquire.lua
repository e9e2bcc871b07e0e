-- Takes a lock that nobody holds, with a fresh fencing token. allow-oom: Redis at
-- maxmemory (noeviction) refuses INCR and SET, and a partition nobody can lock is a
-- backlog nobody can drain (draining is what frees memory). A lock is two small keys per
-- partition, so taking one is allowed past maxmemory. (Extending uses PEXPIRE and
-- releasing DEL, which Redis never refuses for memory.)
--
-- FLAGS: allow-oom
-- KEYS: lock, fence
-- TAG: {lock}
-- ARGV: owner, ttl (in ms)
-- REPLY: {1, token: int} (acquired) | {0, ttl: int (the holder's, in ms; -1: none)}
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  return {0, pttl}
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
return {1, token}
