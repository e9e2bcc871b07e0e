-- One page of a table whose keys expire (HSCAN from a cursor), without the keys expired
-- by Redis's clock (see tables/read).
--
-- KEYS: table, expiry
-- TAG: {partition}
-- ARGV: cursor, count
-- REPLY: {cursor: str, items: [str]} (items: field, value, ...; cursor '0': the last)
--#include lib/clock

local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local items = page[2]
if #items == 0 then return {page[1], items} end
local fields = {}
for i = 1, #items, 2 do fields[#fields + 1] = items[i] end
local deadlines = redis.call('ZMSCORE', KEYS[2], unpack(fields))
local now = now_ms()
local kept = {}
for i = 1, #fields do
  if not (deadlines[i] and tonumber(deadlines[i]) <= now) then
    kept[#kept + 1] = items[2 * i - 1]
    kept[#kept + 1] = items[2 * i]
  end
end
return {page[1], kept}
