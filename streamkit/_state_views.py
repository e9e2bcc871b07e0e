"""Views: one partition of one table as its processor sees it, in three layers.

A :class:`TableView` keeps a partition's tentative writes (of the events in flight),
its done writes (waiting for the commit) and a cache of committed values; a
:class:`WindowView` adds windows on top: each key's value is its list of windows
(:mod:`streamkit._windows`), a sorted set indexes the keys by when they are next due,
and :meth:`WindowView.settle` closes the windows the watermark has passed. The
partition's :class:`~streamkit._state.PartitionState` owns the views and the
watermark.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import trio

from ._errors import WrongPartition
from ._partitioner import canonical_key_bytes, partition_for
from ._redis import hot_hget, redis_errors
from ._windows import Slot, apply, next_action, settle

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Sequence

    from ._commit import Changes
    from ._redis import Redis
    from ._windows import WindowKind

__all__ = [
    "MISSING",
    "UNKNOWN",
    "GlobalWriterView",
    "TableLike",
    "TableView",
    "WindowLike",
    "WindowView",
]

#: Due keys a settling round reads, at most (the rest wait for the next round).
SETTLE_BATCH = 500


class _Missing:
    """A key with no value (deleted, or never written)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
#: Value types the records' converter passes through as they are: a value of exactly
#: one of them is stored as ``orjson.dumps(value)``, the converter skipped.
PLAIN_TYPES = frozenset({int, float, str, bool})

#: What :meth:`TableView.peek` returns for a key not known without Redis.
UNKNOWN: Any = object()
_ABSENT: Any = UNKNOWN


class TableLike(Protocol):
    """What a view needs of a table (:class:`~streamkit.Table`)."""

    @property
    def name(self) -> str: ...

    def encode(self, value: Any) -> bytes: ...

    def decode(self, raw: bytes) -> Any: ...

    def key(self, partition: int) -> str: ...


