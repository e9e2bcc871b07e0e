-- Renews the claims of running jobs.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, consumer, (id, token)...
-- REPLY: {lost: [str] (ids), aborts: [{id: str, reason: str}]}
--#include lib/jobs/record

local consumer = ARGV[2]
local lost, aborts = {}, {}
for a = 3, #ARGV, 2 do
  local id, token = ARGV[a], ARGV[a + 1]
  local f = redis.call('HMGET', jkey(id), 'owner', 'prio', 'entry', 'abort')
  if f[1] == token and f[3] and f[3] ~= '' then
    redis.call('XCLAIM', Q[tonumber(f[2]) + 1], GROUP, consumer, 0, f[3], 'JUSTID')
    if f[4] then table.insert(aborts, {id, f[4]}) end
  else
    table.insert(lost, id)
  end
end
return {lost, aborts}
