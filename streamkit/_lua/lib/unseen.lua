-- unseen_from(key, group, consumer, seen): what a read of new entries looks for first:
-- entries delivered to this consumer after the last one its reader saw. Only a read of
-- the reader's own can have delivered them, one whose reply never reached it: a reply
-- lost with its connection, or the read behind a wait that Redis ran after the wait was
-- given up (a discarded connection's commands may run after the reader's next command,
-- sent on another connection). They are read from the history, in order, before anything
-- new. Returns the id to read from: `seen` if there are such entries, else '>'.

local function unseen_from(key, group, consumer, seen)
  if #redis.call('XPENDING', key, group, '(' .. seen, '+', 1, consumer) > 0 then
    return seen
  end
  return '>'
end
