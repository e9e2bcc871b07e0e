-- The fenced read, which commits first: checks the lease, applies the changes and
-- acknowledges the consumer's finished events (trimming what every group processed),
-- then reads the pending entries after a history id (a takeover's), or new entries.
-- `start` is a history id, or '>' followed by the id of the last entry the reader saw,
-- for new entries (see lib/unseen). The entries' field lists come flat, one after the
-- other, in `fields`, and in `widths` the length of each (a number when every entry has
-- the same): a flat reply is cheaper to build for Redis and to parse for the client than
-- one array per entry.
--
-- KEYS: stream, lock, written... (the keys the changes write)
-- TAG: {partition}
-- ARGV: lease, group, consumer, count, start, keep (entries to keep when trimming; 0: do
--   not trim), acks (the number of ids to acknowledge), id..., change... (see
--   streamkit._commit)
-- REPLY: 0 (the lease is not ours: nothing read, written or acknowledged)
--   | {ids: [str], fields: [str], widths: int | [int], counts: [int] (delivery counts,
--   history only), next: str (the start id to read from next), last: str (the stream's
--   last id, if idle; else "")}
--#include lib/trim
--#include lib/changes
--#include lib/flat
--#include lib/unseen

if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
local key, group, consumer, count = KEYS[1], ARGV[2], ARGV[3], ARGV[4]

local acks = tonumber(ARGV[7])
apply_changes(8 + acks)
if acks > 0 then
  redis.call('XACK', key, group, unpack(ARGV, 8, 7 + acks))
  trim_processed(key, redis.call('XLEN', key), tonumber(ARGV[6]), acks)
end

local function read(id)
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
                           'STREAMS', key, id)
  if reply then return reply[1][2] end
  return {}
end

local start = ARGV[5]
if string.sub(start, 1, 1) == '>' then
  start = unseen_from(key, group, consumer, string.sub(start, 2))
end
if start ~= '>' then
  local raw = read(start)
  if #raw > 0 then
    local live, gone = {}, {}
    for _, entry in ipairs(raw) do
      if entry[2] then live[#live + 1] = entry else gone[#gone + 1] = entry[1] end
    end
    -- Deleted while pending: nothing left to process.
    if #gone > 0 then redis.call('XACK', key, group, unpack(gone)) end
    local counts = {}
    if #live > 0 then
      local by_id = {}
      local pending = redis.call('XPENDING', key, group, live[1][1], live[#live][1],
                                 #live, consumer)
      for _, p in ipairs(pending) do by_id[p[1]] = p[4] end
      for i, entry in ipairs(live) do counts[i] = by_id[entry[1]] or 1 end
    end
    local ids, fields, widths = flat(live)
    return {ids, fields, widths, counts, raw[#raw][1], ''}
  end
end

local entries = read('>')
if #entries > 0 then
  local ids, fields, widths = flat(entries)
  return {ids, fields, widths, {}, '>', ''}
end
local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
local last_id = '0-0'
if last[1] then last_id = last[1][1] end
return {{}, {}, 0, {}, '>', last_id}
