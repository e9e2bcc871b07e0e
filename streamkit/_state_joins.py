"""A stream-stream join's buffers of one partition, as its processor sees them.

Each side's events wait, per key, in a hash field (side and key: ``L`` or ``R`` then the
canonical key) of the partition's join hash, ``__join:{app.join__in.N}.join``, until the
partition's watermark has passed their time plus the window and the grace: then they
can no longer match, and go (an unmatched one emitted first, for a left or outer join).
A sorted set, ``__jndx:{app.join__in.N}.join``, scores each field by when its earliest
event goes, so closing touches only what is due. Like a windowed table, the buffers are
committed with the acknowledgements, so each pair, and each unmatched event, is emitted
exactly once.

An event at time ``t`` matches the buffered events of the other side and the same key
whose time is within the window of ``t`` (``|t - u| <= within``) and that neither side
had passed when the other came (see :meth:`JoinView.add_many`): the pair is emitted
when the later of the two is processed, whichever side it is. What meets depends on
each side's order alone, not on how the sides' events interleave.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ._errors import DecodeError
from ._redis import redis_errors
from ._state_join_sides import Sides
from ._state_views import MISSING, UNKNOWN, WindowView

if TYPE_CHECKING:
    from collections.abc import Container, Iterable, Sequence

    from ._commit import Changes
    from ._redis import Redis
    from ._state_join_sides import Source

__all__ = ["Buffered", "JoinLike", "JoinView", "decode_buffer", "encode_buffer"]

#: A buffered event: ``(time (ms), matched (0 or 1), form, stored, reached)``, its
#: record as forwarded, JSON (see :data:`streamkit._joins.JSON_FORM`), and the newest
#: time its own side had reached before it (ms; ``-inf``: none yet), which decides what
#: it may still meet (see :meth:`JoinView.add_many`). A field's value is a tuple of
#: them. Tuples of numbers and bytes, never changed in place (a mark is a new tuple):
#: the garbage collector stops tracking them, so a join holding hundreds of thousands
#: of events costs its collections nothing.
Buffered = tuple[int, int, int, bytes, float]


#: What a buffer set and not yet committed holds for its encoding.
_UNENCODED = b""


class JoinLike(Protocol):
    """What the view needs of a join (:class:`streamkit.StreamJoin`)."""

    @property
    def name(self) -> str: ...

    @property
    def within(self) -> int: ...

    @property
    def grace(self) -> int: ...

    @property
    def how(self) -> str: ...

    @property
    def idle(self) -> bool: ...

    def key(self, partition: int) -> str: ...

    def index_key(self, partition: int) -> str: ...

    def encode(self, value: Any) -> bytes: ...

    def decode(self, raw: bytes) -> Any: ...

    def unmatched(self, side: bytes, field: bytes, event: Buffered) -> Any: ...

    def sources(self, partition: int) -> tuple[Source, Source]: ...


_NONE = -math.inf


def _encode_event(e: Buffered) -> bytes:
    if e[4] == _NONE:  # (its side had reached nothing: as earlier versions stored it)
        return b"[%d,%d,%d,%s]" % e[:4]
    return b"[%d,%d,%d,%s,%d]" % e


def encode_buffer(events: tuple[Buffered, ...]) -> bytes:
    """A field's buffered events as stored: JSON, ``[[time, matched, form, record,
    reached], ...]``, each record the JSON it was forwarded as, in place (``reached``
    left out when its side had reached nothing, as earlier versions stored every
    event)."""
    if len(events) == 1:  # most fields: a key's one event
        e = events[0]
        if e[4] != _NONE:
            return b"[[%d,%d,%d,%s,%d]]" % e
    return b"[" + b",".join([_encode_event(e) for e in events]) + b"]"


def decode_buffer(raw: bytes) -> tuple[Buffered, ...]:
    """A field's stored buffered events, decoded (their records kept as JSON)."""
    try:
        events: list[Any] = orjson.loads(raw)
        decoded = []
        for e in events:
            if len(e) not in (4, 5) or type(e[0]) is not int or type(e[1]) is not int:
                raise ValueError(f"not a buffered event: {e!r}")
            if e[2] not in (0, 1) or (len(e) == 5 and type(e[4]) is not int):
                raise ValueError(f"not a buffered event: {e!r}")
            reached = e[4] if len(e) == 5 else _NONE
            decoded.append((e[0], e[1], e[2], orjson.dumps(e[3]), reached))
        return tuple(decoded)
    except Exception as exc:
        raise DecodeError(f"stored join buffer: {exc}", stream="join") from exc


