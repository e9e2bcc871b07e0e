-- append_and_trim(key, first, keep, cap): appends the entries given in ARGV from index
-- `first` on (each: field count, then names and values; or a run of single-field
-- entries: minus their number, the field's name, then each one's value) to the stream
-- `key`, then trims it: never below the oldest entry a consumer group still needs (down
-- to no fewer than `keep` entries), unless the hard cap `cap` (0 = none) says otherwise.
-- Returns the new ids, and the number of unprocessed entries the cap dropped. Shared by
-- the producer (streams/append) and the Spark writer (spark/write), so both append
-- exactly alike.
--#include lib/trim

local function append_and_trim(key, first, keep, cap)
  local ids = {}
  local n = 0
  local i = first
  local last = #ARGV
  local call = redis.call
  while i <= last do
    local count = tonumber(ARGV[i])
    if count > 0 then
      n = n + 1
      ids[n] = call('XADD', key, '*', unpack(ARGV, i + 1, i + 2 * count))
      i = i + 1 + 2 * count
    else
      -- A run: -count entries of one field, its name once, then each one's value.
      local field = ARGV[i + 1]
      for j = i + 2, i + 1 - count do
        n = n + 1
        ids[n] = call('XADD', key, '*', field, ARGV[j])
      end
      i = i + 2 - count
    end
  end

  local dropped = 0
  local length = redis.call('XLEN', key)
  if cap > 0 and length > cap then
    -- The oldest entries over the cap go, at most as many as were appended plus the
    -- trim step (a partition far over its cap comes down over several calls); each
    -- that some consumer group still needs is counted as dropped.
    local excess = math.min(length - cap, #ids + K.TRIM_STEP)
    local oldest = redis.call('XRANGE', key, '-', '+', 'COUNT', excess + 1)
    local needed = oldest_needed(key)
    for j = 1, excess do
      if needed == nil or not less(oldest[j][1], needed) then dropped = dropped + 1 end
    end
    -- Exactly the `excess` entries before the first one kept.
    redis.call('XTRIM', key, 'MINID', oldest[excess + 1][1])
  else
    trim_processed(key, length, keep, #ids)
  end
  return ids, dropped
end
