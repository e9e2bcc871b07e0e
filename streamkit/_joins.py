"""Stream-stream joins within a time, exactly once, built of processors and the commit.

:meth:`streamkit.App.join` declares a join of two co-partitioned streams (the same
partition count; events meet by their streams' partition keys). It is three processors
of the app, registered for you and run by any worker like the others:

* ``JOIN__left`` and ``JOIN__right`` forward each event of their stream, as stored and
  tagged with its side and time, to partition N of an inner stream ``JOIN__in`` (an
  output of theirs, so exactly once);
* ``JOIN`` reads ``JOIN__in``: both sides of a key, in the order they were forwarded,
  in one partition's slot. Its state, the events waiting for a match (see
  :mod:`streamkit._state_joins`), and the results it emits to ``output`` are committed
  with the acknowledgements, like a windowed table's: each pair once, each unmatched
  event of a left or outer join once when its window closes.

The detour through ``JOIN__in`` is what makes it exactly once on Redis Cluster too: a
script touches one slot, and the two streams' partitions N live in two; their events
meet in the slot of ``JOIN__in``'s partition N.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import attrs

from . import _keys
from ._errors import ConfigError
from ._json_converter import converter
from ._partitioner import canonical_key_bytes
from ._state import _current
from ._state_joins import Buffered, decode_buffer, encode_buffer
from ._tables_base import KeyedState
from ._windows import to_ms

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._events import Events
    from ._spec import StreamSpec
    from ._state import PartitionState
    from ._state_joins import JoinView

__all__ = ["SIDE_FIELD", "TIME_FIELD", "JoinHow", "StreamJoin", "default_join_result"]

L = TypeVar("L")
R = TypeVar("R")

JoinHow = Literal["inner", "left", "outer"]

#: The fields a forwarder adds to an event: its side (``L``, ``R``) and its time (ms).
SIDE_FIELD = b"__j"
TIME_FIELD = b"__t"
#: Events a forwarder or the join takes at a time.
BATCH = 500


def default_join_result(key: str, left: Any, right: Any) -> dict[str, Any]:
    """A joined pair as a ``dict`` record: the key, and each side's record (``None``
    for the missing side of an unmatched event)."""
    return {
        "key": key,
        "left": None if left is None else converter.unstructure(left),
        "right": None if right is None else converter.unstructure(right),
    }


def _check_how(_: object, __: attrs.Attribute[str], how: str) -> None:
    if how not in ("inner", "left", "outer"):
        raise ConfigError("how", f"must be 'inner', 'left' or 'outer', got {how!r}")


@attrs.define(eq=False, repr=False)
class StreamJoin(KeyedState, Generic[L, R]):
    """A join of two streams within a time, declared by :meth:`streamkit.App.join`.

    Attributes:
        name: the join's name (its processor's; unique in its app).
        left: the left stream.
        right: the right stream.
        within: milliseconds two events may be apart in event time and still match.
        grace: milliseconds an event waits beyond that for late events of the other side.
        how: ``"inner"`` (pairs only), ``"left"`` (and each left event never matched,
            once its window closed), ``"outer"`` (and each event of either side never
            matched).
        output: the stream results go to.
        result: builds a result from ``(key, left record or None, right record or
            None)``.
        left_time, right_time: each side's event time: a field name, a function of a
            record, or ``None`` for the time its event was appended to its stream.
        idle: whether a quiet partition's event time moves on with the wall clock (so
            that windows close without a later event), as a windowed table's.
    """

    left: StreamSpec[L] = attrs.field(kw_only=True)
    right: StreamSpec[R] = attrs.field(kw_only=True)
    within: int = attrs.field(kw_only=True)
    grace: int = attrs.field(kw_only=True, default=0)
    how: JoinHow = attrs.field(kw_only=True, default="inner", validator=_check_how)
    output: StreamSpec[Any] = attrs.field(kw_only=True)
    result: Callable[[str, Any, Any], Any] = attrs.field(kw_only=True, default=default_join_result)
    left_time: str | Callable[[Any], Any] | None = attrs.field(kw_only=True, default=None)
    right_time: str | Callable[[Any], Any] | None = attrs.field(kw_only=True, default=None)
    idle: bool = attrs.field(kw_only=True, default=True)

    kind_name = "join"
    joins = True
    #: What the windows' machinery reads of a table (a join keeps no windows' values).
    retention = 0
    merge = None

    # -- where its buffers live --

    def key(self, partition: int) -> str:
        """The hash of ``partition``'s buffered events."""
        home = self._home()
        return _keys.join_key(home.app, home.name, self.name, partition)

    def index_key(self, partition: int) -> str:
        """The sorted set of ``partition``'s buffered keys, by when they are next due."""
        home = self._home()
        return _keys.join_index_key(home.app, home.name, self.name, partition)

    # -- its buffered events, as stored --

    def encode(self, value: list[Buffered]) -> bytes:
        return encode_buffer(value)

    def decode(self, raw: bytes) -> list[Buffered]:
        return decode_buffer(raw)

    def _record(self, side: bytes, event: Buffered) -> Any:
        """The record of a buffered event, decoded once."""
        if len(event) > 3:
            return event[3]
        spec = self.left if side == b"L" else self.right
        record = spec.codec.decode(event[2], stream=spec.name)
        event.append(record)
        return record

    def unmatched(self, side: bytes, field: bytes, event: Buffered) -> Any:
        """The result of an event never matched, its window closed."""
        key = field[1:].decode()
        record = self._record(side, event)
        if side == b"L":
            return self.result(key, record, None)
        return self.result(key, None, record)

    # -- inside the join's processor --

    def time_of(self, side: bytes, record: Any, appended: int) -> int:
        """An event's time (ms): its side's ``left_time``/``right_time``, or when it
        was appended to its stream."""
        spec = self.left_time if side == b"L" else self.right_time
        if spec is None:
            return appended
        value = getattr(record, spec) if isinstance(spec, str) else spec(record)
        return to_ms(value)

    async def fold(self, fields: dict[bytes, bytes]) -> None:
        """Join one forwarded event: emit the pairs it makes, buffer it (tentatively)."""
        state: PartitionState | None = _current.get()
        assert state is not None, "a join's processor runs with its state"
        view: JoinView = state.views[self]  # type: ignore[assignment]
        side = fields[SIDE_FIELD]
        appended = int(fields[TIME_FIELD])
        payload = {k: v for k, v in fields.items() if k != SIDE_FIELD and k != TIME_FIELD}
        spec: StreamSpec[Any] = self.left if side == b"L" else self.right
        record = spec.codec.decode(payload, stream=spec.name)
        key = spec.partitioner.key_of(record)
        key_field = canonical_key_bytes(key)
        at = self.time_of(side, record, appended)
        matched = await view.add(side, key_field, at, payload)
        if not matched:
            return
        text = key_field.decode()
        other = b"R" if side == b"L" else b"L"
        for event in matched:
            theirs = self._record(other, event)
            if side == b"L":
                state.emit(self.output, self.result(text, record, theirs))
            else:
                state.emit(self.output, self.result(text, theirs, record))

    def __repr__(self) -> str:
        return (
            f"<StreamJoin {self.name!r} {self.left.name} x {self.right.name} "
            f"within {self.within} ms, {self.how}>"
        )


