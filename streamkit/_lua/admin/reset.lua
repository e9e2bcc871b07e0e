-- Forgets a consumer group (and its pending entries) and creates it again at a
-- position, creating the stream if it does not exist yet: one atomic step per partition,
-- and running it twice leaves the same state.
--
-- KEYS: stream
-- TAG: {partition}
-- ARGV: group, position ('0' or '$')
-- REPLY: 1

if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('XGROUP', 'DESTROY', KEYS[1], ARGV[1])
end
redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], ARGV[2], 'MKSTREAM')
return 1
