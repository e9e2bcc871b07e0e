-- OPT: the per-job options of jobs/enqueue, by the short key each travels under in the
-- job's options JSON. streamkit.jobs._plan.OPTION_KEYS names them on the Python side;
-- tests/test_lua.py checks that the two agree.

local OPT = {
  priority = 'p',         -- 0 high, 1 normal, 2 low
  delay_ms = 'd',         -- relative
  at_ms = 'a',            -- absolute
  expires_ms = 'e',       -- absolute; negative: relative to now
  dedupe = 'w',           -- 1: dedupe by id (an id of the caller's)
  after = 'after',        -- ids of jobs on this shard that must succeed first
  remote = 'x',           -- jobs on other shards or queues it depends on: id -> link's answer
  limit_key = 'k',
  headers = 'h',          -- JSON text
  relayed = 'r',          -- relayed from a partition's outbox: {marker key, entry id}
  -- a workflow's jobs carry their own, instead of the batch's defaults:
  name = 'n',
  max_tries = 'm',
  result_ttl_s = 't',
  limits = 'l',           -- the lim field
  dedupe_window_s = 'dw',
  feed = 'f',             -- c, n, f or g (see hand_to)
  order = 'o',            -- every dependency's id, in order
  -- coalescing by a key of the job's (streamkit.jobs._plan._coalesce):
  debounce = 'b',         -- {key, debounce_ms, max_wait_ms (0: none)}
  throttle = 'th',        -- {key, period_ms}
}
