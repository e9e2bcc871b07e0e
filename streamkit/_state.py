"""Partition state: a processor's table writes and emitted records, committed exactly once.

While a processor works on a partition, its effects pass through three layers, which
mirror the delivery's bookkeeping (:mod:`streamkit._events_ledger`):

* *tentative*: the effects of the events in flight. When the processor moves past
  them they are promoted; when it fails on them (a retry, a dead letter, a halt, a
  cancellation) they are discarded with them;
* *done*: the effects of events the processor moved past, waiting for the commit;
* *committed*: handed to the feed as :class:`~streamkit.Changes` with the
  acknowledgement of the events behind them, and applied by the same fenced script
  call, or not at all. A per-partition cache remembers committed values, so a hot key
  costs one round trip per partition, not one per event.

A refused or doubtful commit (the lease lost, the connection lost mid-call) stops the
partition; whoever processes it next starts from what Redis holds, and the events
whose commit did not land are delivered again. So every table and every emitted
stream reflects each event exactly once.

The state of the partition being processed is found through a context variable set by
:func:`~streamkit.open_events`: a table's ``get``/``set`` inside the processor reach
its view without passing anything around.
"""

from __future__ import annotations

import contextvars
import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio

from . import _keys
from ._commit import Changes
from ._errors import ConfigError, EncodeError, WrongPartition
from ._partitioner import canonical_key_bytes, partition_for
from ._redis import is_cluster, redis_errors
from ._spec import spec_of
from ._state_relay import OutboxRelay
from ._streams import Stream, check_metadata
from ._wire import DEFAULT_PARTITION_SIZE

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from ._locks import HeldLease
    from ._redis import Redis
    from ._spec import HasSpec, ProcessorKeys, StreamSpec

__all__ = ["DEFAULT_STATE_CACHE_SIZE", "PartitionState", "current_view", "writing_view"]

log = logging.getLogger("streamkit.state")

#: Values a partition caches per table, at most (uncommitted writes come on top).
DEFAULT_STATE_CACHE_SIZE = 10_000


