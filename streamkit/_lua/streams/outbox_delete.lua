-- Deletes relayed entries from an outbox, fenced.
--
-- KEYS: outbox, lock
-- TAG: {partition}
-- ARGV: lease, id...
-- REPLY: -1 (the lease is not ours) | int (the number deleted)

if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
return redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
