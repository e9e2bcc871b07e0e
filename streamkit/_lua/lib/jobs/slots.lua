-- Limits and pauses, what every script that ends or puts back a running job needs:
-- release_slots(id, name, lim, lk) gives back the concurrency slots it held, letting out
-- the jobs waiting for them; conc_keys, park_of, armed_as, parks_possible and conc_size
-- are shared with lib/jobs/limits (the claim's side), which sets ARMED and PARKS.
--
-- A job's 'lim' field holds its limits, its 'lk' field its limit key. A job over a limit
-- (or of a paused name) is held back: off its ready stream, in the park list of what
-- holds it, status 'held'; it is let out (queued again, marked 'up', which lets it past
-- the jobs still waiting) when the limit allows, by the release of a slot or by a
-- wake-up of its scope (the WAKE sorted set), or at resume.
--#include lib/jobs/shard
--#include lib/jobs/unpark

-- Set when a script armed a wake-up (a job was held back by a limit).
local ARMED = false

-- A job's limits: its 'lim' text, parsed once per call into {rate, window_ms, conc,
-- key_rate, key_window_ms, key_conc} (0: none), and the keys they keep their state
-- in, B .. ':rl:' .. SCOPE (a rate window) and B .. ':cc:' .. SCOPE (a concurrency
-- set), a scope being 'n:NAME' or 'k:NAME:KEY'. A call claims or finishes many jobs,
-- mostly of a few kinds: a name's keys are joined once per call, a limit key's once
-- per job, and nothing else is made on the usual path (parsing, the tables and the
-- strings made per job were a good part of a limited job's script time). The park
-- list, wake-up and reason of a scope, needed only when a job is held back, are worked
-- out from its key then (see park_of, armed_as).
local PARSED = {}
local function parsed(lim)
  local v = PARSED[lim]
  if not v then
    v = {}
    for x in string.gmatch(lim, '[^,]+') do v[#v + 1] = tonumber(x) end
    for i = 1, 6 do v[i] = v[i] or 0 end
    PARSED[lim] = v
  end
  return v
end
local NAMED = {[':rl:'] = {}, [':cc:'] = {}}
local function name_key(kind, name)
  local keys = NAMED[kind]
  local k = keys[name]
  if not k then
    k = B .. kind .. 'n:' .. name
    keys[name] = k
  end
  return k
end
-- The limits of a job: its parsed 'lim', then the keys of its concurrency sets (the
-- name's, the limit key's; nil where it has none).
local function conc_keys(name, lim, lk)
  local v = parsed(lim)
  local nc, kc
  if v[3] > 0 then nc = name_key(':cc:', name) end
  if lk and v[6] > 0 then kc = B .. ':cc:k:' .. name .. ':' .. lk end
  return v, nc, kc
end
-- Of the key of a limit's state: its wake-up and LIMS name ('cc:SCOPE', 'rl:SCOPE'),
-- and its park list.
local function armed_as(key) return string.sub(key, #B + 2) end
local function park_of(key) return B .. ':park:' .. string.sub(key, #B + 2) end

-- Whether a limit's park list may exist on this shard. A job held back by a limit
-- arms its scope's wake-up in WAKE, and a scope stays armed while its park list has
-- jobs (see wake_some): without WAKE, no limit holds a job back, and the checks of
-- park lists are skipped. Known once per call (the claim knows it from its first
-- EXISTS); a hold of this call arms WAKE (ARMED).
local PARKS = nil
local function parks_possible()
  if PARKS == nil then PARKS = redis.call('EXISTS', WAKE) == 1 end
  return PARKS or ARMED
end

-- What this call knows of the concurrency sets, kept up to date by its own writes (a
-- script runs alone): CONC[slots key], the size of a concurrency set (its SCARD, read
-- once).
local CONC = {}
local function conc_size(ck)
  local n = CONC[ck] or redis.call('SCARD', ck)
  CONC[ck] = n
  return n
end

-- Give back the concurrency slots a job held (it ended, failed, was put back or its
-- worker died), letting out as many jobs waiting for them as there are free slots.
-- A park list let out to its last job disarms its scope's wake-up at once, as the
-- wake-up would (nothing waits there), so that the calls after it find no WAKE (and
-- skip the checks of park lists) as soon as no limit holds a job back.
local function release_slot(id, ck, count)
  if ck and redis.call('SREM', ck, id) == 1 then
    if CONC[ck] then CONC[ck] = CONC[ck] - 1 end
    if parks_possible() then
      local pk = park_of(ck)
      if redis.call('EXISTS', pk) == 1 then
        local free = count - conc_size(ck)
        if free > 0 then
          unpark(pk, math.min(free, K.UNPARK_BUDGET))
          if redis.call('EXISTS', pk) == 0 then
            local as = armed_as(ck)
            redis.call('ZREM', WAKE, as)
            redis.call('HDEL', LIMS, as)
          end
        end
      end
    end
  end
end
local function release_slots(id, name, lim, lk)
  local v, nc, kc = conc_keys(name, lim, lk)
  release_slot(id, nc, v[3])
  release_slot(id, kc, v[6])
end
