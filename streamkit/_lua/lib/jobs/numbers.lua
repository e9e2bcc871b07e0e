-- num(n): a whole number as text.

-- Whole numbers as text, each formatted once per call: Redis formats a number given
-- to redis.call with printf, and so does Lua one joined to a string; the hot path
-- passes the same few numbers (now, a try's number) for every job.
local NUMS = {}
local function num(n)
  local s = NUMS[n]
  if not s then
    s = string.format('%d', n)
    NUMS[n] = s
  end
  return s
end
