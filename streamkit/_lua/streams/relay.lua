-- Relays records a processor emitted on Redis Cluster from its partition's outbox to
-- their target partition, exactly once. The relay marker holds the last outbox id relayed
-- from that source to that target: entries at or below it were relayed before and are
-- skipped. Each entry: its outbox id, field count, names and values, in outbox order.
--
-- KEYS: stream (the target partition's), relayed (the relay marker)
-- TAG: {partition} (the target's)
-- ARGV: keep (entries to keep when trimming; 0: do not trim), entry...
-- REPLY: int (the number appended)

local key = KEYS[1]

local function parse(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end

local function less(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  return ams < bms or (ams == bms and aseq < bseq)
end

-- The lowest id some consumer group still needs: its oldest pending entry, or the
-- entry after the last one it was delivered. nil when no group reads the stream.
local function oldest_needed(stream)
  local needed = nil
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local info = {}
    for j = 1, #group, 2 do info[group[j]] = group[j + 1] end
    local candidate
    if info['pending'] > 0 then
      candidate = redis.call('XPENDING', stream, info['name'])[2]
    else
      local ms, seq = parse(info['last-delivered-id'])
      candidate = string.format('%d-%d', ms, seq + 1)
    end
    if needed == nil or less(candidate, needed) then needed = candidate end
  end
  return needed
end

-- Trims what every consumer group of `stream` has processed, down to no fewer than
-- `keep` entries; `length` is the stream's length now. Removes at most `done` (the
-- entries this call appended or acknowledged) plus a step: bounded work per call, and
-- never slower than the partition fills.
local function trim_processed(stream, length, keep, done)
  if keep > 0 and length > keep then
    local needed = oldest_needed(stream)
    if needed ~= nil then
      redis.call('XTRIM', stream, 'MINID', '~', needed, 'LIMIT',
                 math.min(length - keep, done + 50000))
    end
  end
end

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
