-- job_event(id, name, kind, detail): a state change of job id (enqueued, started,
-- progress, retried, released, succeeded, dead, aborted, expired), appended to the
-- shard's event stream (B .. ':events'), unless the queue's events are off (B ..
-- ':evoff' exists; looked at once per call). An entry of one event has the fields j
-- (job id), n (name), e (kind) and d (detail, if any). A script that changes many jobs
-- batches its events (lib/jobs/batched): the events of one call are then one entry,
-- written by flush_events() before the script returns, its field b a JSON array of
-- id, name, kind and detail ('' for none) per event (an XADD per event cost a tenth of
-- a no-op job's script time; fields named per event cost most of that again). The
-- stream keeps about K.EVENTS_KEEP events: each append trims it to K.EVENTS_KEEP / (its
-- events) entries (MAXLEN ~).
--#include lib/jobs/shard

local EVENTS_ON = nil
local EVENTS_BATCH = false
-- The batched events, four values each, and how many events they hold.
local EV, EVN = {}, 0
-- An entry holds at most this many events.
local EV_MAX = 1000

local function flush_events()
  if EVN == 0 then return end
  redis.call('XADD', B .. ':events', 'MAXLEN', '~', math.ceil(K.EVENTS_KEEP / EVN), '*',
    'b', cjson.encode(EV))
  EV, EVN = {}, 0
end

local function job_event(id, name, kind, detail)
  if EVENTS_ON == nil then EVENTS_ON = redis.call('EXISTS', B .. ':evoff') == 0 end
  if not EVENTS_ON then return end
  if not EVENTS_BATCH then
    if detail then
      redis.call('XADD', B .. ':events', 'MAXLEN', '~', K.EVENTS_KEEP, '*', 'j', id, 'n',
        name, 'e', kind, 'd', detail)
    else
      redis.call('XADD', B .. ':events', 'MAXLEN', '~', K.EVENTS_KEEP, '*', 'j', id, 'n',
        name, 'e', kind)
    end
    return
  end
  local n = EVN * 4
  EV[n + 1], EV[n + 2], EV[n + 3], EV[n + 4] = id, name or '', kind, detail or ''
  EVN = EVN + 1
  if EVN >= EV_MAX then flush_events() end
end
