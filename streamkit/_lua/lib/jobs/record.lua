-- jkey(id): the key of job id's record, a hash (its fields: streamkit/jobs/_scripts.py).
--#include lib/jobs/shard

local function jkey(id) return B .. ':job:' .. id end
