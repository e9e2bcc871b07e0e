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
import orjson

from . import _keys
from ._codec import _DATA_FIELDS
from ._errors import ConfigError, DecodeError
from ._json_converter import converter
from ._partitioner import canonical_key_bytes
from ._state import _current
from ._state_joins import Buffered, decode_buffer, encode_buffer
from ._tables_base import KeyedState
from ._windows import to_ms

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._event import Event
    from ._events import Events
    from ._spec import StreamSpec
    from ._state import PartitionState
    from ._state_joins import JoinView

__all__ = ["FORWARDED_FIELD", "JoinHow", "StreamJoin", "default_join_result"]

L = TypeVar("L")
R = TypeVar("R")

JoinHow = Literal["inner", "left", "outer"]

#: A forwarded event is one entry of one field (a run of them is cheap to commit and
#: to read): the JSON array ``[side, key, time, form, stored]``: its side (``L``,
#: ``R``), its key (canonical, as latin-1 text: bytes one to one), its event time (ms),
#: and its record as stored in its stream: the JSON value itself if its codec is plain
#: JSON (``form`` 0), else its fields, flat, as latin-1 text (``form`` 1).
FORWARDED_FIELD = _DATA_FIELDS[None]
JSON_FORM = 0
FLAT_FORM = 1

