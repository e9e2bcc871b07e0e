"""Partitioned streams, producer side: send, send_many, metadata and trimming.

A :class:`Stream` is a :class:`~streamkit.StreamSpec` bound to an app's connection and
producer settings. Records are routed by the partitioner, encoded by the codec and
appended by a Lua script, one round trip per partition and chunk, which also trims the
partition without ever dropping an entry some consumer group has not acknowledged
(unless a hard cap, ``max_len``, says otherwise).

Every step but the I/O is :mod:`streamkit._produce`, shared with the blocking and
asyncio clients, so that all three append alike.
Chunks are cut by count (``send_chunk_size``) and by bytes, and a record larger than
``max_record_size`` or than the server accepts (its ``proto-max-bulk-len``, read once
per client where the user may) is refused before anything reaches Redis.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import trio

from ._errors import BackendError
from ._idempotent import append_once
from ._lua import script
from ._nurseries import meaningful_leaf
from ._produce import (
    DEFAULT_REPLICA_TIMEOUT,
    WINDOW_PER_PARTITION,
    SendWindow,
    bulk_limit_reply,
    check_metadata_reply,
    check_send_options,
    encode_into,
    encode_window,
    metadata_arguments,
    windows,
)
from ._redis import LuaScript, redis_errors, replicated
from ._wire import REDIS_MAX_BULK

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from ._codec import Codec
    from ._partitioner import Partitioner
    from ._redis import Redis
    from ._settings import Settings
    from ._spec import StreamSpec

__all__ = [
    "DEFAULT_REPLICA_TIMEOUT",
    "WINDOW_PER_PARTITION",
    "Stream",
    "append_entries",
    "append_flat",
    "check_metadata",
    "server_bulk_limit",
]

R = TypeVar("R")

#: Records encoded between two looks at the sends in flight (send_many encodes the
#: next window while Redis appends the current one).
ENCODE_SLICE = 500

_METADATA_SCRIPT = LuaScript(script("streams/metadata"))

# Per client: the longest string its server accepts in a command.
_bulk_limits: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


async def server_bulk_limit(redis: Redis) -> int:
    """The longest string (field name or value) the server accepts: ``proto-max-bulk-len``.

    Read with ``CONFIG GET`` once per client. Where that is refused (an ACL user
    without ``+config|get``, a managed service that renamed ``CONFIG``) or ambiguous
    (a cluster), Redis's default, 512 MiB, is assumed.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    limit = _bulk_limits.get(redis)
    if limit is None:
        try:
            with redis_errors():
                reply: Any = await redis.config_get(["proto-max-bulk-len"])
            limit = bulk_limit_reply(reply)
        except BackendError:
            limit = REDIS_MAX_BULK
        _bulk_limits[redis] = limit
    return limit


async def check_metadata(redis: Redis, spec: StreamSpec[Any]) -> None:
    """Record ``spec``'s metadata in Redis, or check it against what is recorded.

    Error handling:
        :class:`MetadataMismatch` if the stream was created with another partition
        count, record type, format or partition key.
    """
    with redis_errors():
        reply: object = await _METADATA_SCRIPT(
            redis, keys=[spec.meta_key], args=metadata_arguments(spec)
        )
    check_metadata_reply(spec, reply)


async def append_entries(
    redis: Redis,
    spec: StreamSpec[Any],
    partition: int,
    entries: Sequence[Sequence[bytes | int]],
    *,
    partition_size: int,
    max_len: int | None = None,
) -> list[str]:
    """Append already encoded entries to one partition, in order, and trim it.

    Each entry is its field count followed by field names and values (see
    :func:`streamkit._wire.flatten_fields`). One script call, so the entries are
    appended together or not at all; exactly once, as the call carries an
    idempotency marker and is retried with it while a lost connection leaves its
    outcome unknown (see :mod:`streamkit._idempotent`).

    Returns:
        the new entry ids, in order.

    Error handling:
        :class:`~streamkit.RedisUnavailable` when Redis stayed unreachable and nothing
        was appended; :class:`~streamkit.OutcomeUnknown` when the entries may or may
        not have been appended.
    """
    flat: list[bytes | int] = []
    for entry in entries:
        flat.extend(entry)
    return await append_flat(
        redis, spec, partition, flat, partition_size=partition_size, max_len=max_len
    )


