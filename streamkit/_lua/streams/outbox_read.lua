-- Reads an outbox for relaying, fenced. Writes the progress key, so that a WAIT after
-- this call waits for the commits that wrote the entries to reach the replicas.
--
-- KEYS: outbox, lock, progress (the relay's, in the outbox's slot)
-- TAG: {partition}
-- ARGV: lease, count
-- REPLY: -1 (the lease is not ours) | [{id: str, fields: [str]}]

if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[2])
local last = '0-0'
if entries[#entries] then last = entries[#entries][1] end
redis.call('SET', KEYS[3], last)
return entries
