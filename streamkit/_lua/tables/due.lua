-- The keys of a table due to expire at a time (for the processor's sweep, which deletes
-- them with its commit), never beyond Redis's clock: up to count keys whose deadline is
-- at or before min(clock, now), and the earliest deadline after them.
--
-- KEYS: expiry
-- TAG: {partition}
-- ARGV: clock (ms), count
-- REPLY: {due: [str], next: str | nil} (due: field, deadline, ...; next: the earliest
--   deadline not returned, nil when none)
--#include lib/clock

local bound = math.min(tonumber(ARGV[1]), now_ms())
local due = redis.call('ZRANGE', KEYS[1], '-inf', bound, 'BYSCORE', 'LIMIT', 0, ARGV[2],
                       'WITHSCORES')
local after = redis.call('ZRANGE', KEYS[1], '(' .. bound, '+inf', 'BYSCORE', 'LIMIT', 0, 1,
                         'WITHSCORES')
if #due >= 2 * tonumber(ARGV[2]) then
  -- More may be due: the next is due now.
  return {due, tostring(bound)}
end
return {due, after[2] or false}
