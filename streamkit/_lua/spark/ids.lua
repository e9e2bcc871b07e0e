-- The ids of a range of a partition: planning a limited micro-batch must not ship the
-- entries' payloads. Sent as a plain EVAL: redis-py's cluster pipelines refuse EVALSHA.
--
-- KEYS: stream
-- TAG: {partition}
-- ARGV: low, high (XRANGE's bounds), count
-- REPLY: [str]

local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[2], 'COUNT', ARGV[3])
local ids = {}
for i, entry in ipairs(entries) do ids[i] = entry[1] end
return ids
