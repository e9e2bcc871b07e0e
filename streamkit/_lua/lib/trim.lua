-- Trimming a stream, never below the oldest entry some consumer group still needs:
-- parse(id) and less(a, b) read and compare entry ids; oldest_needed(stream) is the
-- lowest id some group still needs; trim_processed(stream, length, keep, done) trims what
-- every group processed. Appends trim, and so do acknowledgements, so that consuming
-- frees memory even while Redis is too full to append (XTRIM and XACK are allowed then;
-- XADD is not).

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
                 math.min(length - keep, done + K.TRIM_PROCESSED_STEP))
    end
  end
end
