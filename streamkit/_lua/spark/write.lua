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

local key = KEYS[1]
local keep = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local first = 4
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', tonumber(ARGV[3])) then
  return {-1, 0}
end
--#include lib/append
return {#ids, dropped}
