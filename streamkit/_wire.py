"""The wire-level facts shared by every side that touches Redis: pure, no I/O.

The async side (producer, fetcher) and the synchronous Spark side read and write the
same entries with the same scripts and the same metadata. Everything they must agree
on lives here, with no import of trio or of a Redis client, so that Spark's Python
workers can import it cheaply:

* the Lua sources of the append-and-trim (wrapped by the producer's idempotent
  append and the Spark writer) and metadata scripts, and of the partition's commit
  family: the fenced read (which commits first) and the fenced commit, both applying
  a processor's changes (:mod:`streamkit._commit`) with the acknowledgements;
* the stream metadata schema (:data:`METADATA_VERSION`, :func:`compare_metadata`);
* the entry layout (:func:`flatten_fields`, :func:`field_pairs`) and :func:`text`;
* the size limits of entries and of script calls, and :func:`chunk_bounds`, which
  splits appends into calls by count and by bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._defaults import (
    DEFAULT_MAX_DECODED_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
    DEFAULT_PARTITION_SIZE,
    DEFAULT_SEND_CHUNK_SIZE,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

__all__ = [
    "ACK_LUA",
    "APPEND_AND_TRIM_LUA",
    "CHANGES_LUA",
    "COMPARED_METADATA",
    "DEFAULT_MAX_DECODED_SIZE",
    "DEFAULT_MAX_RECORD_SIZE",
    "DEFAULT_PARTITION_SIZE",
    "DEFAULT_SEND_CHUNK_BYTES",
    "DEFAULT_SEND_CHUNK_SIZE",
    "METADATA_LUA",
    "METADATA_VERSION",
    "OUTBOX_DELETE_LUA",
    "OUTBOX_READ_LUA",
    "READ_LUA",
    "REDIS_MAX_BULK",
    "RELAY_LUA",
    "TRIM_FUNCTIONS_LUA",
    "TRIM_PROCESSED_STEP",
    "TRIM_STEP",
    "WOKEN_READ_LUA",
    "chunk_bounds",
    "compare_metadata",
    "compare_schemas",
    "field_pairs",
    "flatten_fields",
    "format_size",
    "metadata_pairs",
    "text",
]

#: Version 2 added ``schema``: the record's field names and types. Streams recorded
#: by version 1 (no ``schema``) are still checked, by the record's name alone.
METADATA_VERSION = "2"

#: Bytes of entries appended per script call, at most (an entry larger than this goes
#: in a call of its own): Redis holds a whole call in memory, and runs it without a
#: pause, so a call of many large entries would hold up every other client.
DEFAULT_SEND_CHUNK_BYTES = 2**20

#: Redis's default ``proto-max-bulk-len``: the longest string (each field name and
#: value) it accepts in a command, when the server's own setting cannot be read.
REDIS_MAX_BULK = 512 * 2**20

#: Entries one script call removes under the hard cap, beyond as many as it appended:
#: a partition far over its cap (a cap just set or lowered) comes down over several
#: calls, each of bounded work, instead of one call holding Redis up for seconds. The
#: cap reads each entry it removes (to count the unprocessed ones), about a microsecond
#: each. See docs/streams.md, "Trimming".
TRIM_STEP = 1_000
#: Entries one script call removes when it trims processed entries (``partition_size``),
#: beyond as many as it appended or acknowledged: approximate trimming frees whole
#: nodes of about 100 entries, about 10 ns an entry.
TRIM_PROCESSED_STEP = 50_000

#: The metadata fields compared between a stream's record and a producer or consumer.
#: An empty ``partition_by`` means "a callable", which cannot be compared.
COMPARED_METADATA = ("partition_count", "format", "record", "partition_by")

#: In a ``schema``: fields are separated by this, each ``name:type``; a leading
#: :data:`OPTIONAL_MARK` says the field has a default.
SCHEMA_SEPARATOR = ";"
OPTIONAL_MARK = "?"


def text(value: object) -> str:
    """``value`` as text: bytes decoded as UTF-8, anything else through ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def field_pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    """An entry's flat field list ``[name, value, name, value, ...]`` as a dict."""
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def flatten_fields(fields: Mapping[bytes, bytes], into: list[bytes | int]) -> int:
    """Append one entry to a script's arguments: its field count, then names and values.

    Returns:
        the entry's size: the bytes of its field names and values.
    """
    into.append(len(fields))
    size = 0
    for name, value in fields.items():
        into.append(name)
        into.append(value)
        size += len(name) + len(value)
    return size


