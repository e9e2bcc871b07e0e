-- Extends many leases that are still ours, each as locks/extend does: a lock manager's
-- renewals due at the same moment go as one call (per slot on a cluster), not one each.
--
-- KEYS: lock... (one per lease)
-- TAG: none (on a single server the locks are in many slots; a cluster's client sends
--   the locks of one slot per call)
-- ARGV: ttl (in ms), value... (each lease's, owner:token, in the order of KEYS)
-- REPLY: [1 (extended) | {0, current: str | nil (the lock's value now)}] (per lease)

-- One MGET reads them all (a call per lease would cost Redis a conversion each: at
-- 4,096 partitions a fleet renews about 1,200 leases a second).
local ttl = ARGV[1]
local values = redis.call('MGET', unpack(KEYS))
local replies = {}
for i, lock in ipairs(KEYS) do
  local current = values[i]
  if current == ARGV[i + 1] then
    redis.call('PEXPIRE', lock, ttl)
    replies[i] = 1
  else
    replies[i] = {0, current}
  end
end
return replies
