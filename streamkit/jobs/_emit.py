"""Records a job emits on success: kept with its try, written by the finish script that
records the try's success, and only then.

``current_job().emit(stream, record)`` encodes the record with the stream's codec and
keeps it with the running try. The finish script (``jobs/finish``), which records an
outcome only for the try holding the job's claim (fenced by its token), appends a
successful try's records in the same call: a failed, retried, aborted, timed-out or
taken-over try's records are never written, and a finish sent again after a lost reply
writes nothing more. So each record lands once, from the successful try only.

On a single server the finish script appends to the stream's partitions directly
(trimming them as every append does). On Redis Cluster a partition usually lives in
another slot than the job's shard, so the finish script appends to the shard's outbox
(``__jobs:{Q.S}:obox``, in the shard's slot) and :func:`relay_emitted` moves the
records on, with the relay script of processors' outboxes (``streams/relay``): per
target, appended in outbox order past the source's marker (``__rely:{target}:SOURCE``),
so a relay repeated by another worker, or after a crash, appends nothing twice; then
the relayed entries are deleted. A worker relays a shard's outbox after each finish
that wrote to it, and looks at it every few seconds (what a dead worker left).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from .._defaults import DEFAULT_PARTITION_SIZE
from .._errors import ConfigError, EncodeError
from .._keys import relay_key
from .._lua import script
from .._redis import LuaScript, retry_idempotent
from .._spec import spec_of

if TYPE_CHECKING:
    from .._redis import Redis
    from .._spec import HasSpec, StreamSpec
    from ._layout import ShardKeys

__all__ = ["MAX_EMITS", "Emission", "emission", "emit_arguments", "outbox_key", "relay_emitted"]

log = logging.getLogger("streamkit.jobs")

#: Records one try may emit, at most (the finish script appends them in one call).
MAX_EMITS = 1000
#: Outbox entries relayed per round.
RELAY_BATCH = 500
#: The outbox fields naming an entry's target stream key and how much of it to keep.
TARGET_FIELD = b"__to"
KEEP_FIELD = b"__keep"

_RELAY = LuaScript(script("streams/relay"))

#: One emitted record: its stream's description, its partition's key, how many entries
#: that partition keeps when appends trim it, and its fields (names and values).
Emission = tuple["StreamSpec[Any]", str, int, list[bytes | str]]


def emission(stream: StreamSpec[Any] | HasSpec[Any], record: Any) -> Emission:
    """Encode ``record`` for ``stream``, as an emission of the running try.

    Error handling:
        :class:`~streamkit.ConfigError` for something that is not a stream;
        :class:`~streamkit.EncodeError` if ``record`` does not fit the stream.
    """
    try:
        spec = spec_of(stream)
    except (TypeError, ConfigError):
        raise ConfigError("stream", f"emit() takes a stream, got {stream!r}") from None
    try:
        fields = spec.codec.encode(record)
    except EncodeError:
        raise
    except Exception as exc:
        raise EncodeError(f"cannot encode {record!r} for {spec.name}: {exc}") from exc
    keep = getattr(getattr(stream, "settings", None), "partition_size", DEFAULT_PARTITION_SIZE)
    pairs: list[bytes | str] = []
    for name, value in fields.items():
        pairs.append(name)
        pairs.append(value)
    key = spec.key(spec.partitioner.partition_of(record))
    return spec, key, keep, pairs


def outbox_key(keys: ShardKeys) -> str:
    """The outbox of a shard's emitted records (Redis Cluster)."""
    return f"{keys.base}:obox"


def emit_arguments(
    emitted: list[Emission], keys: ShardKeys, *, cluster: bool
) -> list[bytes | str | int]:
    """The finish script's arguments for a try's emissions: per record its key, the
    entries to keep when trimming (0: none), its field count and fields; on a cluster
    the key is the shard's outbox and the fields say where the record goes."""
    args: list[bytes | str | int] = []
    outbox = outbox_key(keys)
    for _, key, keep, pairs in emitted:
        if cluster:
            args.extend((outbox, 0, len(pairs) // 2 + 2, TARGET_FIELD, key, KEEP_FIELD, keep))
        else:
            args.extend((key, keep, len(pairs) // 2))
        args.extend(pairs)
    return args


async def relay_emitted(redis: Redis, keys: ShardKeys) -> int:
    """Move the records in ``keys``' shard outbox to their streams, exactly once;
    returns how many entries were relayed.

    Any worker may relay a shard's outbox, several at once: the target's marker makes
    each record land once, in outbox order.

    Error handling:
        :class:`~streamkit.RedisUnavailable` once the retries give up: the records
        wait in the outbox for the next relay.
    """
    outbox = outbox_key(keys)
    source = f"jobs.{keys.queue}.{keys.shard}"
    relayed = 0
    while True:
        entries: Any = await retry_idempotent(
            functools.partial(redis.xrange, outbox, count=RELAY_BATCH),
            what="reading emitted records",
        )
        if not entries:
            return relayed
        by_target: dict[bytes, tuple[int, list[Any]]] = {}
        ids: list[Any] = []
        for entry in entries:
            fields = dict(entry.field_values)
            target = fields.pop(TARGET_FIELD)
            keep = int(fields.pop(KEEP_FIELD))
            args = by_target.setdefault(target, (keep, []))[1]
            args.append(entry.identifier)
            args.append(len(fields))
            for name, value in fields.items():
                args.append(name)
                args.append(value)
            ids.append(entry.identifier)
        for target, (keep, args) in by_target.items():
            key = target.decode()
            await retry_idempotent(
                _RELAY,
                redis,
                [key, relay_key(key, source)],
                [keep, *args],
                what="relaying emitted records",
            )
        await retry_idempotent(redis.xdel, outbox, ids, what="deleting relayed records")
        relayed += len(ids)
