-- apply_changes(at): applies the changes of a commit (see streamkit._commit): ARGV from
-- index `at` holds the op count, then the ops, each: code, KEYS index, count, values.
-- Returns the index after the last op.

local function apply_changes(at)
  if at > #ARGV then return at end
  local n = tonumber(ARGV[at])
  at = at + 1
  -- The command of each op but 't'; `c` counts values (HDEL's fields, ZREM's members),
  -- or pairs of them for HSET, XADD and ZADD (as streamkit._commit lays them out).
  local commands = {h = 'HSET', d = 'HDEL', x = 'XADD', z = 'ZADD', r = 'ZREM'}
  for _ = 1, n do
    local op, k, c = ARGV[at], KEYS[tonumber(ARGV[at + 1])], tonumber(ARGV[at + 2])
    if commands[op] then
      local last = at + 2 + ((op == 'd' or op == 'r') and c or 2 * c)
      if op == 'x' then
        redis.call('XADD', k, '*', unpack(ARGV, at + 3, last))
      else
        redis.call(commands[op], k, unpack(ARGV, at + 3, last))
      end
      at = last + 1
    elseif op == 'X' then
      -- A run of `c` entries of one field: its name, then each entry's value.
      local field = ARGV[at + 3]
      for j = at + 4, at + 3 + c do redis.call('XADD', k, '*', field, ARGV[j]) end
      at = at + 4 + c
    elseif op == 'k' then
      -- Delete the key (a closed window's hash, say), whatever it holds.
      redis.call('UNLINK', k)
      at = at + 3
    elseif op == 't' then
      -- Trim an output stream the changes appended `c` entries to, keeping
      -- ARGV[at + 3] entries (processed ones only, bounded like every trim).
      trim_processed(k, redis.call('XLEN', k), tonumber(ARGV[at + 3]), c)
      at = at + 4
    else
      error('unknown change ' .. tostring(op))
    end
  end
  return at
end
