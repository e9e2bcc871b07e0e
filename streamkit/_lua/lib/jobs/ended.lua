-- remove_ended(p, ids): acknowledge the entries `ids` of ready stream Q[p] (of jobs
-- that ended) and remove them. Every acknowledged entry of a ready stream is removed in
-- the call that acknowledges it, so the entries older than the oldest pending one (or,
-- with none pending, up to the last one delivered) are all acknowledged: those are
-- trimmed off the stream's head (XTRIM MINID), the others deleted (XDEL). An XDEL at
-- the head makes Redis look for the new first entry past every deleted one of its node:
-- it was a finish's most costly command.
--#include lib/jobs/shard
--#include lib/stream_ids

-- The id of the last entry the group delivered from stream q.
local function last_delivered(q)
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', q)) do
    local fields = {}
    for i = 1, #group, 2 do fields[group[i]] = group[i + 1] end
    if fields['name'] == GROUP then return fields['last-delivered-id'] end
  end
  return '0-0'
end

local function remove_ended(p, ids)
  local q = Q[p]
  redis.call('XACK', q, GROUP, unpack(ids))
  local oldest = redis.call('XPENDING', q, GROUP, '-', '+', 1)[1]
  local bound_ms, bound_seq
  if oldest then
    bound_ms, bound_seq = parse_id(oldest[1])
  else
    bound_ms, bound_seq = parse_id(last_delivered(q))
    bound_seq = bound_seq + 1
  end
  local rest = {}
  for _, e in ipairs(ids) do
    local ms, seq = parse_id(e)
    if ms > bound_ms or (ms == bound_ms and seq >= bound_seq) then rest[#rest + 1] = e end
  end
  redis.call('XTRIM', q, 'MINID', string.format('%d-%d', bound_ms, bound_seq))
  if #rest > 0 then redis.call('XDEL', q, unpack(rest)) end
end
