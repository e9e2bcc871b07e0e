-- Releases a lease that is still ours.
--
-- KEYS: lock
-- TAG: {lock}
-- ARGV: value (the lease's, owner:token)
-- REPLY: {1} | {0, current: str | nil (the lock's value now)}

local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1}
end
return {0, current}
