-- flat(entries): a read's entries as {ids, flat fields, widths}: the entries' field lists
-- one after the other, and the length of each (a number when every entry has the same).

local function flat(entries)
  local ids, fields, widths = {}, {}, {}
  local n, same = 0, nil
  for i, entry in ipairs(entries) do
    ids[i] = entry[1]
    local f = entry[2]
    local w = #f
    for j = 1, w do fields[n + j] = f[j] end
    n = n + w
    widths[i] = w
    if same == nil then same = w elseif same ~= w then same = -1 end
  end
  if same ~= nil and same >= 0 then widths = same end
  return ids, fields, widths
end
