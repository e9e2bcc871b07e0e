-- parse_id(a): stream entry id a ('MS-SEQ') as two numbers.

local function parse_id(a)
  local ms, seq = string.match(a, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