class _Missing:
    """A key with no value (deleted, or never written)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_ABSENT: Any = object()


class TableLike(Protocol):
    """What the state needs of a table (:class:`~streamkit.Table`)."""

    @property
    def name(self) -> str: ...

    def encode(self, value: Any) -> bytes: ...

    def decode(self, raw: bytes) -> Any: ...

    def key(self, partition: int) -> str: ...


_current: contextvars.ContextVar[PartitionState | None] = contextvars.ContextVar(
    "streamkit_partition_state", default=None
)


def current_view(table: TableLike) -> TableView | None:
    """The view of ``table`` of the partition being processed here, if its writer."""
    state = _current.get()
    if state is None:
        return None
    return state.views.get(table)


def writing_view(table: TableLike) -> TableView:
    """As :func:`current_view`, for a write: raise unless this processor writes it."""
    view = current_view(table)
    if view is None:
        raise ConfigError(
            "tables",
            f"table {table.name!r} is written only by its processor, inside it (name "
            f"it in @app.processor(..., tables=[...]), or pass it to open_events)",
        )
    return view


class TableView:
    """One partition of one table, as its processor sees it.

    Tentative and done writes hold ``(value, encoded)`` pairs (encoded when set, so a
    bad value fails where it is written); the cache holds decoded values.
    """

    __slots__ = (
        "_cache",
        "_cache_size",
        "_dirty",
        "_partition_count",
        "_pinned",
        "_redis",
        "_tentative",
        "key",
        "partition",
        "table",
    )

    def __init__(
        self, table: TableLike, partition: int, partition_count: int, redis: Redis, cache_size: int
    ) -> None:
        self.table = table
        self.partition = partition
        self.key = table.key(partition)
        self._partition_count = partition_count
        self._redis = redis
        self._cache_size = cache_size
        self._tentative: dict[bytes, tuple[Any, bytes | None]] = {}
        self._dirty: dict[bytes, tuple[Any, bytes | None]] = {}
        self._cache: dict[bytes, Any] = {}
        self._pinned: dict[bytes, int] = {}

    def _check(self, key: object) -> None:
        partition = partition_for(key, self._partition_count)
        if partition != self.partition:
            raise WrongPartition(self.table.name, key, partition, self.partition)

    def _known(self, field: bytes) -> Any:
        value = self._tentative.get(field, _ABSENT)
        if value is not _ABSENT:
            return value[0]
        value = self._dirty.get(field, _ABSENT)
        if value is not _ABSENT:
            return value[0]
        return self._cache.get(field, _ABSENT)

    async def get(self, key: object, default: Any) -> Any:
        """The value of ``key``: uncommitted writes, then the cache, then Redis."""
        await trio.lowlevel.checkpoint_if_cancelled()
        field = canonical_key_bytes(key)
        value = self._known(field)
        if value is _ABSENT:
            self._check(key)
            with redis_errors():
                raw = await self._redis.hget(self.key, field)
            value = MISSING if raw is None else self.table.decode(raw)
            self._remember(field, value)
        return default if value is MISSING else value

    async def get_many(self, keys: Sequence[object], default: Any) -> list[Any]:
        """The values of ``keys``; one ``HMGET`` for those not known here."""
        await trio.lowlevel.checkpoint_if_cancelled()
        fields = [canonical_key_bytes(k) for k in keys]
        values = [self._known(f) for f in fields]
        unknown = [i for i, v in enumerate(values) if v is _ABSENT]
        if unknown:
            for i in unknown:
                self._check(keys[i])
            with redis_errors():
                raws = await self._redis.hmget(self.key, [fields[i] for i in unknown])
            for i, raw in zip(unknown, raws, strict=True):
                value = MISSING if raw is None else self.table.decode(raw)
                self._remember(fields[i], value)
                values[i] = value
        return [default if v is MISSING else v for v in values]

    def set(self, key: object, value: Any) -> None:
        """Write ``value`` under ``key`` (tentatively)."""
        field = canonical_key_bytes(key)
        if self._known(field) is _ABSENT:
            self._check(key)
        self._tentative[field] = (value, self.table.encode(value))

    def delete(self, key: object) -> None:
        """Remove ``key`` (tentatively)."""
        field = canonical_key_bytes(key)
        if self._known(field) is _ABSENT:
            self._check(key)
        self._tentative[field] = (MISSING, None)

    def _remember(self, field: bytes, value: Any) -> None:
        self._cache[field] = value
        if len(self._cache) > self._cache_size:
            self._evict()

    def _evict(self) -> None:
        cache = self._cache
        pinned = self._pinned
        # Oldest first; keys whose commit has not landed stay (a read of Redis would
        # not see their value yet).
        for _ in range(len(cache)):
            if len(cache) <= self._cache_size:
                return
            field = next(iter(cache))
            value = cache.pop(field)
            if field in pinned:
                cache[field] = value

    # -- the layers --

    def promote(self) -> None:
        if self._tentative:
            self._dirty.update(self._tentative)
            self._tentative = {}

    def discard(self) -> None:
        if self._tentative:
            self._tentative = {}

    def contribute(self, changes: Changes, pinned: list[bytes]) -> None:
        """Add the done writes to ``changes``; they count as committed from now."""
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = {}
        pairs: list[bytes | str | int | float] = []
        deleted: list[bytes | str | int | float] = []
        cache = self._cache
        for field, (value, encoded) in dirty.items():
            if encoded is None:
                deleted.append(field)
            else:
                pairs.append(field)
                pairs.append(encoded)
            cache[field] = value
            self._pinned[field] = self._pinned.get(field, 0) + 1
            pinned.append(field)
        changes.hset(self.key, pairs)
        changes.hdel(self.key, deleted)
        if len(cache) > self._cache_size:
            self._evict()

    def unpin(self, fields: list[bytes]) -> None:
        pinned = self._pinned
        for field in fields:
            left = pinned[field] - 1
            if left:
                pinned[field] = left
            else:
                del pinned[field]

    def __repr__(self) -> str:
        return (
            f"<TableView {self.table.name!r} partition {self.partition}: cached "
            f"{len(self._cache)}, uncommitted {len(self._tentative) + len(self._dirty)}>"
        )


class PartitionState:
    """The state of one partition of one processor: its tables and emitted records.

    Created by :func:`~streamkit.open_events` (``tables=``, ``outputs=``) for the
    partition it opens; see the module docs for the layers.

    Attributes:
        partition: the partition.
        views: each table's view of the partition.
        outputs: the streams the processor may emit to, by name.
    """

    def __init__(
        self,
        redis: Redis,
        stream: StreamSpec[Any],
        keys: ProcessorKeys,
        partition: int,
        *,
        tables: Iterable[TableLike] = (),
        outputs: Iterable[StreamSpec[Any] | HasSpec[Any]] = (),
        cache_size: int = DEFAULT_STATE_CACHE_SIZE,
    ) -> None:
        self.partition = partition
        self._redis = redis
        self._stream = stream
        self.views: dict[TableLike, TableView] = {
            table: TableView(table, partition, stream.partition_count, redis, cache_size)
            for table in tables
        }
        outputs = list(outputs)
        self.outputs: dict[str, StreamSpec[Any]] = {spec_of(o).name: spec_of(o) for o in outputs}
        # Entries each output's partitions keep when appends trim them.
        self._keep = {
            spec_of(o).name: (
                o.settings.partition_size if isinstance(o, Stream) else DEFAULT_PARTITION_SIZE
            )
            for o in outputs
        }
        self._keep_of_key: dict[str, int] = {}
        self._outbox = (
            _keys.outbox_key(stream.app, stream.name, keys.processor, partition)
            if is_cluster(redis) and self.outputs
            else None
        )
        self._source = f"{stream.app}.{stream.name}.{partition}.{keys.processor}"
        self.relay: OutboxRelay | None = None
        self._tentative_out: list[tuple[str, list[bytes | str | int | float]]] = []
        self._done_out: list[tuple[str, list[bytes | str | int | float]]] = []

    async def open(self) -> None:
        """Check the output streams' metadata (they may be written by this commit)."""
        for spec in self.outputs.values():
            await check_metadata(self._redis, spec)

    # -- emitting --

    def emit(self, stream: StreamSpec[Any] | HasSpec[Any], record: Any) -> None:
        """Emit ``record`` to ``stream`` (tentatively, in order)."""
        spec = spec_of(stream)
        if self.outputs.get(spec.name) != spec:
            raise ConfigError(
                "outputs",
                f"{spec.name!r} is not an output of this processor: name it in "
                f"@app.processor(..., outputs=[...])",
            )
        try:
            fields = spec.codec.encode(record)
        except EncodeError:
            raise
        except Exception as exc:
            raise EncodeError(f"cannot encode {record!r} for {spec.name}: {exc}") from exc
        target = spec.key(spec.partition_of(record))
        if target not in self._keep_of_key:
            self._keep_of_key[target] = self._keep[spec.name]
        pairs: list[bytes | str | int | float] = []
        if self._outbox is not None:
            pairs.append(b"__to")
            pairs.append(target.encode())
        for name, value in fields.items():
            pairs.append(name)
            pairs.append(value)
        self._tentative_out.append((target, pairs))

    # -- the layers --

    def promote(self) -> None:
        """The events in flight were processed: their effects are done."""
        for view in self.views.values():
            view.promote()
        if self._tentative_out:
            self._done_out.extend(self._tentative_out)
            self._tentative_out = []

    def discard(self) -> None:
        """The events in flight failed: forget their effects."""
        for view in self.views.values():
            view.discard()
        self._tentative_out = []

    def take_changes(self) -> Changes | None:
        """The done effects, as changes for the next commit; ``None`` if there are none."""
        pins: list[tuple[TableView, list[bytes]]] = []
        changes = Changes()
        for view in self.views.values():
            pinned: list[bytes] = []
            view.contribute(changes, pinned)
            if pinned:
                pins.append((view, pinned))
        relay = None
        if self._done_out:
            outbox = self._outbox
            for target, pairs in self._done_out:
                changes.xadd(outbox or target, pairs)
            self._done_out = []
            relay = self.relay
        if not changes:
            return None
        if pins or relay is not None:

            def landed() -> None:
                for view, fields in pins:
                    view.unpin(fields)
                if relay is not None:
                    relay.wake()

            changes.on_landed = landed
        return changes

    def start_relay(self, held: HeldLease) -> OutboxRelay | None:
        """The relay of this partition's outbox (Redis Cluster, with outputs), if any:
        run its :meth:`~streamkit._state_relay.OutboxRelay.run` in the partition."""
        if self._outbox is None:
            return None
        self.relay = OutboxRelay(
            self._redis,
            self._outbox,
            self._source,
            held,
            lambda key: self._keep_of_key.get(key, DEFAULT_PARTITION_SIZE),
        )
        return self.relay

    def activate(self) -> contextvars.Token[PartitionState | None]:
        """Make this the state tables find in this task (and the tasks it starts)."""
        return _current.set(self)

    @staticmethod
    def deactivate(token: contextvars.Token[PartitionState | None]) -> None:
        _current.reset(token)

    def __repr__(self) -> str:
        return (
            f"<PartitionState {self._stream.name} partition {self.partition}: "
            f"{len(self.views)} tables, {len(self.outputs)} outputs>"
        )