class JoinView(WindowView):
    """One partition of a stream-stream join's buffers (see the module docs).

    Built on a windowed table's view: the same watermark, index of what is due, idle
    rule and settling; its values are the buffered events of a side and key.

    Attributes:
        buffered_delta: how many more events are buffered (done) than the last commit
            handed over said (the state hash keeps the partition's count: see
            :data:`streamkit._state.BUFFERED_FIELD`).
        sides: how far each side has come, which bounds the watermark (see
            :mod:`streamkit._state_join_sides`).
    """

    __slots__ = (
        "_buffered_tentative",
        "_complete",
        "_evicted",
        "_flags",
        "_join",
        "buffered_delta",
        "sides",
    )

    def __init__(
        self, table: JoinLike, partition: int, partition_count: int, redis: Redis, cache_size: int
    ) -> None:
        super().__init__(table, partition, partition_count, redis, cache_size)  # type: ignore[arg-type]
        self._join = table
        # Whether a side's events are marked when matched: only if its unmatched ones
        # are emitted (a left join's left side, both of an outer join's).
        outer, left = table.how == "outer", table.how == "left"
        self._flags = {b"L": outer or left, b"R": outer}
        self.buffered_delta = 0
        self._buffered_tentative = 0
        # Whether every field Redis holds is known here or in _evicted (the partition's
        # buffers were empty when it started here, and every field since was written
        # by this view): then a field neither knows is in no buffer, and no read of
        # Redis needs to say so.
        self._complete = False
        # The fields evicted from the cache that Redis holds.
        self._evicted: set[bytes] = set()
        warn_after = getattr(table, "stall_warning", 30.0)
        self.sides = Sides(
            *table.sources(partition), redis, partition=partition, warn_after=warn_after
        )

    async def open(self) -> None:
        await super().open()
        # The index scores every buffered field: none, no buffer.
        self._complete = self.next_due == math.inf

    async def prefetch(self, fields: Iterable[bytes], *, checked: bool = True) -> None:
        """As a table's, but when every buffered field is known here (see
        ``_complete``) only the evicted ones are read: a field in no buffer is known so
        without Redis, and without an entry in the cache (see :meth:`_lookup`)."""
        if not self._complete:
            await super().prefetch(fields, checked=checked)
            return
        evicted = self._evicted
        if not evicted:
            return
        fields = list(fields)
        tentative, dirty = self._tentative, self._dirty
        # (The evicted among them first, in one set operation: most fields are not.)
        stored = [f for f in evicted.intersection(fields) if f not in tentative and f not in dirty]
        if not stored:
            return
        with redis_errors():
            raws: Sequence[bytes | None] = await self._redis.hmget(self.key, stored)
        cache = self._cache
        if len(cache) + len(stored) > self._cache_size:
            self._evict(keep=set(fields), room=len(stored))
        decode = self.table.decode
        for field, raw in zip(stored, raws, strict=True):
            evicted.discard(field)
            cache[field] = MISSING if raw is None else decode(raw)

    def _lookup(self, field: bytes) -> Any:
        """The buffered events of ``field`` known here (``MISSING``: none), else
        ``UNKNOWN``: a field neither here nor evicted is in no buffer when every
        buffered field is known (``_complete``)."""
        value = self._tentative.get(field, UNKNOWN)
        if value is UNKNOWN:
            value = self._dirty.get(field, UNKNOWN)
            if value is UNKNOWN:
                value = self._cache.get(field, UNKNOWN)
                if value is UNKNOWN and self._complete and field not in self._evicted:
                    return MISSING
                return value
        return value[0]

    def _remember(self, field: bytes, value: Any) -> None:
        self._evicted.discard(field)
        super()._remember(field, value)

    def _evict(self, keep: Container[bytes] = (), room: int = 0) -> None:
        pop = self._cache.pop
        # (A field in no buffer is known as such again without Redis.)
        self._evicted.update([f for f in self._to_evict(keep, room) if pop(f) is not MISSING])

    def _check(self, key: object) -> None:
        """Fields are a side and a key of this partition (its events were routed here
        by partition number): nothing to check."""

    def set(self, key: object, value: Any) -> None:
        """Buffer ``value`` (a tuple of events) under the field ``key`` (tentatively),
        encoded when committed (a field set by several events of a batch is encoded
        once)."""
        assert type(key) is bytes
        old = self._known(key)
        self._buffered_tentative += len(value) - (len(old) if type(old) is tuple else 0)
        self._tentative[key] = (value, _UNENCODED)
        score = self._score(value)
        if score is not None:
            self.next_due = min(self.next_due, score)

    def promote(self) -> None:
        super().promote()
        self.buffered_delta += self._buffered_tentative
        self._buffered_tentative = 0
        self.sides.promote()

    def discard(self) -> None:
        super().discard()
        self._buffered_tentative = 0
        self.sides.discard()

    def withholding(self) -> bool:
        """Whether a side behind the other keeps a buffer open that the other's newest
        event would close (see :mod:`streamkit._state_join_sides`)."""
        return self.watermark < self.next_due <= max(self.sides.seen)

    def contribute(self, changes: Changes, pinned: list[bytes]) -> None:
        """As a windowed table's (its index, then its hash), in one pass over the done
        writes: each buffer encoded (once, however many events of the batch set it) and
        scored by when its earliest event goes."""
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = {}
        join = self._join
        encode = join.encode
        span = join.within + join.grace
        cache, pins, pending = self._cache, self._pinned, self._pending
        pairs: list[bytes | str | int | float] = []
        deleted: list[bytes | str | int | float] = []
        scored: list[bytes | str | int | float] = []
        gone: list[bytes | str | int | float] = []
        due = self.next_due
        for field, (value, encoded) in dirty.items():
            if encoded is None:
                deleted.append(field)
            else:
                pairs.append(field)
                pairs.append(encode(value) if encoded is _UNENCODED else encoded)
            if value is MISSING or not value:
                gone.append(field)
                pending.pop(field, None)
            else:
                # (_score: an int, sent to Redis as it is)
                score = (value[0][0] if len(value) == 1 else min(e[0] for e in value)) + span
                scored.append(score)
                scored.append(field)
                pending[field] = score
                if score < due:
                    due = score
            cache[field] = value
            pins[field] = pins.get(field, 0) + 1
        pinned.extend(dirty)
        self.next_due = due
        changes.zadd(self.index, scored)
        changes.zrem(self.index, gone)
        changes.hset(self.key, pairs)
        changes.hdel(self.key, deleted)
        if len(cache) > self._cache_size:
            self._evict()

    def _score(self, events: Any) -> float | None:
        if events is MISSING or not events:
            return None
        join = self._join
        # An int (ms): sent to Redis as it is, no float formatting.
        first: int = events[0][0] if len(events) == 1 else min(e[0] for e in events)
        return first + join.within + join.grace

    def _settle_value(
        self, field: bytes, events: Any, watermark: int
    ) -> tuple[bool, Any, list[Any]]:
        join = self._join
        span = join.within + join.grace
        kept = tuple([e for e in events if e[0] + span > watermark])
        if len(kept) == len(events):
            return False, events, []
        self.buffered_delta -= len(events) - len(kept)  # gone as done writes
        side = field[:1]
        closed = []
        if join.how == "outer" or (join.how == "left" and side == b"L"):
            closed = [
                join.unmatched(side, field, e)
                for e in events
                if e[0] + span <= watermark and not e[1]
            ]
        return True, kept, closed

    async def add_many(
        self, events: Iterable[tuple[bytes, bytes, int, int, bytes]]
    ) -> list[tuple[bytes, bytes, Buffered, list[Buffered]]]:
        """Buffer each event, in order (tentatively): its side (``b"L"``, ``b"R"``), key
        (``key_field``), time (ms), form and record as stored. Return, for each that
        matched some of the other side's buffered events of its key (marked matched),
        ``(side, key_field, event as buffered, those events)``.

        What an event meets depends on each side's own order only, never on how the
        two sides' events interleave (which forwarder ran first, or was down): with
        ``reached`` the newest time of an event's own side before it, an event at
        ``t`` is **late** (counted, not buffered, matching nothing) if ``t + within +
        grace <= reached``; and events ``l`` and ``r`` of the two sides meet if
        ``|t_l - t_r| <= within``, neither is late, and neither's side had passed the
        other's window when it came (``t_r + within + grace > reached_l`` and ``t_l +
        within + grace > reached_r``). A buffered event keeps its ``reached`` for the
        second condition. So whichever of two events comes first, they meet or not
        alike; and every event they could meet is still buffered (the watermark, the
        lesser of the sides' newest, has not passed its window).

        The fields a batch needs are read first (see :meth:`prefetch`): a field not
        known here then costs an ``HGET``."""
        join = self._join
        within = join.within
        span = within + join.grace
        flags = self._flags
        lookup = self._lookup
        tentative = self._tentative
        matches: list[tuple[bytes, bytes, Buffered, list[Buffered]]] = []
        # The partition's watermark as the events move it (told once, at the end), the
        # late ones, the single-event fields set and the earliest of their closes.
        watermark = start = self.watermark
        late = added = 0
        # Each side's newest time: the watermark is the newest time both sides
        # reached (see streamkit._state_join_sides).
        seen = self.sides.seen
        seen_l, seen_r = seen
        due = self.next_due
        for side, key_field, at, form, stored in events:
            if form < 0:  # a heartbeat: the side has reached `at`, and that is all
                if side == b"L":
                    seen_l = max(seen_l, at)
                else:
                    seen_r = max(seen_r, at)
                watermark = max(watermark, min(seen_l, seen_r))
                continue
            reached = seen_l if side == b"L" else seen_r
            if at + span <= reached:
                late += 1
                continue
            other_field = (b"R" if side == b"L" else b"L") + key_field
            own_field = side + key_field
            others = lookup(other_field)
            if others is UNKNOWN:
                others = await self.get(other_field, ())
            if others is MISSING or not others:
                matched = []
            else:
                # (See above. What the watermark closed, gone whether settled yet or
                # not, is never met: its window is behind `reached` too.)
                closes = reached - span
                opens = at + span
                matched = [
                    o for o in others if o[0] > closes and opens > o[4] and abs(o[0] - at) <= within
                ]
            event = (at, 1 if matched else 0, form, stored, reached)
            if matched:
                matches.append((side, key_field, event, matched))
                if flags[other_field[:1]] and any(not o[1] for o in matched):
                    # Marked matched (their side's unmatched are emitted): new tuples,
                    # in a new value (a discarded write leaves the committed one as it
                    # was).
                    marked = {id(o) for o in matched if not o[1]}
                    self.set(
                        other_field,
                        tuple(
                            [(o[0], 1, o[2], o[3], o[4]) if id(o) in marked else o for o in others]
                        ),
                    )
            own = lookup(own_field)
            if own is UNKNOWN:
                own = await self.get(own_field, ())
            if own is MISSING or not own:
                # set(), for a field of one event.
                tentative[own_field] = ((event,), _UNENCODED)
                added += 1
                if at + span < due:
                    due = at + span
            else:
                self.set(own_field, (*own, event))
            if side == b"L":
                if at > seen_l:
                    seen_l = at
            elif at > seen_r:
                seen_r = at
            limit = seen_l if seen_l < seen_r else seen_r
            if limit > watermark:
                watermark = limit
        seen[0], seen[1] = seen_l, seen_r
        self._late_tentative += late
        self._buffered_tentative += added
        if due < self.next_due:
            self.next_due = due
        if watermark > start:
            self.on_time(int(watermark))  # (an event's time)
        return matches

    def __repr__(self) -> str:
        return (
            f"<JoinView {self.table.name!r} partition {self.partition}: cached {len(self._cache)}>"
        )
