"""Fixed windows (tumbling, hopping) of one partition, as their processor sees them.

A key's value in a window is one hash field, and each window is a hash of its own:
window ``S`` (its start, in ms) of partition N is ``__wval:{app.stream.N}.table:S``,
holding every key's value for that window. A sorted set, ``__wins:{app.stream.N}.table``,
lists the windows that exist, each scored by when the watermark must come back to it:
an open window (member ``S``) at its end plus the grace period, a closed window kept
readable for the retention (member ``S:c``, its values moved to
``__wcls:{app.stream.N}.table:S``) at its end plus the retention.

So an update costs what a table's write costs whatever the number of windows a key has
open: one value looked up (a new window needs no read at all) and, at the commit, one
hash field written; the index is written once per window, not per update. Closing a
window reads its hash in pages (:data:`CLOSE_BATCH` keys a round), emits each key's
result and removes the page, in the commit that carries the results, so a window of
many keys closes over several commits of bounded size, each exactly once.

Two layers, each kept per window: the values written since the last commit (done, or
tentative: of the events in flight, with what each replaced in an undo log, so that
an event done costs nothing and one failed is taken back), and a cache of committed
ones. A window with a commit in flight (pinned) is not closed
until that commit lands, so the page read from Redis is the whole truth.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ._errors import WrongPartition
from ._event import UNDECODED
from ._keys import (
    closed_window_member as closed_member,
    open_window_member as open_member,
    parse_window_member as parse_member,
)
from ._partitioner import canonical_key_bytes, partition_for
from ._redis import hot_hget, redis_errors

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from ._commit import Changes
    from ._redis import Redis

__all__ = [
    "CLOSE_BATCH",
    "Closed",
    "FixedWindowLike",
    "FixedWindowView",
]

#: Keys of one window a settling round closes, at most (the rest close in later rounds).
CLOSE_BATCH = 500

#: Keys of a window closed now: ``(start ms, end ms, {key field: final value})``.
Closed = tuple[int, int, dict[bytes, Any]]

_ABSENT: Any = object()
#: What :meth:`FixedWindowView.fold` says when a value must be read from Redis first.
NEEDS_READ: Any = object()


class FixedWindowLike(Protocol):
    """What the view needs of a tumbling or hopping windowed table."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> Any: ...

    @property
    def initial(self) -> Any: ...

    @property
    def grace(self) -> int: ...

    @property
    def retention(self) -> int: ...

    @property
    def idle(self) -> bool: ...

    def encode_value(self, value: Any) -> bytes: ...

    def decode_value(self, raw: bytes) -> Any: ...

    @property
    def time(self) -> object: ...

    def time_of(self, at: object) -> int: ...

    def windows_key(self, partition: int) -> str: ...

    def values_key(self, partition: int, start: int) -> str: ...

    def closed_key(self, partition: int, start: int) -> str: ...