#: A forwarded event, prepared: its side, its key (the tail of its buffer's field), and
#: it as buffered (see :data:`streamkit._state_joins.Buffered`).
Prepared = tuple[bytes, bytes, Buffered]

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
        if len(event) > 4:
            return event[4]
        spec = self.left if side == b"L" else self.right
        if event[2] == JSON_FORM:
            fields = {FORWARDED_FIELD: orjson.dumps(event[3])}
        else:
            parts = [part.encode("latin-1") for part in event[3]]
            fields = dict(zip(parts[::2], parts[1::2], strict=True))
        record = spec.codec.decode(fields, stream=spec.name)
        event.append(record)
        return record

    @property
    def plain(self) -> bool:
        """Whether results are the default ``dict`` (made of JSON values, so emitted
        with one ``orjson.dumps``)."""
        return self.result is default_join_result

    def _value(self, side: bytes, event: Buffered) -> Any:
        """A side's record in a default result, as the converter unstructures it: the
        JSON its stream stored, if a plain JSON codec stored it."""
        if event[2] == JSON_FORM:
            return event[3]
        return converter.unstructure(self._record(side, event))

    def _result(self, key: str, side: bytes, mine: Buffered, theirs: Buffered | None) -> Any:
        """The result of ``mine`` (of ``side``) and ``theirs`` (or ``None``)."""
        other = b"R" if side == b"L" else b"L"
        if self.plain:
            a = self._value(side, mine)
            b = None if theirs is None else self._value(other, theirs)
            return (
                {"key": key, "left": a, "right": b}
                if side == b"L"
                else {"key": key, "left": b, "right": a}
            )
        a = self._record(side, mine)
        b = None if theirs is None else self._record(other, theirs)
        return self.result(key, a, b) if side == b"L" else self.result(key, b, a)

    def unmatched(self, side: bytes, field: bytes, event: Buffered) -> Any:
        """The result of an event never matched, its window closed."""
        return self._result(field[1:].decode(), side, event, None)

    # -- forwarding --

    def time_of(self, side: bytes, record: Any, appended: int) -> int:
        """An event's time (ms): its side's ``left_time``/``right_time``, or when it
        was appended to its stream."""
        spec = self.left_time if side == b"L" else self.right_time
        if spec is None:
            return appended
        value = getattr(record, spec) if isinstance(spec, str) else spec(record)
        return to_ms(value)

    def forwarded(self, side: bytes, event: Event[Any]) -> bytes:
        """The inner stream's value for ``event`` of ``side`` (see :data:`FORWARDED_FIELD`)."""
        spec = self.left if side == b"L" else self.right
        record = event.record
        key = canonical_key_bytes(spec.partitioner.key_of(record)).decode("latin-1")
        at = self.time_of(side, record, int(event.entry_id.partition("-")[0]))
        flat = event.flat
        if len(flat) == 2 and flat[0] == FORWARDED_FIELD and spec.codec.name == "json":
            stored: Any = orjson.Fragment(flat[1])
            form = JSON_FORM
        else:
            stored = [part.decode("latin-1") for part in flat]
            form = FLAT_FORM
        return orjson.dumps([side.decode(), key, at, form, stored])

    # -- inside the join's processor --

    def prepare(self, fields: dict[bytes, bytes]) -> Prepared:
        """A forwarded event as the join sees it (see :data:`Prepared`)."""
        try:
            tag, key, at, form, stored = orjson.loads(fields[FORWARDED_FIELD])
            side = b"L" if tag == "L" else b"R"
            return side, key.encode("latin-1"), [int(at), 0, int(form), stored]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DecodeError(f"not a forwarded event: {exc}", stream=self.name) from exc

    def prepare_flat(self, flat: list[bytes]) -> Prepared:
        """:meth:`prepare` of an entry's flat field list (as a batch holds it)."""
        if len(flat) == 2 and flat[0] == FORWARDED_FIELD:
            try:
                tag, key, at, form, stored = orjson.loads(flat[1])
                side = b"L" if tag == "L" else b"R"
                return side, key.encode("latin-1"), [int(at), 0, int(form), stored]
            except (TypeError, ValueError, AttributeError) as exc:
                raise DecodeError(f"not a forwarded event: {exc}", stream=self.name) from exc
        return self.prepare(dict(zip(flat[::2], flat[1::2], strict=True)))

    async def fold(self, fields: dict[bytes, bytes]) -> None:
        """Join one forwarded event: emit the pairs it makes, buffer it (tentatively)."""
        await self.fold_prepared(self.prepare(fields))

    async def fold_prepared(self, event: Prepared) -> None:
        """Join one prepared event (see :meth:`prepare`)."""
        state: PartitionState | None = _current.get()
        assert state is not None, "a join's processor runs with its state"
        view: JoinView = state.views[self]  # type: ignore[assignment]
        side, key_field, buffered = event
        matched = await view.add(side, key_field, buffered)
        if not matched:
            return
        key = key_field.decode()
        output = self.output
        emit = state.emit_plain if self.plain else state.emit
        for theirs in matched:
            emit(output, self._result(key, side, buffered, theirs))

    def __repr__(self) -> str:
        return (
            f"<StreamJoin {self.name!r} {self.left.name} x {self.right.name} "
            f"within {self.within} ms, {self.how}>"
        )


async def forward(
    events: Events[Any], join: StreamJoin[Any, Any], side: bytes, merged: StreamSpec[Any]
) -> None:
    """A forwarder's body: every event of its stream to the same partition of the join's
    inner stream, with its side, key and time (see :data:`FORWARDED_FIELD`)."""
    state: PartitionState | None = _current.get()
    assert state is not None
    partition = events.partition
    async for batch in events.take_raw(BATCH, within=0.002):
        for event in batch:
            state.emit_raw(merged, partition, [FORWARDED_FIELD, join.forwarded(side, event)])


async def run_join(events: Events[Any], join: StreamJoin[Any, Any]) -> None:
    """The join's processor's body: fold every forwarded event in, reading the buffers
    a batch needs from Redis in one ``HMGET``."""
    state: PartitionState | None = _current.get()
    assert state is not None, "a join's processor runs with its state"
    view: JoinView = state.views[join]  # type: ignore[assignment]
    async for batch in events.take_raw(BATCH, within=0.002):
        prepared = [join.prepare_flat(event.flat) for event in batch]
        await view.prefetch({b"L" + p[1] for p in prepared} | {b"R" + p[1] for p in prepared})
        for event in prepared:
            await join.fold_prepared(event)


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