async def append_flat(
    redis: Redis,
    spec: StreamSpec[Any],
    partition: int,
    flat: list[bytes | int],
    *,
    partition_size: int,
    max_len: int | None = None,
) -> list[str]:
    """:func:`append_entries` for entries laid end to end in ``flat`` already."""
    entry_ids, _ = await append_once(
        redis,
        spec.key(partition),
        keep=partition_size,
        cap=max_len or 0,
        entries=flat,
        stream=spec.name,
        partition=partition,
    )
    return entry_ids


@attrs.define(eq=False)
class Stream(Generic[R]):
    """A partitioned stream of records, as an app's producer sees it.

    Created by :meth:`streamkit.App.stream`; sending needs the app to be connected
    (``async with app:``). Everything about the stream itself (names, keys, codec,
    partitioner, metadata) is its :attr:`spec`.

    Attributes:
        spec: the stream's description.
        settings: the producer settings (partition size, hard cap, chunk size).
    """

    spec: StreamSpec[R]
    settings: Settings = attrs.field(repr=False)
    _connection: Callable[[], Redis] = attrs.field(repr=False)
    _metadata_checked: bool = attrs.field(default=False, init=False, repr=False)

    @property
    def name(self) -> str:
        """The stream's name."""
        return self.spec.name

    @property
    def record(self) -> type[R]:
        """The record type."""
        return self.spec.record

    @property
    def partition_by(self) -> str | Callable[[R], object]:
        """The partition key: a field name, or a function of a record."""
        return self.spec.partition_by

    @property
    def partition_count(self) -> int:
        """The number of partitions."""
        return self.spec.partition_count

    @property
    def codec(self) -> Codec[R]:
        """The record codec."""
        return self.spec.codec

    @property
    def partitioner(self) -> Partitioner[R]:
        """The partitioner."""
        return self.spec.partitioner

    def key(self, partition: int) -> str:
        """The Redis key of ``partition``."""
        return self.spec.key(partition)

    def partition_keys(self) -> list[str]:
        """The Redis keys of all partitions, in partition order."""
        return self.spec.partition_keys()

    def partition_of(self, record: R) -> int:
        """The partition ``record`` belongs to."""
        return self.spec.partition_of(record)

    def metadata(self) -> dict[str, str]:
        """What this process believes about the stream, as recorded in Redis."""
        return self.spec.metadata()

    async def check_metadata(self) -> None:
        """Record the stream's metadata in Redis, or check it against what is there.

        Called before the first send; safe to call again.

        Error handling:
            :class:`MetadataMismatch` if the stream was created with another partition
            count, record type, format or partition key.
        """
        if self._metadata_checked:
            return
        await check_metadata(self._connection(), self.spec)
        self._metadata_checked = True

    async def send(
        self,
        *records: R,
        replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
    ) -> list[str]:
        """Append ``records`` to their partitions; return their entry ids in order.

        Redis replicates asynchronously: a send returns once the master has the
        records, and a failover before they reach a replica loses them. With
        ``replicas=N``, each append is followed by ``WAIT N`` on the master that took
        it (on a cluster, the partition's master), and the send returns only once
        ``N`` replicas acknowledged it, waiting up to ``replica_timeout`` seconds per
        append. See ``docs/cluster.md``.

        Error handling:
            :class:`~streamkit.EncodeError` for a record that cannot be encoded (a
            field of the wrong type, the key field's too, is named), whose partition
            key the partitioner refuses, or that is too large: more than
            ``max_record_size`` encoded, or more than the server accepts (its
            ``proto-max-bulk-len``); then nothing is sent.
            :class:`~streamkit.RedisUnavailable` if Redis cannot be
            reached; :class:`MetadataMismatch` if the stream disagrees with this one;
            :class:`~streamkit.NotReplicated` (with the count reached) when fewer than
            ``replicas`` replicas acknowledged within ``replica_timeout``: the records
            are on the master, and sending them again may append them twice.
        """
        return await self.send_many(records, replicas=replicas, replica_timeout=replica_timeout)

    async def send_many(
        self,
        records: Iterable[R],
        *,
        chunk_size: int | None = None,
        on_sent: Callable[[int], None] | None = None,
        replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
    ) -> list[str]:
        """Append many records, pipelined: one round trip per partition and chunk.

        A chunk is ``chunk_size`` records of one partition, or fewer when they would
        take more than 1 MiB (a larger record goes in a chunk of its own), so that no
        call holds Redis up for long. Records of one partition are appended in the
        order given. The iterable is consumed a window at a time, so a generator of
        millions of records needs little memory. ``on_sent(n)`` is called after each
        window with the number sent.

        ``replicas`` and ``replica_timeout`` as for :meth:`send`: every chunk's append
        waits for the replicas of its partition's master.

        Error handling:
            As :meth:`send`. If Redis fails midway, the windows before the failing one
            have been sent and later ones have not; the failing one may be partly sent.
            With :class:`~streamkit.NotReplicated`, the failing window's chunks are on
            their masters, some of them maybe not yet on replicas.
        """
        chunk = chunk_size if chunk_size is not None else self.settings.send_chunk_size
        check_send_options(chunk, replicas, replica_timeout)
        await self.check_metadata()
        server_limit = await server_bulk_limit(self._connection())
        ids: list[str] = []
        waiting = (
            replicated(self._connection(), replicas, replica_timeout)
            if replicas
            else contextlib.nullcontext()
        )
        # The tasks sending a window's partitions inherit the wait (a context variable).
        with waiting:
            # A first window of one chunk per partition: sending starts after encoding
            # that much, and the next windows are encoded while Redis appends.
            upcoming = windows(
                records, chunk, self.partition_count, first=chunk * self.partition_count
            )
            window_records = next(upcoming, None)
            if window_records is None:
                return ids
            window = encode_window(self.spec, window_records, server_limit)
            while True:
                # While Redis appends a window, the next one is read and encoded.
                following: list[R] | None = None
                ahead: SendWindow | None = None
                failure: Exception | None = None
                try:
                    async with trio.open_nursery() as nursery:
                        for partition in window.positions:
                            nursery.start_soon(self._send_partition, window, partition, chunk)
                        try:
                            following = next(upcoming, None)
                            if following is not None:
                                ahead = await self._encode(following, server_limit, window.trace)
                        except Exception as exc:
                            # Raised once this window is sent, as if it came after.
                            failure = exc
                except BaseExceptionGroup as group:
                    # One error for the caller, as from a single partition: the first
                    # partition's failure cancelled the others (no exception-group soup).
                    raise meaningful_leaf(group) from None
                ids.extend(window.ids)
                if on_sent is not None:
                    on_sent(len(window_records))
                if failure is not None:
                    raise failure
                if following is None or ahead is None:
                    return ids
                window, window_records = ahead, following

    async def _encode(
        self, records: Sequence[R], server_limit: int, trace: tuple[bytes, ...]
    ) -> SendWindow:
        """:func:`encode_window` a slice at a time, letting the sends go on between
        (with the trace context of the send's first window)."""
        window = SendWindow(
            self.spec.codec.payloads_encoder()[1], ids=[""] * len(records), trace=trace
        )
        for start in range(0, len(records), ENCODE_SLICE):
            end = min(start + ENCODE_SLICE, len(records))
            encode_into(window, self.spec, records, start, end, server_limit)
            await trio.lowlevel.checkpoint()
        return window

    async def _send_partition(self, window: SendWindow, partition: int, chunk: int) -> None:
        for start, end in window.chunks(partition, chunk):
            sent = await self._append(partition, window.arguments(partition, start, end))
            window.landed(partition, start, sent)

    async def _append(self, partition: int, flat: list[bytes | int]) -> list[str]:
        return await append_flat(
            self._connection(),
            self.spec,
            partition,
            flat,
            partition_size=self.settings.partition_size,
            max_len=self.settings.max_len,
        )

    def __repr__(self) -> str:
        return (
            f"<Stream {self.spec.app}.{self.name} record={self.record.__qualname__} "
            f"partitions={self.partition_count}>"
        )
