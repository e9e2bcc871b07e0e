"""A stream-stream join's buffers of one partition, as its processor sees them.

Each side's events wait, per key, in a hash field (side and key: ``L`` or ``R`` then the
canonical key) of the partition's join hash, ``__join:{app.join__in.N}.join``, until the
partition's watermark has passed their time plus the window and the grace: then they
can no longer match, and go (an unmatched one emitted first, for a left or outer join).
A sorted set, ``__jndx:{app.join__in.N}.join``, scores each field by when its earliest
event goes, so closing touches only what is due. Like a windowed table, the buffers are
committed with the acknowledgements, so each pair, and each unmatched event, is emitted
exactly once.

An event at time ``t`` matches every buffered event of the other side and the same key
whose time is within the window of ``t`` (``|t - u| <= within``): the pair is emitted
when the later of the two is processed, whichever side it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ._errors import DecodeError
from ._state_views import MISSING, WindowView

if TYPE_CHECKING:
    from ._redis import Redis

__all__ = ["Buffered", "JoinLike", "JoinView", "decode_buffer", "encode_buffer"]

#: A buffered event: ``[time (ms), matched, fields]`` (the fields as stored in its
#: stream, for its side's codec), and its record once decoded.
Buffered = list[Any]


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


def encode_buffer(events: list[Buffered]) -> bytes:
    """A field's buffered events as stored: JSON, each entry's fields as latin-1 text
    (bytes one to one)."""
    return orjson.dumps(
        [
            [
                e[0],
                int(e[1]),
                [part.decode("latin-1") for pair in e[2].items() for part in pair],
            ]
            for e in events
        ]
    )


def decode_buffer(raw: bytes) -> list[Buffered]:
    """A field's stored buffered events, decoded (records not yet)."""
    try:
        out: list[Buffered] = []
        for t, matched, flat in orjson.loads(raw):
            parts = [p.encode("latin-1") for p in flat]
            out.append([int(t), bool(matched), dict(zip(parts[::2], parts[1::2], strict=True))])
        return out
    except Exception as exc:
        raise DecodeError(f"stored join buffer: {exc}", stream="join") from exc


class JoinView(WindowView):
    """One partition of a stream-stream join's buffers (see the module docs).

    Built on a windowed table's view: the same watermark, index of what is due, idle
    rule and settling; its values are the buffered events of a side and key.

    Attributes:
        buffered: the events buffered (done) on the partition, by this view's count.
    """

    __slots__ = ("_join",)

    def __init__(
        self, table: JoinLike, partition: int, partition_count: int, redis: Redis, cache_size: int
    ) -> None:
        super().__init__(table, partition, partition_count, redis, cache_size)  # type: ignore[arg-type]
        self._join = table

    def _check(self, key: object) -> None:
        """Fields are a side and a key of this partition (its events were routed here
        by partition number): nothing to check."""

    def _score(self, events: Any) -> float | None:
        if events is MISSING or not events:
            return None
        join = self._join
        return float(min(e[0] for e in events) + join.within + join.grace)

    def _settle_value(
        self, field: bytes, events: Any, watermark: int
    ) -> tuple[bool, Any, list[Any]]:
        join = self._join
        span = join.within + join.grace
        kept = [e for e in events if e[0] + span > watermark]
        if len(kept) == len(events):
            return False, events, []
        side = field[:1]
        closed = []
        if join.how == "outer" or (join.how == "left" and side == b"L"):
            closed = [
                join.unmatched(side, field, e)
                for e in events
                if e[0] + span <= watermark and not e[1]
            ]
        return True, kept, closed

    async def add(
        self, side: bytes, key_field: bytes, at: int, fields: dict[bytes, bytes]
    ) -> list[Buffered] | None:
        """Buffer an event of ``side`` (``b"L"``, ``b"R"``) at ``at`` (tentatively);
        return the other side's buffered events it matches (marked matched), or ``None``
        if it is late (its window closed: it can match nothing that is left)."""
        join = self._join
        watermark = self.watermark
        if at + join.within + join.grace <= watermark:
            self._late_tentative += 1
            return None
        other_side = b"R" if side == b"L" else b"L"
        other_field = other_side + key_field
        others: list[Buffered] = await self.get(other_field, [])
        within = join.within
        # What the watermark closed is gone, settled yet or not (a batch's end settles):
        # so what an event meets does not depend on where batches begin.
        closes = watermark - join.within - join.grace

        def meets(o: Buffered) -> bool:
            return bool(o[0] > closes and abs(o[0] - at) <= within)

        matched = [o for o in others if meets(o)]
        if matched:
            self.set(other_field, [[o[0], True, *o[2:]] if meets(o) else o for o in others])
        own_field = side + key_field
        own: list[Buffered] = await self.get(own_field, [])
        self.set(own_field, [*own, [at, bool(matched), fields]])
        self.on_time(at)
        return matched

    def __repr__(self) -> str:
        return (
            f"<JoinView {self.table.name!r} partition {self.partition}: cached {len(self._cache)}>"
        )
