-- Relays records a processor emitted on Redis Cluster from its partition's outbox to
-- their target partition, exactly once. The relay marker holds the last outbox id relayed
-- from that source to that target: entries at or below it were relayed before and are
-- skipped. Each entry: its outbox id, field count, names and values, in outbox order.
--
-- KEYS: stream (the target partition's), relayed (the relay marker)
-- TAG: {partition} (the target's)
-- ARGV: keep (entries to keep when trimming; 0: do not trim), entry...
-- REPLY: int (the number appended)
--#include lib/trim

local key = KEYS[1]
local last = redis.call('GET', KEYS[2]) or '0-0'
local newest = last
local appended = 0
local i = 2
while i <= #ARGV do
  local id, count = ARGV[i], tonumber(ARGV[i + 1])
  if less(last, id) then
    redis.call('XADD', key, '*', unpack(ARGV, i + 2, i + 1 + 2 * count))
    appended = appended + 1
    newest = id
  end
  i = i + 2 + 2 * count
end
if newest ~= last then redis.call('SET', KEYS[2], newest) end
trim_processed(key, redis.call('XLEN', key), tonumber(ARGV[1]), appended)
return appended
