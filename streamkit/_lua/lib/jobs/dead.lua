-- each_dead(act): act on the dead jobs named in ARGV[2..] (jobs/replay, jobs/purge).
--#include lib/jobs/record

-- For each id in ARGV[2..] whose job is dead: take it off the dead-letter stream and
-- call act(id, k, name). Returns those ids (replay and purge of dead jobs).
local function each_dead(act)
  local out = {}
  for a = 2, #ARGV do
    local id = ARGV[a]
    local k = jkey(id)
    local f = redis.call('HMGET', k, 'status', 'name', 'dead_entry')
    if f[1] == 'dead' then
      if f[3] then redis.call('XDEL', DEAD, f[3]) end
      act(id, k, f[2])
      table.insert(out, id)
    end
  end
  return out
end
