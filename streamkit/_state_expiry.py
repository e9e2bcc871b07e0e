"""Tables whose keys expire: a key is gone ``ttl`` after its last write.

The time of a write is the time the event behind it was appended to the stream (its
entry id's time), so a replay expires keys exactly as the first run did. A sorted set
beside the table, ``__texp:{app.stream.N}.table``, scores each key by when it expires.

* Inside the processor (:class:`ExpiringTableView`), a key whose deadline is at or
  before the time of the event being processed reads as missing, whatever Redis or the
  cache still holds: the event sees the table as of its own time.
* The space is given back by the partition's commits, under the lease: before a commit
  the view reads up to :data:`SWEEP_BATCH` keys due by the partition's clock (the time
  of the newest event processed, moving on with the wall clock while the partition is
  idle, as a window's watermark does) and deletes them in the commit, with the
  acknowledgements; a key written meanwhile (its deadline here is later) is kept. No
  sweeper process, no ``HEXPIRE`` (Redis 7.0 has none), bounded work per commit.
* Readers elsewhere (``read``, ``items``, the clients, the CLI, Spark) judge by the Redis
  server's clock: a key past its deadline is never returned, swept yet or not (see
  :mod:`streamkit._tables`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import trio

from ._lua import script
from ._partitioner import canonical_key_bytes
from ._redis import LuaScript, redis_errors
from ._state_views import MISSING, UNKNOWN, TableView

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Sequence

    from ._commit import Changes
    from ._redis import Redis
    from ._state_views import TableLike

__all__ = ["SWEEP_BATCH", "ExpiringTableView"]

#: Expired keys one commit deletes, at most (the rest go with the next commits).
SWEEP_BATCH = 500

_ABSENT: Any = UNKNOWN

_DUE = LuaScript(script("tables/due"))


class ExpiringTableView(TableView):
    """One partition of a table with a ``ttl``, as its processor sees it.

    Attributes:
        now: the time (ms) of the event being processed: the partition's clock.
        next_due: the earliest deadline (ms) of a key this view knows of (``inf``:
            none), when the partition must sweep.
    """

    __slots__ = (
        "_deadlines",
        "_done_deadlines",
        "_expiry_key",
        "_landing",
        "_tentative_deadlines",
        "_ttl",
        "_unknown_head",
        "next_due",
        "now",
    )

    def __init__(
        self, table: TableLike, partition: int, partition_count: int, redis: Redis, cache_size: int
    ) -> None:
        super().__init__(table, partition, partition_count, redis, cache_size)
        ttl = getattr(table, "ttl", None)
        assert isinstance(ttl, int)
        self._ttl = ttl
        self._expiry_key: str = table.expiry_key(partition)  # type: ignore[attr-defined]
        # The deadline of every value known here (cached, done, in flight), by field.
        self._deadlines: dict[bytes, int] = {}
        self._tentative_deadlines: dict[bytes, int] = {}
        self._done_deadlines: dict[bytes, int] = {}
        # The deadlines of commits in flight, by field (not in Redis's index yet).
        self._landing: dict[bytes, int] = {}
        self.now: Callable[[], int] = lambda: 0
        self.next_due: float = math.inf
        # Whether Redis may hold keys due earlier than next_due (not read since a sweep).
        self._unknown_head = True

    async def open(self) -> None:
        """Learn the earliest deadline from the index."""
        with redis_errors():
            first: Any = await self._redis.zrange(self._expiry_key, 0, 0, withscores=True)
        self.next_due = float(first[0][1]) if first else math.inf
        self._unknown_head = False

    def _alive(self, field: bytes, value: Any) -> Any:
        """``value`` of ``field``, or ``MISSING`` if its deadline has passed."""
        if value is MISSING or value is _ABSENT:
            return value
        deadline = self._tentative_deadlines.get(field)
        if deadline is None:
            deadline = self._done_deadlines.get(field)
            if deadline is None:
                deadline = self._deadlines.get(field)
                if deadline is None:
                    return value
        return MISSING if deadline <= self.now() else value

    def peek(self, key: object) -> Any:
        field = key.encode() if type(key) is str else canonical_key_bytes(key)
        if type(key) is str:
            self._seen_key = key
            self._seen_field = field
        return self._alive(field, self._known(field))

    async def get(self, key: object, default: Any) -> Any:
        field = canonical_key_bytes(key)
        value = self._alive(field, self._known(field))
        if value is _ABSENT:
            self._check(key)
            value = (await self._read([field]))[0]
        return default if value is MISSING else value

    async def get_many(self, keys: Sequence[object], default: Any) -> list[Any]:
        await trio.lowlevel.checkpoint_if_cancelled()
        fields = [canonical_key_bytes(k) for k in keys]
        values = [self._alive(f, self._known(f)) for f in fields]
        unknown = [i for i, v in enumerate(values) if v is _ABSENT]
        if unknown:
            for i in unknown:
                self._check(keys[i])
            read = await self._read([fields[i] for i in unknown])
            for i, value in zip(unknown, read, strict=True):
                values[i] = value
        return [default if v is MISSING else v for v in values]

    async def prefetch(self, fields: Iterable[bytes], *, checked: bool = True) -> None:
        """As :meth:`TableView.prefetch`, with the keys' deadlines."""
        unknown = self._unknown(fields, checked=checked)
        if unknown:
            await self._read(unknown)

    async def _read(self, fields: list[bytes]) -> list[Any]:
        """Read ``fields`` and their deadlines from Redis; remember them."""
        with redis_errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                raws_request = pipe.hmget(self.key, fields)
                deadlines_request = pipe.zmscore(self._expiry_key, fields)
            raws: Any = await raws_request
            deadlines: Any = await deadlines_request
        out = []
        for field, raw, deadline in zip(fields, raws, deadlines, strict=True):
            value = MISSING if raw is None else self.table.decode(raw)
            if value is not MISSING and deadline is not None:
                self._deadlines[field] = int(deadline)
            self._remember(field, value)
            out.append(self._alive(field, value))
        return out

    def set(self, key: object, value: Any) -> None:
        super().set(key, value)
        field = self._seen_field if key is self._seen_key else canonical_key_bytes(key)
        self._tentative_deadlines[field] = self.now() + self._ttl

    def delete(self, key: object) -> None:
        super().delete(key)
        self._tentative_deadlines.pop(canonical_key_bytes(key), None)

    # -- the layers --

    def promote(self) -> None:
        super().promote()
        if self._tentative_deadlines:
            self._done_deadlines.update(self._tentative_deadlines)
            self._tentative_deadlines.clear()

    def discard(self) -> None:
        super().discard()
        self._tentative_deadlines.clear()

    def contribute(self, changes: Changes, pinned: list[bytes]) -> None:
        dirty = self._dirty
        scored: list[bytes | str | int | float] = []
        gone: list[bytes | str | int | float] = []
        done_deadlines = self._done_deadlines
        for field, (_, encoded) in dirty.items():
            if encoded is None:
                gone.append(field)
                self._deadlines.pop(field, None)
                self._landing.pop(field, None)
            else:
                deadline = done_deadlines.get(field)
                if deadline is None:
                    continue
                scored.append(deadline)
                scored.append(field)
                self._deadlines[field] = deadline
                self._landing[field] = deadline
                self.next_due = min(self.next_due, deadline)
        done_deadlines.clear()
        super().contribute(changes, pinned)
        changes.zadd(self._expiry_key, scored)
        changes.zrem(self._expiry_key, gone)

    def _landed(self, field: bytes) -> None:
        self._landing.pop(field, None)

    def _evict(self, keep: Container[bytes] = (), room: int = 0) -> None:
        super()._evict(keep, room)
        deadlines = self._deadlines
        if len(deadlines) > 2 * self._cache_size:
            cache = self._cache
            self._deadlines = {f: d for f, d in deadlines.items() if f in cache}

    # -- sweeping --

    async def sweep(self, clock: int) -> None:
        """Delete (as done writes) up to :data:`SWEEP_BATCH` keys due at ``clock`` (ms):
        keys written since, whose deadline here is later, stay."""
        if clock < self.next_due and not self._unknown_head:
            return
        # Keys whose commit is in flight: one landing while the index is read may be in
        # neither what the read returns nor in flight after it (see WindowView.settle).
        landing = [f for f, d in self._landing.items() if d <= clock]
        with redis_errors():
            reply: Any = await _DUE(self._redis, keys=[self._expiry_key], args=[clock, SWEEP_BATCH])
        due, after = reply
        expired: list[bytes] = []
        for field in dict.fromkeys([*due[::2], *landing]):
            known = self._done_deadlines.get(field) or self._deadlines.get(field)
            if known is not None and known > clock:
                continue  # written again since: a later deadline
            if field in self._tentative:
                continue  # being written by the events in flight
            expired.append(field)
        for field in expired:
            self._dirty[field] = (MISSING, None)
        self._unknown_head = False
        later = [d for d in self._deadlines.values() if d > clock]
        self.next_due = min([math.inf if after is None else float(after), *later])

    def __repr__(self) -> str:
        return (
            f"<ExpiringTableView {self.table.name!r} partition {self.partition}: cached "
            f"{len(self._cache)}, next due {self.next_due}>"
        )