def chunk_bounds(sizes: Sequence[int], count: int, size: int) -> Iterator[tuple[int, int]]:
    """Split entries into consecutive chunks of at most ``count`` entries and ``size`` bytes.

    An entry larger than ``size`` makes a chunk of its own. Yields ``(start, end)``
    slice bounds of ``sizes``, in order, covering every entry once.
    """
    start = 0
    total = 0
    for index, entry_size in enumerate(sizes):
        if index > start and (index - start >= count or total + entry_size > size):
            yield start, index
            start, total = index, 0
        total += entry_size
    if start < len(sizes):
        yield start, len(sizes)


def format_size(size: int) -> str:
    """A byte count for people: ``512 bytes``, ``64 KiB``, ``16 MiB``, ``2.5 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"


def metadata_pairs(reply: object) -> dict[str, str]:
    """An ``HGETALL`` reply (a flat list or a dict, bytes or text) as a text dict."""
    if isinstance(reply, dict):
        items: Iterable[tuple[object, object]] = reply.items()
    else:
        flat = list(reply)  # type: ignore[call-overload]
        items = zip(flat[::2], flat[1::2], strict=True)
    return {text(k): text(v) for k, v in items}


def compare_metadata(
    recorded: Mapping[str, str], mine: Mapping[str, str], fields: Iterable[str] = COMPARED_METADATA
) -> tuple[str, str, str] | None:
    """The first of ``fields`` on which ``recorded`` and ``mine`` disagree, or ``None``.

    ``record`` is compared by ``schema`` (field names and types, see
    :func:`compare_schemas`) when both sides recorded one: a renamed class with
    compatible fields agrees, an unrelated class of the same name does not. Against
    metadata without a schema (version 1) or a ``dict`` record, by name.

    Returns:
        ``(field, recorded value, my value)``. A field absent on either side, and an
        empty ``partition_by`` (a callable) on either side, never disagree. For a
        schema difference, the values name the record and only the differing fields:
        ``("record", "Order(amount: int)", "Order(amount: float)")``.
    """
    for field in fields:
        theirs = recorded.get(field)
        ours = mine.get(field)
        if theirs is None or ours is None:
            continue
        if field == "partition_by" and "" in (theirs, ours):
            continue
        if field == "record" and "dict" not in (theirs, ours):
            their_schema = recorded.get("schema")
            our_schema = mine.get("schema")
            if their_schema is not None and our_schema is not None:
                differences = compare_schemas(their_schema, our_schema)
                if differences:
                    return (
                        field,
                        f"{theirs}({'; '.join(d[1] for d in differences)})",
                        f"{ours}({'; '.join(d[2] for d in differences)})",
                    )
                continue
        if theirs != ours:
            return field, theirs, ours
    return None


def _parse_schema(schema: str) -> dict[str, tuple[str, bool]]:
    fields: dict[str, tuple[str, bool]] = {}
    for item in schema.split(SCHEMA_SEPARATOR):
        if not item:
            continue
        optional = item.startswith(OPTIONAL_MARK)
        name, _, kind = item.removeprefix(OPTIONAL_MARK).partition(":")
        fields[name] = (kind, optional)
    return fields


def compare_schemas(recorded: str, mine: str) -> list[tuple[str, str, str]]:
    """The fields on which two record schemas are incompatible, in field order.

    Compatible: the same fields with the same types, plus any field that only one
    side has *with a default* (an added optional field: entries without it decode
    with the default, entries with it decode on a side that ignores it). Incompatible:
    a field whose type differs, or that only one side has and requires.

    Returns:
        ``(name, how it is recorded, how it is here)`` per incompatible field,
        e.g. ``("amount", "amount: int", "amount: float")`` or
        ``("note", "no note", "note: str, required")``.
    """
    theirs = _parse_schema(recorded)
    ours = _parse_schema(mine)
    differences = []
    for name in [*theirs, *(n for n in ours if n not in theirs)]:
        their_field = theirs.get(name)
        our_field = ours.get(name)
        if their_field is not None and our_field is not None:
            if their_field[0] != our_field[0]:
                differences.append((name, f"{name}: {their_field[0]}", f"{name}: {our_field[0]}"))
        elif their_field is not None and not their_field[1]:
            differences.append((name, f"{name}: {their_field[0]}, required", f"no {name}"))
        elif our_field is not None and not our_field[1]:
            differences.append((name, f"no {name}", f"{name}: {our_field[0]}, required"))
    return differences


# Functions of the scripts that trim a stream: never below the oldest entry some
# consumer group still needs. Appends trim, and so do
# acknowledgements, so that consuming frees memory even while Redis is too full
# to append (XTRIM and XACK are allowed then; XADD is not).
TRIM_FUNCTIONS_LUA = """
local function parse(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end

local function less(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  return ams < bms or (ams == bms and aseq < bseq)
end

-- The lowest id some consumer group still needs: its oldest pending entry, or the
-- entry after the last one it was delivered. nil when no group reads the stream.
local function oldest_needed(stream)
  local needed = nil
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local info = {}
    for j = 1, #group, 2 do info[group[j]] = group[j + 1] end
    local candidate
    if info['pending'] > 0 then
      candidate = redis.call('XPENDING', stream, info['name'])[2]
    else
      local ms, seq = parse(info['last-delivered-id'])
      candidate = string.format('%d-%d', ms, seq + 1)
    end
    if needed == nil or less(candidate, needed) then needed = candidate end
  end
  return needed
end

-- Trims what every consumer group of `stream` has processed, down to no fewer than
-- `keep` entries; `length` is the stream's length now. Removes at most `done` (the
-- entries this call appended or acknowledged) plus a step: bounded work per call, and
-- never slower than the partition fills.
local function trim_processed(stream, length, keep, done)
  if keep > 0 and length > keep then
    local needed = oldest_needed(stream)
    if needed ~= nil then
      redis.call('XTRIM', stream, 'MINID', '~', needed, 'LIMIT',
                 math.min(length - keep, done + STEP))
    end
  end
end
""".replace("STEP", str(TRIM_PROCESSED_STEP))

# Appends the entries given in ARGV from index `first` on (each: field count, then
# names and values; or a run of single-field entries: minus their number, the field's
# name, then each one's value) to the stream `key`, then trims it: never below the oldest entry
# a consumer group still needs, unless the hard cap `cap` (0 = none) says otherwise.
# Leaves the new ids in `ids` and the number of unprocessed entries the cap dropped in
# `dropped`. Shared by the producer and the Spark writer, so both append exactly alike.
APPEND_AND_TRIM_LUA = (
    TRIM_FUNCTIONS_LUA
    + """
local ids = {}
local i = first
while i <= #ARGV do
  local count = tonumber(ARGV[i])
  if count > 0 then
    ids[#ids + 1] = redis.call('XADD', key, '*', unpack(ARGV, i + 1, i + 2 * count))
    i = i + 1 + 2 * count
  else
    -- A run: -count entries of one field, its name once, then each one's value.
    local field = ARGV[i + 1]
    for j = i + 2, i + 1 - count do
      ids[#ids + 1] = redis.call('XADD', key, '*', field, ARGV[j])
    end
    i = i + 2 - count
  end
end

local dropped = 0
local length = redis.call('XLEN', key)
if cap > 0 and length > cap then
  -- The oldest entries over the cap go, at most as many as were appended plus the
  -- trim step (a partition far over its cap comes down over several calls); each
  -- that some consumer group still needs is counted as dropped.
  local excess = math.min(length - cap, #ids + TRIM_STEP)
  local oldest = redis.call('XRANGE', key, '-', '+', 'COUNT', excess + 1)
  local needed = oldest_needed(key)
  for i = 1, excess do
    if needed == nil or not less(oldest[i][1], needed) then dropped = dropped + 1 end
  end
  -- Exactly the `excess` entries before the first one kept.
  redis.call('XTRIM', key, 'MINID', oldest[excess + 1][1])
else
  trim_processed(key, length, keep, #ids)
end
""".replace("TRIM_STEP", str(TRIM_STEP))
)

# KEYS: the metadata hash. ARGV: field, value, ... Records the metadata if the stream
# is new (returns an empty list); returns what is recorded otherwise.
METADATA_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
  return {}
end
return redis.call('HGETALL', KEYS[1])
"""

# Applies the changes of a commit (see streamkit._commit): ARGV from index `at` holds
# the op count, then the ops, each: code, KEYS index, count, values. Returns the index
# after the last op.
CHANGES_LUA = """
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
"""

# A read's entries as {ids, flat fields, widths}: the entries' field lists one after
# the other, and the length of each (a number when every entry has the same).
FLAT_LUA = """
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
"""

# What a read of new entries looks for first: entries delivered to this consumer after
# the last one its reader saw. Only a read of the reader's own can have delivered them,
# one whose reply never reached it: a reply lost with its connection, or the read
# behind a wait that Redis ran after the wait was given up (a discarded connection's
# commands may run after the reader's next command, sent on another connection). They
# are read from the history, in order, before anything new. Returns the id to read
# from: `seen` if there are such entries, else '>'.
UNSEEN_LUA = """
local function unseen_from(key, group, consumer, seen)
  if #redis.call('XPENDING', key, group, '(' .. seen, '+', 1, consumer) > 0 then
    return seen
  end
  return '>'
end
"""

# The fenced read, which commits first. KEYS: stream, lock, then the keys the changes
# write. ARGV: lease value, group, consumer, count, start (a history id to read the
# pending entries after, or '>' followed by the id of the last entry the reader saw,
# for new entries: see UNSEEN_LUA), entries to keep when trimming (0: do not trim),
# the number of ids to acknowledge, those ids (the consumer's finished events), then
# the changes to apply with them, if any.
# Returns 0 if the lease is not ours (nothing read, written or acknowledged); else
# {ids, fields, widths, delivery counts (history only), next start id, last stream id
# (if idle)}: the entries' field lists flat, one after the other, in `fields`, and in
# `widths` the length of each (a number when every entry has the same): a flat reply
# is cheaper to build for Redis and to parse for the client than one array per entry.
READ_LUA = (
    """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
local key, group, consumer, count = KEYS[1], ARGV[2], ARGV[3], ARGV[4]
"""
    + TRIM_FUNCTIONS_LUA
    + CHANGES_LUA
    + FLAT_LUA
    + UNSEEN_LUA
    + """
local acks = tonumber(ARGV[7])
apply_changes(8 + acks)
if acks > 0 then
  redis.call('XACK', key, group, unpack(ARGV, 8, 7 + acks))
  trim_processed(key, redis.call('XLEN', key), tonumber(ARGV[6]), acks)
end

local function read(id)
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
                           'STREAMS', key, id)
  if reply then return reply[1][2] end
  return {}
end

local start = ARGV[5]
if string.sub(start, 1, 1) == '>' then
  start = unseen_from(key, group, consumer, string.sub(start, 2))
end
if start ~= '>' then
  local raw = read(start)
  if #raw > 0 then
    local live, gone = {}, {}
    for _, entry in ipairs(raw) do
      if entry[2] then live[#live + 1] = entry else gone[#gone + 1] = entry[1] end
    end
    -- Deleted while pending: nothing left to process.
    if #gone > 0 then redis.call('XACK', key, group, unpack(gone)) end
    local counts = {}
    if #live > 0 then
      local by_id = {}
      local pending = redis.call('XPENDING', key, group, live[1][1], live[#live][1],
                                 #live, consumer)
      for _, p in ipairs(pending) do by_id[p[1]] = p[4] end
      for i, entry in ipairs(live) do counts[i] = by_id[entry[1]] or 1 end
    end
    local ids, fields, widths = flat(live)
    return {ids, fields, widths, counts, raw[#raw][1], ''}
  end
end

local entries = read('>')
if #entries > 0 then
  local ids, fields, widths = flat(entries)
  return {ids, fields, widths, {}, '>', ''}
end
local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
local last_id = '0-0'
if last[1] then last_id = last[1][1] end
return {{}, {}, 0, {}, '>', last_id}
"""
)

# The fenced reads of quiet partitions, sent right behind the blocking XREAD that
# waits for them (on its connection, so Redis runs it the moment the XREAD returns).
# KEYS: stream, lock, for each partition. ARGV: group, count, then for each partition:
# lease value, consumer, the id of the last entry its reader saw. Reads new entries
# only (``>``) and acknowledges nothing (the call may run long after it was sent: a
# frozen worker's would acknowledge late). Returns for each partition: 0 if the lease
# is not ours (nothing read), -1 if it read nothing and the caller is to read the
# partition the usual way (the read failed, which that read reports, or entries were
# delivered to the reader unseen, which that read finds: see UNSEEN_LUA), else
# {ids, fields, widths} as READ_LUA's, empty when nothing new came.
WOKEN_READ_LUA = (
    FLAT_LUA
    + UNSEEN_LUA
    + """
local group, count = ARGV[1], ARGV[2]
local function read(key, consumer, seen)
  if unseen_from(key, group, consumer, seen) ~= '>' then return -1 end
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
                           'STREAMS', key, '>')
  if not reply then return {{}, {}, 0} end
  local ids, fields, widths = flat(reply[1][2])
  return {ids, fields, widths}
end

local replies = {}
for p = 1, #KEYS / 2 do
  if redis.call('GET', KEYS[2 * p]) ~= ARGV[3 * p] then
    replies[p] = 0
  else
    local ok, reply = pcall(read, KEYS[2 * p - 1], ARGV[3 * p + 1], ARGV[3 * p + 2])
    replies[p] = ok and reply or -1
  end
end
return replies
"""
)

# The fenced commit: changes and acknowledgements. KEYS: stream, lock, then the keys
# the changes write. ARGV: lease value, group, entries to keep when trimming (0: do
# not trim), the number of ids to acknowledge, those ids, then the changes, if any.
# Returns -1 if the lease is not ours (nothing written or acknowledged), else the
# number acknowledged.
ACK_LUA = (
    """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
local key = KEYS[1]
"""
    + TRIM_FUNCTIONS_LUA
    + CHANGES_LUA
    + """
local acks = tonumber(ARGV[4])
apply_changes(5 + acks)
local acked = 0
if acks > 0 then
  acked = redis.call('XACK', key, ARGV[2], unpack(ARGV, 5, 4 + acks))
  trim_processed(key, redis.call('XLEN', key), tonumber(ARGV[3]), acks)
end
return acked
"""
)

# Relays records a processor emitted on Redis Cluster from its partition's outbox to
# their target partition, exactly once: KEYS: the target stream, the relay marker (the
# last outbox id relayed from that source to that target). ARGV: entries to keep when
# trimming (0: do not trim), then per entry its outbox id, field count, names and
# values, in outbox order. Entries at or below the marker were relayed before and are
# skipped. Returns the number appended.
RELAY_LUA = (
    """
local key = KEYS[1]
"""
    + TRIM_FUNCTIONS_LUA
    + """
local last = redis.call('GET', KEYS[2]) or '0-0'
local newest = last
local appended = 0
local i = 2
while i <= #ARGV do
  local id, count = ARGV[i], tonumber(ARGV[i + 1])
  if less(last, id) then
    redis.call('XADD', key, '*', unpack(ARGV, i + 2, i + 1 + 2 * count))
    appended = appended + 1
    newest = id
  end
  i = i + 2 + 2 * count
end
if newest ~= last then redis.call('SET', KEYS[2], newest) end
trim_processed(key, redis.call('XLEN', key), tonumber(ARGV[1]), appended)
return appended
"""
)

# Reads an outbox for relaying, fenced: KEYS: the outbox, the partition's lock, the
# relay's progress key (in the outbox's slot). ARGV: lease value, count. Writes the
# progress key, so that a WAIT after this call waits for the commits that wrote the
# entries to reach the replicas. Returns -1 if the lease is not ours, else the entries.
OUTBOX_READ_LUA = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[2])
local last = '0-0'
if entries[#entries] then last = entries[#entries][1] end
redis.call('SET', KEYS[3], last)
return entries
"""

# Deletes relayed entries from an outbox, fenced: KEYS: the outbox, the partition's
# lock. ARGV: lease value, ids. Returns -1 if the lease is not ours, else the number
# deleted.
OUTBOX_DELETE_LUA = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
return redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
"""
