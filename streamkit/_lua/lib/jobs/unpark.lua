-- unpark(pk, count): let out jobs held in a park list.
--#include lib/jobs/record
--#include lib/jobs/queue

-- Let out up to count jobs held in park list pk (queued again, in order); items of
-- jobs no longer held there (aborted meanwhile, say) are dropped on the way.
local function unpark(pk, count)
  local moved, left = 0, count + 20
  while moved < count and left > 0 do
    local item = redis.call('LPOP', pk)
    if not item then break end
    left = left - 1
    local id, gen = string.match(item, '^(.*)|(%d+)$')
    if id then
      local k = jkey(id)
      local f = redis.call('HMGET', k, 'status', 'name', 'tries', 'pk')
      if f[1] == 'held' and f[4] == gen then
        redis.call('HSET', k, 'up', 1)
        redis.call('HDEL', k, 'held')
        local status = 'sent'
        if tonumber(f[3] or '0') > 0 then status = 'retry' end
        push(id, k, f[2], 'held', status)
        moved = moved + 1
      end
    end
  end
  return moved
end