class WindowLike(TableLike, Protocol):
    """What a view needs of a windowed table (:class:`~streamkit.WindowedTable`)."""

    @property
    def kind(self) -> WindowKind: ...

    @property
    def initial(self) -> Any: ...

    @property
    def grace(self) -> int: ...

    @property
    def retention(self) -> int: ...

    @property
    def merge(self) -> Callable[[Any, Any], Any] | None: ...

    @property
    def idle(self) -> bool: ...

    def index_key(self, partition: int) -> str: ...


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
        "_plain",
        "_redis",
        "_seen_field",
        "_seen_key",
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
        # The table's value type if the converter passes its values through as they
        # are (see PLAIN_TYPES): such a value is encoded here, a call fewer per write.
        value_type = getattr(table, "value", None)
        self._plain: type | None = value_type if value_type in PLAIN_TYPES else None
        # The last str key peek found here, and its field: the set that follows a get
        # of the same key (the usual read-modify-write) needs neither again.
        self._seen_key: object = None
        self._seen_field = b""

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

    def peek(self, key: object) -> Any:
        """The value of ``key`` if known here (``MISSING`` if known to be absent),
        else ``UNKNOWN``: without Redis, so a table's :meth:`get` of a hot key is one
        call, not a coroutine."""
        field = canonical_key_bytes(key)
        # _known, inlined: this runs once per event of a stateful processor.
        tentative = self._tentative
        value = tentative.get(field, _ABSENT) if tentative else _ABSENT
        if value is _ABSENT:
            value = self._dirty.get(field, _ABSENT)
            if value is _ABSENT:
                value = self._cache.get(field, _ABSENT)
                if value is not _ABSENT and type(key) is str:
                    self._seen_key = key
                    self._seen_field = field
                return value
        if type(key) is str:
            self._seen_key = key
            self._seen_field = field
        return value[0]

    async def get(self, key: object, default: Any) -> Any:
        """The value of ``key``: uncommitted writes, then the cache, then Redis.

        A value known here is returned without a checkpoint (the processor's loop has
        one per event); a read of Redis is one.
        """
        value = self.peek(key)
        if value is _ABSENT:
            field = canonical_key_bytes(key)
            self._check(key)
            with redis_errors():
                raw = await hot_hget(self._redis, self.key, field)
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

    async def prefetch(self, fields: Iterable[bytes], *, checked: bool = True) -> None:
        """Read into the cache, in one ``HMGET``, those of ``fields`` (canonical keys)
        not known here: a batch's reads that follow cost no round trip each. Unless
        ``checked`` (known to be of this partition), a key of another partition is
        left out (its ``get`` raises :class:`WrongPartition` as it should). Room is
        made first, and never by evicting one of ``fields``: what the batch reads
        next is all here."""
        fields = list(fields)
        unknown = self._unknown(fields, checked=checked)
        if not unknown:
            return
        with redis_errors():
            raws = await self._redis.hmget(self.key, unknown)
        cache = self._cache
        if len(cache) + len(unknown) > self._cache_size:
            self._evict(keep=set(fields), room=len(unknown))
        decode = self.table.decode
        for field, raw in zip(unknown, raws, strict=True):
            cache[field] = MISSING if raw is None else decode(raw)

    def _unknown(self, fields: Iterable[bytes], *, checked: bool) -> list[bytes]:
        """Those of ``fields`` not known here (of this partition, unless ``checked``)."""
        tentative, dirty, cache = self._tentative, self._dirty, self._cache
        unknown = [f for f in fields if f not in tentative and f not in dirty and f not in cache]
        if not checked:
            count, partition = self._partition_count, self.partition
            unknown = [f for f in unknown if partition_for(f, count) == partition]
        return unknown

    def set(self, key: object, value: Any) -> None:
        """Write ``value`` under ``key`` (tentatively)."""
        if key is self._seen_key:  # known here, so of this partition
            field = self._seen_field
        else:
            field = canonical_key_bytes(key)
            known = field in self._tentative or field in self._dirty or field in self._cache
            if not known:
                self._check(key)
        if type(value) is self._plain:
            self._tentative[field] = (value, orjson.dumps(value))
        else:
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

    def _evict(self, keep: Container[bytes] = (), room: int = 0) -> None:
        """Make the cache a tenth smaller than its size, with ``room`` more to spare,
        oldest first, never evicting a field of ``keep``."""
        cache = self._cache
        for field in self._to_evict(keep, room):
            del cache[field]

    def _to_evict(self, keep: Container[bytes], room: int) -> list[bytes]:
        """The fields :meth:`_evict` evicts."""
        cache = self._cache
        pinned = self._pinned
        # Oldest first, a tenth of the cache at a time (one pass over the oldest, not a
        # pass per key: popping a dict's first key one at a time scans the holes the
        # pops before left); keys whose commit has not landed stay (a read of Redis
        # would not see their value yet).
        excess = len(cache) + room - (self._cache_size - self._cache_size // 10)
        gone: list[bytes] = []
        for field in cache:
            if len(gone) >= excess:
                break
            if field not in pinned and field not in keep:
                gone.append(field)
        return gone

    # -- the layers --

    def promote(self) -> None:
        tentative = self._tentative
        if tentative:
            self._dirty.update(tentative)
            tentative.clear()

    def discard(self) -> None:
        if self._tentative:
            self._tentative = {}

    def contribute(self, changes: Changes, pinned: list[bytes]) -> None:
        """Add the done writes to ``changes``; they count as committed from now."""
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = {}
        self._index(changes, dirty)
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

    def done_writes(self) -> dict[bytes, tuple[Any, bytes | None]]:
        """The done writes the next commit carries: ``(value, encoded)`` by field
        (``encoded`` ``None``: deleted)."""
        return self._dirty

    def _index(self, changes: Changes, dirty: dict[bytes, tuple[Any, bytes | None]]) -> None:
        """Add what else the done writes change (a windowed table's index)."""

    def unpin(self, fields: list[bytes]) -> None:
        pinned = self._pinned
        for field in fields:
            left = pinned[field] - 1
            if left:
                pinned[field] = left
            else:
                del pinned[field]
                self._landed(field)

    def _landed(self, field: bytes) -> None:
        """Every commit writing ``field`` landed."""

    def __repr__(self) -> str:
        return (
            f"<TableView {self.table.name!r} partition {self.partition}: cached "
            f"{len(self._cache)}, uncommitted {len(self._tentative) + len(self._dirty)}>"
        )


class GlobalWriterView(TableView):
    """A global table as its writer sees it, in any of its partitions: any key may be
    written; its writes reach the table's one hash as changes (sent on by the commit,
    see :class:`~streamkit.GlobalTable`), never directly; reads are its own writes,
    then its cache, then the table as applied."""

    __slots__ = ()

    def _check(self, key: object) -> None:
        """Every key is this view's: a global table is not partitioned."""

    def contribute(self, changes: Changes, pinned: list[bytes]) -> None:
        """The done writes count as committed from now; they travel as changes."""
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = {}
        cache = self._cache
        for field, (value, _) in dirty.items():
            cache[field] = value
        if len(cache) > self._cache_size:
            self._evict()


class WindowView(TableView):
    """One partition of a windowed table: each key's value is its list of windows.

    Attributes:
        watermark: the partition's watermark (ms), as the view last saw it.
        late: late events counted (done) since the partition started here.
        next_due: the earliest time (ms) some key's windows need the watermark.
    """

    __slots__ = (
        "_late_tentative",
        "_pending",
        "index",
        "late",
        "next_due",
        "on_time",
        "watermark",
        "window",
    )

    def __init__(
        self, table: WindowLike, partition: int, partition_count: int, redis: Redis, cache_size: int
    ) -> None:
        super().__init__(table, partition, partition_count, redis, cache_size)
        self.window = table
        self.index = table.index_key(partition)
        self.watermark = -math.inf
        self.late = 0
        self._late_tentative = 0
        self.next_due: float = math.inf
        # Keys written and not yet landed, with their due time: Redis's index does
        # not show them yet.
        self._pending: dict[bytes, float] = {}
        # Told the event time of each event folded in (the partition's watermark).
        self.on_time: Callable[[int], None] = lambda at: None

    async def open(self) -> None:
        """Learn the earliest due time from the index."""
        with redis_errors():
            first: Any = await self._redis.zrange(self.index, 0, 0, withscores=True)
        self.next_due = float(first[0][1]) if first else math.inf

    async def update(
        self, key: object, at: int, fn: Callable[..., Any], args: tuple[Any, ...] = ()
    ) -> bool:
        """Fold an event at ``at`` into ``key``'s windows (tentatively): ``fn(value,
        *args)`` for each; ``True`` if late."""
        slots: list[Slot] = await self.get(key, [])
        window = self.window
        new, late = apply(
            slots,
            window.kind,
            at,
            (lambda value: fn(value, *args)) if args else fn,
            initial=window.initial,
            watermark=int(self.watermark) if self.watermark > -math.inf else -(2**62),
            grace=window.grace,
            merge=window.merge,
        )
        if late:
            self._late_tentative += 1
            return True
        self.set(key, new)
        self.on_time(at)
        return False

    def promote(self) -> None:
        super().promote()
        if self._late_tentative:
            self.late += self._late_tentative
            self._late_tentative = 0

    def discard(self) -> None:
        super().discard()
        self._late_tentative = 0

    def _score(self, slots: Any) -> float | None:
        if slots is MISSING or not slots:
            return None
        return next_action(slots, grace=self.window.grace, retention=self.window.retention)

    def _settle_value(
        self, field: bytes, slots: Any, watermark: int
    ) -> tuple[bool, Any, list[Any]]:
        """``field``'s value at ``watermark``: whether it changed, what is kept (empty:
        the key goes), and what closed now (``(field, start, end, value)`` each)."""
        window = self.window
        kept, now_closed = settle(
            slots, watermark=watermark, grace=window.grace, retention=window.retention
        )
        changed = len(kept) != len(slots) or bool(now_closed)
        return changed, kept, [(field, s.start, s.end, s.value) for s in now_closed]

    def _index(self, changes: Changes, dirty: dict[bytes, tuple[Any, bytes | None]]) -> None:
        scored: list[bytes | str | int | float] = []
        gone: list[bytes | str | int | float] = []
        for field, (slots, _) in dirty.items():
            score = self._score(slots)
            if score is None:
                gone.append(field)
                self._pending.pop(field, None)
            else:
                scored.append(score)
                scored.append(field)
                self._pending[field] = score
                self.next_due = min(self.next_due, score)
        changes.zadd(self.index, scored)
        changes.zrem(self.index, gone)

    def _landed(self, field: bytes) -> None:
        self._pending.pop(field, None)

    def set(self, key: object, value: Any) -> None:
        super().set(key, value)
        score = self._score(value)
        if score is not None:
            self.next_due = min(self.next_due, score)

    async def settle(self, watermark: int) -> list[Any]:
        """Close the windows ``watermark`` has passed and drop expired ones (as done
        writes); return the windows closed now, to emit once.

        Keys with tentative writes (events in flight) wait for a later round.
        """
        if watermark < self.next_due:
            return []
        # The keys whose commit is in flight, as they are before the read: one landing
        # while the index is read (on another connection) may be neither in what the
        # read returns nor pending after it, and would wait for a later watermark.
        pending = dict(self._pending)
        with redis_errors():
            ranked: Any = await self._redis.zrange(self.index, 0, SETTLE_BATCH, withscores=True)
        due = {member for member, score in ranked if score <= watermark}
        later = [score for _, score in ranked if score > watermark]
        more = len(ranked) > SETTLE_BATCH and not later
        due.update(f for f, score in pending.items() if score <= watermark)
        for field, (slots, _) in self._dirty.items():
            score = self._score(slots)
            if score is not None and score <= watermark:
                due.add(field)
        due.difference_update(self._tentative)
        known = {f: self._known(f) for f in due}
        unknown = [f for f, v in known.items() if v is _ABSENT]
        if unknown:
            with redis_errors():
                raws = await self._redis.hmget(self.key, unknown)
            for field, raw in zip(unknown, raws, strict=True):
                value = MISSING if raw is None else self.table.decode(raw)
                self._remember(field, value)
                known[field] = value
        closed: list[Any] = []
        for field, slots in known.items():
            if slots is MISSING:
                continue
            changed, kept, now_closed = self._settle_value(field, slots, watermark)
            if not changed:
                continue
            closed.extend(now_closed)
            self._dirty[field] = (kept, self.table.encode(kept)) if kept else (MISSING, None)
        # Keys with writes not yet handed over count by those; then the handed over
        # and not landed; then what Redis's index says.
        upcoming = [watermark if more else (later[0] if later else math.inf)]
        upcoming.extend(s for f, s in pending.items() if f not in self._dirty)
        for layer in (self._dirty, self._tentative):
            for slots, _ in layer.values():
                score = self._score(slots)
                if score is not None:
                    upcoming.append(score)
        self.next_due = min(upcoming)
        return closed
