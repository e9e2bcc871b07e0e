-- page_pending(first, budget, consumer, each): read the ready streams' pending entries
-- in steps (jobs/counts, jobs/recover).
--#include lib/jobs/shard

-- Read each priority's pending entries (a consumer's only, if given) in steps: from
-- its cursor in ARGV[first + p] ('-' to start, the last entry id read, '' when done),
-- at most budget entries in all, calling each(p, e, id) per entry (id nil for an
-- entry gone from the stream). Returns the cursors to go on from.
local function page_pending(first, budget, consumer, each)
  local cursors = {}
  for p = 1, 3 do
    local cursor = ARGV[first + p]
    cursors[p] = cursor
    if cursor ~= '' and budget > 0 then
      local start = '-'
      if cursor ~= '-' then start = '(' .. cursor end
      local pending
      if consumer then
        pending = redis.pcall('XPENDING', Q[p], GROUP, start, '+', budget, consumer)
      else
        pending = redis.pcall('XPENDING', Q[p], GROUP, start, '+', budget)
      end
      if type(pending) ~= 'table' or pending.err then pending = {} end
      for _, item in ipairs(pending) do
        local e = item[1]
        local entry = redis.call('XRANGE', Q[p], e, e)[1]
        each(p, e, entry and entry[2][2])
      end
      if #pending < budget then cursors[p] = '' else cursors[p] = pending[#pending][1] end
      budget = budget - #pending
    end
  end
  return cursors
end
