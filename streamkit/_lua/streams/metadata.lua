-- Records a new stream's metadata; returns what is recorded otherwise.
--
-- KEYS: meta
-- TAG: {stream}
-- ARGV: (field, value)...
-- REPLY: [str] (empty: recorded now; else the fields and values recorded, flat)

if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
  return {}
end
return redis.call('HGETALL', KEYS[1])
