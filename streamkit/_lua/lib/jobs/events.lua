-- job_event(id, name, kind, detail): a state change of job id (enqueued, started,
-- progress, retried, released, succeeded, dead, aborted, expired), appended to the
-- shard's event stream (B .. ':events', about K.EVENTS_KEEP entries kept), unless the
-- queue's events are off (B .. ':evoff' exists; looked at once per call).
--#include lib/jobs/shard

local EVENTS_ON = nil
local function job_event(id, name, kind, detail)
  if EVENTS_ON == nil then EVENTS_ON = redis.call('EXISTS', B .. ':evoff') == 0 end
  if not EVENTS_ON then return end
  if detail then
    redis.call('XADD', B .. ':events', 'MAXLEN', '~', K.EVENTS_KEEP, '*', 'j', id, 'n', name,
      'e', kind, 'd', detail)
  else
    redis.call('XADD', B .. ':events', 'MAXLEN', '~', K.EVENTS_KEEP, '*', 'j', id, 'n', name,
      'e', kind)
  end
end
