-- Who holds a lock, and for how long still.
--
-- KEYS: lock
-- TAG: {lock}
-- ARGV: none
-- REPLY: {value: str | nil, ttl: int (in ms; -2: not held, -1: no TTL)}

return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
