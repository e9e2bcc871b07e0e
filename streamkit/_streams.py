"""Partitioned streams, producer side: send, send_many, metadata and trimming.

A stream is ``partition_count`` Redis streams. Records are routed by the partitioner,
encoded by the codec and appended by a Lua script, one round trip per partition and
chunk, which also trims the partition without ever dropping an entry some consumer
group has not acknowledged (unless a hard cap, ``max_len``, says otherwise).
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Generic, TypeVar

import attrs
import trio
from coredis.commands.script import Script

from . import _keys
from ._codec import Codec, codec_for
from ._errors import ConfigError, MetadataMismatch
from ._idempotent import append_once
from ._partitioner import Partitioner
from ._records import is_primitive
from ._redis import redis_errors

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from ._app import App
    from ._settings import Settings

__all__ = ["Stream"]

R = TypeVar("R")

log = logging.getLogger("streamkit.streams")

METADATA_VERSION = "1"

# Records encoded at a time by send_many: bounds memory for huge iterables while
# keeping every partition's pipeline full.
WINDOW_PER_PARTITION = 4

# Appends the entries given in ARGV from index `first` on (each: field count, then
# names and values) to the stream `key`, then trims it: never below the oldest entry
# a consumer group still needs, unless the hard cap `cap` (0 = none) says otherwise.
# Leaves the new ids in `ids` and the number of unprocessed entries the cap dropped in
# `dropped`. Shared with the Spark writer, so that both append exactly alike.
APPEND_AND_TRIM_LUA = """
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
local function oldest_needed()
  local needed = nil
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    local info = {}
    for j = 1, #group, 2 do info[group[j]] = group[j + 1] end
    local candidate
    if info['pending'] > 0 then
      candidate = redis.call('XPENDING', key, info['name'])[2]
    else
      local ms, seq = parse(info['last-delivered-id'])
      candidate = string.format('%d-%d', ms, seq + 1)
    end
    if needed == nil or less(candidate, needed) then needed = candidate end
  end
  return needed
end

