-- Appends the chunks a job's running try streamed, fenced, to the job's output stream
-- (its hash tag's :out:ID), in order and once: each chunk has a sequence number in its
-- try, and the job's record keeps the last one appended ('sq', "try:seq"), so a call
-- sent again after a lost reply appends nothing twice. The stream keeps about
-- max_chunks entries and expires ttl_s after its last chunk (the finish script gives it
-- the result's expiry when the job succeeds).
--
-- KEYS: ready_high, ready_normal, ready_low, schedule, dead, done, counts
-- TAG: {shard}
-- ARGV: base, id, token, try, first_seq (the first chunk's), max_chunks, ttl_s, chunk...
-- REPLY: int (chunks appended) | -1 (fenced out: nothing appended)
--#include lib/jobs/record

local id = ARGV[2]
local k = jkey(id)
local f = redis.call('HMGET', k, 'owner', 'sq')
if f[1] ~= ARGV[3] then return -1 end
local try, first = ARGV[4], tonumber(ARGV[5])
local done = 0
if f[2] then
  local t, s = string.match(f[2], '^(%d+):(%d+)$')
  if t == try then done = tonumber(s) end
end
local out = B .. ':out:' .. id
local appended = 0
for i = 8, #ARGV do
  local seq = first + i - 8
  if seq > done then
    redis.call('XADD', out, 'MAXLEN', '~', ARGV[6], '*', 't', try, 'c', ARGV[i])
    appended = appended + 1
    done = seq
  end
end
if appended > 0 then
  redis.call('EXPIRE', out, ARGV[7])
  redis.call('HSET', k, 'sq', try .. ':' .. done)
end
return appended
