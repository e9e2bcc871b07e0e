-- How many entries of a stream come after an entry id (a consumer group's last
-- delivered one), counted up to a limit: a group's lag where Redis's own cannot be
-- trusted (a restart from the AOF can leave Redis 7.0's entries-read counter at 0, and
-- the lag it derives from it too high for good). Counted here, not in the client, so
-- that no entry crosses the network.
--
-- KEYS: stream
-- TAG: {partition}
-- ARGV: after (an entry id), limit (the most entries counted)
-- REPLY: int (the entries after it, at most limit)

return #redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
