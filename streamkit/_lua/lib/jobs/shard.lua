-- The shard's keys, as every job script gets them (see streamkit.jobs._layout.ShardKeys):
-- KEYS[1..3] the ready streams (high, normal, low), KEYS[4] the schedule, KEYS[5] the
-- dead-letter stream, KEYS[6] the completion stream that result waiters read, KEYS[7]
-- the counters; ARGV[1] is the shard's key base B, from which every other key is derived
-- (same hash tag). Declarations only: a script may use any of them.

local B = ARGV[1]
local Q = {KEYS[1], KEYS[2], KEYS[3]}
local SCHED, DEAD, DONE, COUNTS = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local GROUP = K.JOB_GROUP
local CTL, WAKE, LIMS = B .. ':ctl', B .. ':wake', B .. ':lims'
local SETTLE, XOUT = B .. ':settle', B .. ':xout'
local FINAL = {success = true, dead = true, aborted = true, expired = true}
