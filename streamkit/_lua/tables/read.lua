-- Reads keys of a table whose keys expire: their values, nil for a key that is missing
-- or expired (its deadline in the expiry index at or before Redis's clock), swept yet
-- or not. Every reader outside the processor reads such a table through this.
--
-- KEYS: table, expiry
-- TAG: {partition}
-- ARGV: field... (at least one)
-- REPLY: [str | nil] (one per field, in order)
--#include lib/clock

local values = redis.call('HMGET', KEYS[1], unpack(ARGV))
local deadlines = redis.call('ZMSCORE', KEYS[2], unpack(ARGV))
local now = now_ms()
for i = 1, #ARGV do
  if deadlines[i] and tonumber(deadlines[i]) <= now then values[i] = false end
end
return values