async def forward(
    events: Events[Any], join: StreamJoin[Any, Any], side: bytes, merged: StreamSpec[Any]
) -> None:
    """A forwarder's body: every event of its stream to the same partition of the join's
    inner stream, as stored, tagged with its side and the time it was appended."""
    state: PartitionState | None = _current.get()
    assert state is not None
    partition = events.partition
    async for batch in events.take_raw(BATCH, within=0.002):
        for event in batch:
            fields = event.fields
            appended = event.entry_id.partition("-")[0]
            state.emit_raw(
                merged, partition, [SIDE_FIELD, side, TIME_FIELD, appended, *_flat(fields)]
            )
    del join


def _flat(fields: dict[bytes, bytes]) -> list[bytes]:
    out: list[bytes] = []
    for name, value in fields.items():
        out.append(name)
        out.append(value)
    return out


async def run_join(events: Events[Any], join: StreamJoin[Any, Any]) -> None:
    """The join's processor's body: fold every forwarded event in."""
    async for batch in events.take_raw(BATCH, within=0.002):
        for event in batch:
            await join.fold(event.fields)


def check_copartitioned(left: StreamSpec[Any], right: StreamSpec[Any]) -> None:
    """Refuse streams whose events could not meet in one partition."""
    if left.partition_count != right.partition_count:
        raise ConfigError(
            "join",
            f"{left.name} has {left.partition_count} partitions and {right.name} "
            f"{right.partition_count}: a join needs co-partitioned streams (the same "
            f"partition count, keyed alike); re-key one into a stream of "
            f"{left.partition_count} partitions first",
        )


def positive_window(name: str, value: Any) -> int:
    """A join's window or grace (a timedelta, or seconds) in ms."""
    ms = to_ms(value)
    if ms < 0 or (name == "within" and ms == 0) or not math.isfinite(ms):
        raise ConfigError(name, f"must be positive, got {value!r}")
    return ms
