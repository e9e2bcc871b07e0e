-- Appends one chunk of a Spark write, once: claims the chunk's marker first, and appends
-- nothing if it was there (the chunk was written before). The appending and trimming is
-- the producer's (lib/append), unchanged.
--
-- KEYS: stream, marker (the chunk's, see streamkit.spark._writer)
-- TAG: {partition}
-- ARGV: keep (partition_size), cap (max_len; 0: none), ttl (the marker's, in seconds),
--   entry... (see lib/append)
-- REPLY: {appended: int (-1: the marker was there), dropped: int (unprocessed entries
--   the hard cap dropped)}
--#include lib/append

if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', tonumber(ARGV[3])) then
  return {-1, 0}
end
local ids, dropped = append_and_trim(KEYS[1], 4, tonumber(ARGV[1]), tonumber(ARGV[2]))
return {#ids, dropped}
