-- Whether a consumer group has processed every entry of a stream: none delivered and
-- not yet acknowledged, none not yet delivered (a join asks it of its forwarders' groups
-- on their partitions: see streamkit._state_join_sides), and the server's clock then.
--
-- KEYS: stream
-- TAG: {partition}
-- ARGV: group
-- REPLY: {caught_up: int (1: every entry acknowledged by the group, or no entries;
--   else 0, also when the group does not exist yet), now: int (the server's clock, ms)}
--#include lib/clock
--#include lib/stream_ids

local now = now_ms()
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
if newest == nil then return {1, now} end
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for j = 1, #group, 2 do info[group[j]] = group[j + 1] end
  if info['name'] == ARGV[1] then
    if info['pending'] > 0 then return {0, now} end
    local dms, dseq = parse_id(info['last-delivered-id'])
    local lms, lseq = parse_id(newest[1])
    local behind = dms < lms or (dms == lms and dseq < lseq)
    return {behind and 0 or 1, now}
  end
end
return {0, now}