local ids = {}
local i = first
while i <= #ARGV do
  local count = tonumber(ARGV[i])
  ids[#ids + 1] = redis.call('XADD', key, '*', unpack(ARGV, i + 1, i + 2 * count))
  i = i + 1 + 2 * count
end

local dropped = 0
local length = redis.call('XLEN', key)
if cap > 0 and length > cap then
  local needed = oldest_needed()
  for _, entry in ipairs(redis.call('XRANGE', key, '-', '+', 'COUNT', length - cap)) do
    if needed == nil or not less(entry[1], needed) then dropped = dropped + 1 end
  end
  redis.call('XTRIM', key, 'MAXLEN', cap)
elseif length > keep then
  local needed = oldest_needed()
  if needed ~= nil then
    redis.call('XTRIM', key, 'MINID', '~', needed, 'LIMIT', length - keep)
  end
end
"""

# KEYS: the partition. ARGV: partition_size, max_len (0 = no cap), then the entries.
# Returns {entry ids, number of unacknowledged entries the hard cap dropped}.
_SEND_SCRIPT: Script[bytes] = Script(
    script="""
local key = KEYS[1]
local keep = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local first = 3
"""
    + APPEND_AND_TRIM_LUA
    + "return {ids, dropped}\n"
)

# Record the metadata if the stream is new; return what is recorded otherwise.
_METADATA_SCRIPT: Script[bytes] = Script(
    script="""
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
  return {}
end
return redis.call('HGETALL', KEYS[1])
"""
)


@attrs.define(eq=False)
class Stream(Generic[R]):
    """A partitioned stream of records, as seen by a producer.

    Created by :meth:`streamkit.App.stream`; sending needs the app to be connected
    (``async with app:``).
    """

    name: str
    record: type[R]
    partition_by: str | Callable[[R], object]
    partition_count: int
    settings: Settings
    app: App = attrs.field(repr=False)
    codec: Codec[R] = attrs.field(init=False, repr=False)
    partitioner: Partitioner[R] = attrs.field(init=False, repr=False)
    _metadata_checked: bool = attrs.field(default=False, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        _keys.validate_name("stream", self.name)
        self.codec = codec_for(self.record, compression=self.settings.compression)
        self.partitioner = Partitioner(
            partition_by=self.partition_by,
            partition_count=self.partition_count,
            record=self.record,
        )

    def key(self, partition: int) -> str:
        """The Redis key of ``partition``."""
        return _keys.stream_key(self.app.name, self.name, partition)

    def partition_keys(self) -> list[str]:
        """The Redis keys of all partitions, in partition order."""
        return [self.key(p) for p in range(self.partition_count)]

    def partition_of(self, record: R) -> int:
        """The partition ``record`` belongs to."""
        return self.partitioner.partition_of(record)

    def metadata(self) -> dict[str, str]:
        """What this process believes about the stream, as recorded in Redis."""
        return {
            "version": METADATA_VERSION,
            "partition_count": str(self.partition_count),
            "record": self.record.__qualname__,
            "format": "primitive" if is_primitive(self.record) else "json",
            "partition_by": self.partition_by if isinstance(self.partition_by, str) else "",
        }

    async def check_metadata(self) -> None:
        """Record the stream's metadata in Redis, or check it against what is there.

        Called before the first send; safe to call again.

        Error handling:
            :class:`MetadataMismatch` if the stream was created with another partition
            count, record type, format or partition key.
        """
        if self._metadata_checked:
            return
        redis = self.app.redis
        mine = self.metadata()
        with redis_errors():
            reply: object = await _METADATA_SCRIPT(
                keys=[_keys.meta_key(self.app.name, self.name)],
                args=list(itertools.chain.from_iterable(mine.items())),
                client=redis,
            )
        recorded = _pairs(reply)
        for field in ("partition_count", "format", "record", "partition_by"):
            theirs = recorded.get(field)
            # An empty partition_by means "a callable": it cannot be compared.
            if theirs is None or (field == "partition_by" and "" in (theirs, mine[field])):
                continue
            if theirs != mine[field]:
                raise MetadataMismatch(self.name, field, theirs, mine[field])
        self._metadata_checked = True

    async def send(self, *records: R) -> list[str]:
        """Append ``records`` to their partitions; return their entry ids in order.

        Error handling:
            :class:`~streamkit.EncodeError` for a record that cannot be encoded (then
            nothing is sent); :class:`~streamkit.RedisUnavailable` if Redis cannot be
            reached; :class:`MetadataMismatch` if the stream disagrees with this one.
        """
        return await self.send_many(records)

    async def send_many(
        self,
        records: Iterable[R],
        *,
        chunk_size: int | None = None,
        on_sent: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Append many records, pipelined: one round trip per partition and chunk.

        Records of one partition are appended in the order given. The iterable is
        consumed a window at a time, so a generator of millions of records needs little
        memory. ``on_sent(n)`` is called after each window with the number sent.

        Error handling:
            As :meth:`send`. If Redis fails midway, the windows before the failing one
            have been sent and later ones have not; the failing one may be partly sent.
        """
        chunk = chunk_size if chunk_size is not None else self.settings.send_chunk_size
        if chunk < 1:
            raise ConfigError("chunk_size", f"must be a positive integer, got {chunk!r}")
        await self.check_metadata()
        window_size = chunk * WINDOW_PER_PARTITION * self.partition_count
        ids: list[str] = []
        iterator = iter(records)
        while window := list(itertools.islice(iterator, window_size)):
            ids.extend(await self._send_window(window, chunk))
            if on_sent is not None:
                on_sent(len(window))
        return ids

    async def _send_window(self, records: Sequence[R], chunk: int) -> list[str]:
        partition_of = self.partitioner.partition_of
        encode = self.codec.encode
        # Per partition: the positions of its records in `records`, and the flat
        # script arguments (field count, then field names and values) for each.
        positions: dict[int, list[int]] = {}
        arguments: dict[int, list[list[bytes | int]]] = {}
        for position, record in enumerate(records):
            partition = partition_of(record)
            fields = encode(record)
            entry: list[bytes | int] = [len(fields)]
            for name, value in fields.items():
                entry.append(name)
                entry.append(value)
            positions.setdefault(partition, []).append(position)
            arguments.setdefault(partition, []).append(entry)

        ids: list[str] = [""] * len(records)

        async def send_partition(partition: int) -> None:
            entries = arguments[partition]
            where = positions[partition]
            for start in range(0, len(entries), chunk):
                sent = await self._append(partition, entries[start : start + chunk])
                for offset, entry_id in enumerate(sent):
                    ids[where[start + offset]] = entry_id

        if len(arguments) == 1:
            await send_partition(next(iter(arguments)))
        else:
            async with trio.open_nursery() as nursery:
                for partition in arguments:
                    nursery.start_soon(send_partition, partition)
        return ids

    async def _append(self, partition: int, entries: list[list[bytes | int]]) -> list[str]:
        # Idempotent: retried with the same marker when a connection is lost, so an
        # event is never appended twice (see streamkit._idempotent).
        max_len = self.settings.max_len or 0
        flat: list[bytes | int] = []
        for entry in entries:
            flat.extend(entry)
        entry_ids, dropped = await append_once(
            self.app.redis,
            self.key(partition),
            keep=self.settings.partition_size,
            cap=max_len,
            entries=flat,
            body=APPEND_AND_TRIM_LUA,
        )
        if dropped:
            log.warning(
                "max_len=%d dropped %d unprocessed entries from %s partition %d",
                max_len,
                dropped,
                self.name,
                partition,
            )
        return [e.decode() for e in entry_ids]

    def __repr__(self) -> str:
        return (
            f"<Stream {self.app.name}.{self.name} record={self.record.__qualname__} "
            f"partitions={self.partition_count}>"
        )


def _pairs(reply: object) -> dict[str, str]:
    """Turn an HGETALL reply (flat list or dict, bytes) into a str dict."""
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        flat = list(reply)  # type: ignore[call-overload]
        items = list(zip(flat[::2], flat[1::2], strict=True))
    return {_text(k): _text(v) for k, v in items}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
