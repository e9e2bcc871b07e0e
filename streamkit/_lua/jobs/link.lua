-- Links jobs to jobs on this shard that they depend on, from another shard or queue.
-- Per pair, the answer: {"linked"} (its end will be delivered to the dependent),
-- {"unknown"}, or, for a dependency already over, {status, result or failure, detail,
-- cause} (see handed), which the dependent's enqueue takes in.
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, (dependency, dependent)... (the dependent: JSON [queue, shard, id])
-- REPLY: [{str} | {status: str, data: str, detail: str, cause: str}]
--#include lib/jobs/handed

local out = {}
for a = 2, #ARGV, 2 do
  local x, member = ARGV[a], ARGV[a + 1]
  local k = jkey(x)
  local st = redis.call('HGET', k, 'status')
  if not st then
    out[#out + 1] = {'unknown'}
  elseif FINAL[st] then
    local data, detail, cause = handed(x, st == 'success', st)
    out[#out + 1] = {st, data, detail or '', cause or ''}
  else
    redis.call('SADD', B .. ':xdeps:' .. x, member)
    redis.call('HSET', k, 'dependents', 1)
    out[#out + 1] = {'linked'}
  end
end
return out