class FixedWindowView:
    """One partition of a tumbling or hopping windowed table (see the module docs).

    Attributes:
        table: the windowed table.
        window: the same, as the settings of its windows.
        partition: the partition.
        watermark: the partition's watermark (ms), as the view last saw it.
        late: late events counted (done) since the partition started here.
        next_due: the earliest time (ms) a window needs the watermark (``inf``: none).
        on_time: told the event time of each event folded in.
    """

    def __init__(
        self,
        table: FixedWindowLike,
        partition: int,
        partition_count: int,
        redis: Redis,
        cache_size: int,
    ) -> None:
        self.table = table
        self.window = table
        self.partition = partition
        self._partition_count = partition_count
        self._redis = redis
        self._cache_size = cache_size
        kind: Any = table.kind
        self._size: int = kind.size
        # Tumbling: the one span of a time is computed inline (the usual case).
        self._spans: Callable[[int], list[tuple[int, int]]] | None = (
            None if getattr(kind, "advance", None) is None else kind.spans
        )
        self._grace: int = table.grace
        # The value type, if values of exactly it are stored as orjson writes them.
        value_type = getattr(table, "value", None)
        self._plain: type | None = value_type if value_type in (int, float, str, bool) else None
        # A closed window stays (readable) only if the retention outlasts the grace.
        self._retain = table.retention > table.grace
        self._index = table.windows_key(partition)
        self._values_key = table.values_key
        self._closed_key = table.closed_key
        self.watermark: float = -math.inf
        self.late = 0
        self._late_tentative = 0
        self.next_due: float = math.inf
        self.on_time: Callable[[int], None] = lambda at: None
        # The writes since the last commit and the cache, per window: key field ->
        # value; of those writes, the ones of the events in flight, as (window start,
        # key field, the value it replaced or _ABSENT), oldest first.
        self._dirty: dict[int, dict[bytes, Any]] = {}
        self._undo: list[tuple[int, bytes, Any]] = []
        self._cache: dict[int, dict[bytes, Any]] = {}
        self._cached = 0
        # The open windows that exist (committed, or done), by start: their due time.
        self._open: dict[int, int] = {}
        # Windows created by the events in flight, and by done ones not yet indexed.
        self._created: dict[int, int] = {}
        self._unindexed: dict[int, int] = {}
        # Closed windows kept for the retention, by start: their due time.
        self._kept: dict[int, int] = {}
        # Commits in flight writing a window's keys, by start.
        self._pins: dict[int, int] = {}
        # What closing and dropping add to the next commit: (op, key, values, start),
        # and the windows they leave half done, skipped until that commit lands.
        self._ops: list[tuple[str, str, list[Any], int]] = []
        self._queued: set[int] = set()
        # Windows whose values are in Redis (from an earlier owner, or a commit that
        # landed): a value not known here must be read there. Of those, the windows
        # created here and never evicted from the cache are wholly known here: a key
        # not in the layers has no value, and closing reads nothing.
        self._stored: set[int] = set()
        self._complete: set[int] = set()
        # Key fields known to be of this partition (bounded like the cache).
        self._checked: set[bytes] = set()

    async def open(self) -> None:
        """Learn the windows that exist from the index."""
        with redis_errors():
            ranked: Any = await self._redis.zrange(self._index, 0, -1, withscores=True)
        for member, score in ranked:
            start, _, closed = parse_member(member)
            if closed:
                self._kept[start] = int(score)
            else:
                self._open[start] = int(score)
                self._stored.add(start)
        self._recompute_due()

    # -- inside the processor --

    def _check(self, field: bytes, key: object) -> None:
        if field in self._checked:
            return
        partition = partition_for(key, self._partition_count)
        if partition != self.partition:
            raise WrongPartition(self.table.name, key, partition, self.partition)
        if len(self._checked) >= self._cache_size:
            self._checked.clear()
        self._checked.add(field)

    def _known(self, start: int, field: bytes) -> Any:
        """The value of ``field`` in window ``start`` if known here, else absent."""
        value = _ABSENT
        values = self._dirty.get(start)
        if values is not None:
            value = values.get(field, _ABSENT)
        if value is _ABSENT:
            values = self._cache.get(start)
            if values is not None:
                value = values.get(field, _ABSENT)
        return value

    def _write(self, start: int, field: bytes, value: Any) -> None:
        """Write ``value`` tentatively (its event is in flight)."""
        values = self._dirty.get(start)
        if values is None:
            values = self._dirty[start] = {}
        self._undo.append((start, field, values.get(field, _ABSENT)))
        values[field] = value

    async def _read(self, start: int, field: bytes, key: object) -> Any:
        """The value of ``field`` in window ``start``, not known here."""
        self._check(field, key)
        if start not in self._stored or start in self._complete:
            return self.window.initial
        with redis_errors():
            raw = await hot_hget(self._redis, self._values_key(self.partition, start), field)
        value = self.window.initial if raw is None else self.table.decode_value(raw)
        self._remember(start, field, value)
        return value

    def _remember(self, start: int, field: bytes, value: Any) -> None:
        values = self._cache.get(start)
        if values is None:
            values = self._cache[start] = {}
        if field not in values:
            self._cached += 1
        values[field] = value
        if self._cached > self._cache_size:
            self._evict()

    def _evict(self, keep: Collection[int] = (), room: int = 0) -> None:
        # Whole windows, oldest first, but for those with a commit in flight (a read of
        # Redis would not show their values yet) and those of ``keep``, until ``room``
        # more values fit.
        for start in sorted(self._cache):
            if self._cached + room <= self._cache_size:
                return
            if start in self._pins or start in keep:
                continue
            self._cached -= len(self._cache.pop(start))
            self._complete.discard(start)

    @property
    def prefetches(self) -> bool:
        """Whether :meth:`prefetch` may read anything: the table finds its events' times
        itself (``time=``) and some window's values are in Redis, not all known here
        (an earlier owner's, or a window evicted from the cache)."""
        return self.table.time is not None and not self._complete.issuperset(self._stored)

    async def prefetch(self, records: list[Any], key_of: Callable[[Any], object]) -> None:
        """Read into the cache the values a batch's ``records`` will update, keyed by
        ``key_of`` (the stream's partition key) at the table's time of each, that are
        in Redis and not known here: one round trip for the batch, not one per event.
        Room is made first, and the windows the batch updates are kept."""
        time_of, time = self.table.time_of, self.table.time
        name = time if type(time) is str else None
        count, partition, checked = self._partition_count, self.partition, self._checked
        size, spans = self._size, self._spans
        # Windows whose values are in Redis and not all known here.
        partial = self._stored - self._complete
        touched: set[int] = set()
        wanted: dict[int, dict[bytes, None]] = {}
        try:
            for record in records:
                if record is UNDECODED:
                    continue
                at = getattr(record, name) if name is not None else time(record)  # type: ignore[operator]
                ms = round(at * 1_000_000) // 1000 if type(at) is float else time_of(at)
                if spans is None:
                    start = ms - ms % size
                    touched.add(start)
                    if start not in partial:
                        continue
                    starts: list[int] = [start]
                else:
                    starts = [start for start, _ in spans(ms)]
                    touched.update(starts)
                    starts = [start for start in starts if start in partial]
                    if not starts:
                        continue
                key = key_of(record)
                field = key.encode() if type(key) is str else canonical_key_bytes(key)
                if field not in checked and partition_for(field, count) != partition:
                    continue  # not of this partition: its update raises WrongPartition
                for start in starts:
                    fields = wanted.get(start)
                    if fields is None:
                        wanted[start] = {field: None}
                    else:
                        fields[field] = None
        except Exception:  # a bad key or time: the processor meets it, its policy decides
            return
        missing: dict[int, list[bytes]] = {}
        for start, fields in wanted.items():
            written, cached = self._dirty.get(start, {}), self._cache.get(start, {})
            needed = [f for f in fields if f not in written and f not in cached]
            if needed:
                missing[start] = needed
        if not missing:
            return
        self._evict(keep=touched, room=sum(len(f) for f in missing.values()))
        with redis_errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                requests = [
                    pipe.hmget(self._values_key(self.partition, start), unknown)
                    for start, unknown in missing.items()
                ]
            replies = [await request for request in requests]
        decode, initial = self.table.decode_value, self.window.initial
        for (start, unknown), raws in zip(missing.items(), replies, strict=True):
            values = self._cache.get(start)
            if values is None:
                values = self._cache[start] = {}
            for field, raw in zip(unknown, raws, strict=True):
                if field not in values:
                    self._cached += 1
                values[field] = initial if raw is None else decode(raw)

    def fold(self, key: object, at: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """:meth:`update` without a checkpoint when every value it needs is known here
        (the usual case): ``True`` if late, ``False`` if folded, :data:`NEEDS_READ` if a
        value must be read from Redis first (nothing changed: call :meth:`update`)."""
        if self._spans is not None:
            return NEEDS_READ
        field = key.encode() if type(key) is str else canonical_key_bytes(key)
        start = at - at % self._size
        due = start + self._size + self._grace
        if due <= self.watermark:
            self._late_tentative += 1
            return True
        # The writes since the commit, then the cache (_known and _write, inlined:
        # once per event).
        written = self._dirty.get(start)
        value = _ABSENT if written is None else written.get(field, _ABSENT)
        replaced = value
        if value is _ABSENT:
            values = self._cache.get(start)
            if values is not None:
                value = values.get(field, _ABSENT)
            if value is _ABSENT:
                if start in self._stored and start not in self._complete:
                    return NEEDS_READ
                # Wholly known here: a key not in the layers has no value yet.
                if field not in self._checked:
                    self._check(field, key)
                value = self.window.initial
        value = fn(value, *args)
        if written is None:
            written = self._dirty[start] = {}
        self._undo.append((start, field, replaced))
        written[field] = value
        if start not in self._open and start not in self._created:
            self._created[start] = due
            if due < self.next_due:
                self.next_due = due
        self.on_time(at)
        return False

    async def update(
        self, key: object, at: int, fn: Callable[..., Any], args: tuple[Any, ...] = ()
    ) -> bool:
        """Fold an event at ``at`` into ``key``'s windows (tentatively): ``fn(value,
        *args)`` for each open one containing it; ``True`` if late (all had closed)."""
        field = key.encode() if type(key) is str else canonical_key_bytes(key)
        watermark = self.watermark
        grace = self._grace
        spans = (
            self._spans(at)
            if self._spans is not None
            else [(at - at % self._size, at - at % self._size + self._size)]
        )
        late = True
        for start, end in spans:
            if end + grace <= watermark:
                continue
            late = False
            value = self._known(start, field)
            if value is _ABSENT:
                value = await self._read(start, field, key)
            self._write(start, field, fn(value, *args))
            if start not in self._open and start not in self._created:
                self._created[start] = end + grace
                if end + grace < self.next_due:
                    self.next_due = end + grace
        if late:
            self._late_tentative += 1
            return True
        self.on_time(at)
        return False

    # -- the layers --

    def promote(self) -> None:
        if self._undo:
            self._undo.clear()
        if self._created:
            self._open.update(self._created)
            self._unindexed.update(self._created)
            self._complete.update(self._created)
            self._created = {}
        if self._late_tentative:
            self.late += self._late_tentative
            self._late_tentative = 0

    def discard(self) -> None:
        if self._undo:
            self._undo_writes()
        self._created = {}
        self._late_tentative = 0
        self._recompute_due()

    def contribute(self, changes: Changes, pinned: list[Any]) -> None:
        """Add the done writes, closings and drops to ``changes``; they count as
        committed from now."""
        dirty = self._dirty
        # The writes of the events in flight are not done: out of what is committed,
        # and written again over it (replacing nothing: the committed values are cached).
        tentative = self._take_tentative() if self._undo else None
        if dirty:
            self._dirty = {}
            encode = self.table.encode_value
            plain = self._plain
            dumps = orjson.dumps
            cache = self._cache
            for start, values in dirty.items():
                pairs: list[bytes | str | int | float] = []
                for field, value in values.items():
                    pairs.append(field)
                    pairs.append(dumps(value) if type(value) is plain else encode(value))
                changes.hset(self._values_key(self.partition, start), pairs)
                # Committed from now: the cache holds them (what closing reads).
                cached = cache.get(start)
                if cached is None:
                    cache[start] = values
                    self._cached += len(values)
                else:
                    before = len(cached)
                    cached.update(values)
                    self._cached += len(cached) - before
                self._pin(start, pinned)
            if self._cached > self._cache_size:
                self._evict()
        if self._unindexed:
            scored: list[bytes | str | int | float] = []
            for start, due in self._unindexed.items():
                if start in self._open:  # not closed meanwhile (closing indexes it)
                    scored.append(due)
                    scored.append(open_member(start, start + self._size))
            self._unindexed = {}
            changes.zadd(self._index, scored)
        if tentative:
            for (start, field), value in tentative.items():
                self._write(start, field, value)
        for op, key, args, start in self._ops:
            if op == "delete":
                changes.delete(key)
            else:
                getattr(changes, op)(key, args)
            if start in self._queued:
                self._queued.discard(start)
                self._pin(start, pinned)
        self._ops = []

    def _take_tentative(self) -> dict[tuple[int, bytes], Any]:
        """Take the writes of the events in flight back out of the layer of writes:
        their newest values, by (window start, key field)."""
        dirty = self._dirty
        newest = {(start, field): dirty[start][field] for start, field, _ in self._undo}
        self._undo_writes()
        return newest

    def _undo_writes(self) -> None:
        """Undo the writes of the events in flight (newest first)."""
        dirty = self._dirty
        for start, field, replaced in reversed(self._undo):
            values = dirty[start]
            if replaced is _ABSENT:
                del values[field]
                if not values:
                    del dirty[start]
            else:
                values[field] = replaced
        self._undo.clear()

    def _pin(self, start: int, pinned: list[Any]) -> None:
        self._pins[start] = self._pins.get(start, 0) + 1
        pinned.append(start)

    def unpin(self, starts: list[Any]) -> None:
        pins = self._pins
        for start in starts:
            left = pins[start] - 1
            if left:
                pins[start] = left
            else:
                del pins[start]
                if start in self._open:
                    self._stored.add(start)

    # -- closing --

    def _recompute_due(self) -> None:
        dues = [*self._open.values(), *self._created.values(), *self._kept.values()]
        self.next_due = min(dues) if dues else math.inf

    async def settle(self, watermark: int) -> list[Closed]:
        """Close the windows ``watermark`` has passed and drop those past the retention
        (as done writes); return the windows closed now with their keys' values, to
        emit once.

        A window with writes of events in flight, or a commit in flight, waits for a
        later round.
        """
        if watermark < self.next_due:
            return []
        closed: list[Closed] = []
        busy = self._pins.keys() | self._queued | {start for start, _, _ in self._undo}
        for start, due in sorted(self._open.items()):
            if due <= watermark and start not in busy:
                values = await self._close_some(start)
                if values:
                    closed.append((start, start + self._size, values))
        for start, due in sorted(self._kept.items()):
            if due <= watermark and start not in busy:
                await self._drop_some(start)
        self._recompute_due()
        return closed

    async def _page(self, key: str) -> tuple[bool, dict[bytes, bytes]]:
        """One page of the hash ``key``: (whether it was the last, fields)."""
        with redis_errors():
            cursor, page = await self._redis.hscan(key, 0, count=CLOSE_BATCH)
        return int(cursor) == 0, dict(page)

    async def _close_some(self, start: int) -> dict[bytes, Any]:
        end = start + self._size
        values_key = self._values_key(self.partition, start)
        done = self._dirty.pop(start, {})
        stored: list[bytes]
        if start in self._complete or start not in self._stored:
            # Every value is here, the committed ones in the cache: a page of them.
            cached = self._cache.get(start, {})
            values = {**cached, **done}
            last = len(values) <= CLOSE_BATCH
            if not last:
                values = dict(itertools.islice(values.items(), CLOSE_BATCH))
                rest = {f: v for f, v in done.items() if f not in values}
                if rest:
                    self._dirty[start] = rest
            stored = [f for f in values if f in cached] if start in self._stored else []
            for field in stored:
                del cached[field]
            self._cached -= len(stored)
        else:
            last, page = await self._page(values_key)
            decode = self.table.decode_value
            values = {field: decode(raw) for field, raw in page.items()}
            values.update(done)
            # A done value may replace one committed earlier, on a page still to come:
            # removed too, so that no later page shows the older value again.
            stored = list(values)
        ops = self._ops
        if last and start in self._stored:
            # The whole window goes (every key of it is in this page): one delete, not a
            # field each.
            ops.append(("delete", values_key, [], start))
        elif stored:
            ops.append(("hdel", values_key, stored, start))
        if self._retain and values:
            encode = self.table.encode_value
            pairs: list[Any] = []
            for field, value in values.items():
                pairs.append(field)
                pairs.append(encode(value))
            ops.append(("hset", self._closed_key(self.partition, start), pairs, start))
        if last:
            del self._open[start]
            self._unindexed.pop(start, None)
            self._stored.discard(start)
            self._complete.discard(start)
            self._cached -= len(self._cache.pop(start, {}))
            ops.append(("zrem", self._index, [open_member(start, end)], start))
            if self._retain:
                due = end + self.table.retention
                self._kept[start] = due
                ops.append(("zadd", self._index, [due, closed_member(start, end)], start))
        else:
            # The rest of the window closes in a later round, once this page's removal
            # has landed (a read before would show it again).
            self._queued.add(start)
        return values

    async def _drop_some(self, start: int) -> None:
        closed_key = self._closed_key(self.partition, start)
        last, page = await self._page(closed_key)
        if page:
            self._ops.append(("hdel", closed_key, list(page), start))
        if last:
            del self._kept[start]
            member = closed_member(start, start + self._size)
            self._ops.append(("zrem", self._index, [member], start))
        else:
            self._queued.add(start)

    def __repr__(self) -> str:
        return (
            f"<FixedWindowView {self.table.name!r} partition {self.partition}: "
            f"{len(self._open)} open windows, {len(self._kept)} kept, cached {self._cached}>"
        )
