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
from collections.abc import Mapping
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import attrs
import orjson

from . import _keys
from ._codec import _DATA_FIELDS
from ._errors import ConfigError, DecodeError
from ._json_converter import converter
from ._partitioner import canonical_key_bytes, key_text
from ._state import _current
from ._state_join_sides import HEARTBEAT, heartbeat, read_heartbeat
from ._state_joins import Buffered, decode_buffer, encode_buffer
from ._tables_base import KeyedState
from ._windows import duration_ms, to_ms

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._events import Events
    from ._spec import StreamSpec
    from ._state import PartitionState
    from ._state_joins import JoinView

__all__ = [
    "FORWARDED_FIELD",
    "JOIN_SHARE",
    "JoinHow",
    "StreamJoin",
    "default_join_result",
    "pack_forwarded",
    "unpack_forwarded",
]

L = TypeVar("L")
R = TypeVar("R")

JoinHow = Literal["inner", "left", "outer"]

#: A forwarder's batch of events is an entry of one field, ``J``: its side (``L``,
#: ``R``) and a space, then a JSON array of four numbers per event (its event time in
#: ms, the length of its key, the length of its record and its record's form), a
#: newline, and then each event's key (canonical bytes) and record as stored in its
#: stream, back to back: ``L [1767225600000,2,30,0]\n42{"order_id":42,...}``. The
#: record is the JSON value itself if its codec is plain JSON (form ``0``,
#: :data:`JSON_FORM`), else its fields, flat, as a JSON array of latin-1 text (form
#: ``1``, :data:`FLAT_FORM`): never parsed until a result needs it. An entry holds up
#: to :data:`PACK_BYTES` of keys and records (or one larger event). So the inner
#: stream holds, and Redis appends, reads and acknowledges, an entry per batch rather
#: than per event, and the join reads a batch with one ``orjson.loads`` and slices.
PACKED = b"J"
PACK_BYTES = 64 * 1024
#: Earlier versions wrote an entry per event, of one field ``j``: its side and form,
#: its time and key length, then its key and record: ``L0 1767225600000 2 42{...}``
#: (still read).
FORWARDED = b"j"
JSON_FORM = 0
FLAT_FORM = 1
#: The form of a heartbeat as a prepared event (see :meth:`StreamJoin.prepare_entry`).
HEARTBEAT_FORM = -1
#: The field of the form of earlier versions (a JSON array ``[side, key, time, form,
#: stored]``), still read.
FORWARDED_FIELD = _DATA_FIELDS[None]

#: A forwarded event, prepared: its side, its key (the tail of its buffer's field), its
#: time (ms), its form and its record's JSON.
Prepared = tuple[bytes, bytes, int, int, bytes]
#: A forwarded event as a forwarder makes it: its time (ms), key, form and record.
Forwarded = tuple[int, bytes, int, bytes]

_FORMS = {b"0": JSON_FORM, b"1": FLAT_FORM}
_SIDES = (b"L", b"R")


def pack_forwarded(side: bytes, events: list[Forwarded]) -> list[bytes]:
    """A forwarder's ``events`` of ``side`` as the values of :data:`PACKED` entries."""
    packs: list[bytes] = []
    head = side + b" "
    meta: list[int] = []
    parts: list[bytes] = []
    size = 0
    for at, key, form, stored in events:
        if parts and size + len(key) + len(stored) > PACK_BYTES:
            packs.append(head + orjson.dumps(meta) + b"\n" + b"".join(parts))
            meta, parts, size = [], [], 0
        meta += (at, len(key), len(stored), form)
        parts += (key, stored)
        size += len(key) + len(stored)
    if parts:
        packs.append(head + orjson.dumps(meta) + b"\n" + b"".join(parts))
    return packs


def unpack_forwarded(data: bytes) -> list[Prepared]:
    """The forwarded events of a :data:`PACKED` entry's value (``ValueError`` if it is
    not one)."""
    side, newline = data[:1], data.find(b"\n")
    if side not in _SIDES or data[1:2] != b" " or newline < 0:
        raise ValueError(f"not a forwarded batch: {data[:20]!r}")
    events: list[Prepared] = []
    at = newline + 1
    try:
        meta = orjson.loads(data[2:newline])
        # (Numbers not whole fail the slicing below: no check per number.)
        ok = (
            type(meta) is list
            and len(meta) % 4 == 0
            and (not meta or min(meta) >= 0)
            and set(meta[3::4]) <= {JSON_FORM, FLAT_FORM}
        )
        numbers = iter(meta if ok else ())
        for time, key_length, length, form in zip(numbers, numbers, numbers, numbers, strict=True):
            key_end = at + key_length
            end = key_end + length
            events.append((side, data[at:key_end], time, form, data[key_end:end]))
            at = end
    except (orjson.JSONDecodeError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"not a forwarded batch: {data[:40]!r}")
    if at != len(data):
        raise ValueError(f"a forwarded batch of {len(data)} bytes, {at} described")
    return events


#: Events a forwarder takes at a time (the most a packed entry holds).
BATCH = 500
#: The join's processor reads ``batch_size / JOIN_SHARE`` entries of its inner stream
#: at a time (16 by default), each a forwarder's batch of up to ``batch_size`` events:
#: so a partition's buffered reads stay near what another processor's are.
JOIN_SHARE = 32


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


def _check_result(_: object, __: attrs.Attribute[Any], result: object) -> None:
    if not callable(result):
        raise ConfigError(
            "result",
            f"must be a function of (key, left record or None, right record or None), "
            f"got {result!r}",
        )


def _check_idle(_: object, __: attrs.Attribute[bool], idle: object) -> None:
    if not isinstance(idle, bool):
        raise ConfigError("idle", f"must be True or False, got {idle!r}")


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
    result: Callable[[str, Any, Any], Any] = attrs.field(
        kw_only=True, default=default_join_result, validator=_check_result
    )
    left_time: str | Callable[[Any], Any] | None = attrs.field(kw_only=True, default=None)
    right_time: str | Callable[[Any], Any] | None = attrs.field(kw_only=True, default=None)
    idle: bool = attrs.field(kw_only=True, default=True, validator=_check_idle)
    #: Seconds a side may hold the join back, its forwarder not forwarding, before a
    #: warning says so (:meth:`streamkit.App.join`: a failover's time, session timeout
    #: plus lease).
    stall_warning: float = attrs.field(kw_only=True, default=30.0)

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

    def encode(self, value: tuple[Buffered, ...]) -> bytes:
        return encode_buffer(value)

    def decode(self, raw: bytes) -> tuple[Buffered, ...]:
        return decode_buffer(raw)

    def _record(self, side: bytes, event: Buffered) -> Any:
        """The record of a buffered event, decoded."""
        spec = self.left if side == b"L" else self.right
        if event[2] == JSON_FORM:
            fields = {FORWARDED_FIELD: event[3]}
        else:
            parts = [part.encode("latin-1") for part in orjson.loads(event[3])]
            fields = dict(zip(parts[::2], parts[1::2], strict=True))
        return spec.codec.decode(fields, stream=spec.name)

    @property
    def plain(self) -> bool:
        """Whether results are the default ``dict`` (made of JSON values, so emitted
        with one ``orjson.dumps``)."""
        return self.result is default_join_result

    def _value(self, side: bytes, event: Buffered) -> Any:
        """A side's record in a default result, as the converter unstructures it: the
        JSON its stream stored, in place, if a plain JSON codec stored it."""
        if event[2] == JSON_FORM:
            return orjson.Fragment(event[3])
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
        return self._result(key_text(field[1:]), side, event, None)

    def sources(self, partition: int) -> tuple[tuple[str, str], tuple[str, str]]:
        """Where ``partition``'s events come from: each side's partition and its
        forwarder's group."""
        return (
            (self.left.key(partition), self.left.processor(f"{self.name}__left").group),
            (self.right.key(partition), self.right.processor(f"{self.name}__right").group),
        )

    # -- forwarding --

    def forwarder(
        self, side: bytes
    ) -> Callable[[Sequence[bytes], list[list[bytes]], list[Any]], list[Forwarded]]:
        """What gives the forwarded events (see :data:`PACKED`) of entries of ``side``:
        from their ids, their fields (flat) and their records. An event's time is its
        side's ``left_time``/``right_time``, or when it was appended to its stream."""
        spec = self.left if side == b"L" else self.right
        key_of = spec.partitioner.key_of
        json = spec.codec.name == "json"
        time_spec = self.left_time if side == b"L" else self.right_time
        time_of = time_getter(spec, time_spec)
        isfinite = math.isfinite
        what = f"join {self.name!r}, " + ("left_time" if side == b"L" else "right_time")

        def forwarded(
            ids: Sequence[bytes], flats: list[list[bytes]], records: list[Any]
        ) -> list[Forwarded]:
            out: list[Forwarded] = []
            append = out.append
            for entry_id, flat, record in zip(ids, flats, records, strict=True):
                raw = key_of(record)
                # canonical_key_bytes, its usual types first
                if type(raw) is int:
                    key = b"%d" % raw
                elif type(raw) is str:
                    key = raw.encode()
                else:
                    key = canonical_key_bytes(raw)
                if time_of is None:
                    at = int(entry_id.partition(b"-")[0])
                else:
                    try:
                        t = time_of(record)
                        # to_ms, for seconds as a float first
                        at = (
                            round(t * 1_000_000) // 1000
                            if type(t) is float and isfinite(t)
                            else to_ms(t)
                        )
                    except (ConfigError, AttributeError, LookupError, TypeError) as exc:
                        raise ConfigError(
                            what,
                            f"no event time for entry {entry_id.decode()} of {spec.name}: {exc}",
                        ) from None
                if json and len(flat) == 2 and flat[0] == FORWARDED_FIELD:
                    append((at, key, JSON_FORM, flat[1]))
                else:
                    stored = orjson.dumps([part.decode("latin-1") for part in flat])
                    append((at, key, FLAT_FORM, stored))
            return out

        return forwarded

    # -- inside the join's processor --

    def prepare_flat(self, flat: list[bytes]) -> Prepared:
        """A forwarded event, as an entry's flat field list, as the join sees it (see
        :data:`Prepared`)."""
        if len(flat) == 2:
            if flat[0] == FORWARDED:
                return self.prepare_forwarded(flat[1])
            if flat[0] == FORWARDED_FIELD:
                return self._prepare_json(flat[1])
        raise DecodeError(f"not a forwarded event: {flat[:4]!r}", stream=self.name)

    def prepare_entry(self, flat: list[bytes]) -> list[Prepared]:
        """The forwarded events of an inner stream's entry (its flat field list): a
        batch (:data:`PACKED`), a side's heartbeat (see
        :mod:`streamkit._state_join_sides`: an event of form :data:`HEARTBEAT_FORM`,
        of no key), or one event of earlier versions (see :meth:`prepare_flat`)."""
        if len(flat) == 2:
            if flat[0] == PACKED:
                return self.prepare_packed(flat[1])
            if flat[0] == HEARTBEAT:
                try:
                    side, at = read_heartbeat(flat[1])
                except ValueError as exc:
                    raise DecodeError(str(exc), stream=self.name) from exc
                return [(_SIDES[side], b"", at, HEARTBEAT_FORM, b"")]
        return [self.prepare_flat(flat)]

    def prepare_packed(self, data: bytes) -> list[Prepared]:
        """:meth:`prepare_entry` of the value of a :data:`PACKED` entry."""
        try:
            return unpack_forwarded(data)
        except ValueError as exc:
            raise DecodeError(str(exc), stream=self.name) from exc

    def prepare_forwarded(self, value: bytes) -> Prepared:
        """:meth:`prepare_flat` of the value of a forwarded event's one field."""
        try:
            head, at, length, rest = value.split(b" ", 3)
            n = int(length)
            side, form = head[:1], _FORMS[head[1:]]
            if (side == b"L" or side == b"R") and 0 <= n <= len(rest):
                return side, rest[:n], int(at), form, rest[n:]
        except (ValueError, KeyError):
            pass
        raise DecodeError(f"not a forwarded event: {value[:40]!r}", stream=self.name)

    def _prepare_json(self, value: bytes) -> Prepared:
        """:meth:`prepare_flat` of the one-field form of earlier versions."""
        try:
            tag, key, at, form, stored = orjson.loads(value)
            if tag not in ("L", "R") or form not in (JSON_FORM, FLAT_FORM):
                raise ValueError(f"side {tag!r}, form {form!r}")
            return tag.encode(), key.encode("latin-1"), int(at), form, orjson.dumps(stored)
        except (TypeError, ValueError, AttributeError, orjson.JSONEncodeError) as exc:
            raise DecodeError(f"not a forwarded event: {exc}", stream=self.name) from exc

    async def fold(self, view: JoinView, events: list[Prepared]) -> list[Any]:
        """Join prepared events (see :meth:`prepare_flat`) in order: buffer each
        (tentatively), return the results of the pairs they make."""
        matches = await view.add_many(events)
        if not matches:
            return []
        results: list[Any] = []
        if not self.plain:
            result = self._result
            for side, key_field, mine, matched in matches:
                try:  # (key_text, its usual case inlined)
                    key = key_field.decode()
                except UnicodeDecodeError:
                    key = key_text(key_field)
                results.extend([result(key, side, mine, theirs) for theirs in matched])
            return results
        # Default results, as _result makes them: each side's record the JSON its
        # stream stored, in place.
        value = self._value
        fragment = orjson.Fragment
        for side, key_field, mine, matched in matches:
            try:  # (key_text, its usual case inlined)
                key = key_field.decode()
            except UnicodeDecodeError:
                key = key_text(key_field)
            a = fragment(mine[3]) if mine[2] == JSON_FORM else value(side, mine)
            other = b"R" if side == b"L" else b"L"
            for theirs in matched:
                b = fragment(theirs[3]) if theirs[2] == JSON_FORM else value(other, theirs)
                results.append(
                    {"key": key, "left": a, "right": b}
                    if side == b"L"
                    else {"key": key, "left": b, "right": a}
                )
        return results

    def __repr__(self) -> str:
        return (
            f"<StreamJoin {self.name!r} {self.left.name} x {self.right.name} "
            f"within {self.within} ms, {self.how}>"
        )


async def forward(
    events: Events[Any], join: StreamJoin[Any, Any], side: bytes, merged: StreamSpec[Any]
) -> None:
    """A forwarder's body: every event of its stream to the same partition of the join's
    inner stream, with its side, key and time (see :data:`PACKED`)."""
    state: PartitionState | None = _current.get()
    assert state is not None
    partition = events.partition
    forwarded = join.forwarder(side)
    # (Decoded a batch at a time; an event that does not decode is dead-lettered alone,
    # as by records().)
    async for entries in events._entries(BATCH, decode=True):
        assert entries.records is not None
        values = forwarded(entries.ids, entries.fields, entries.records)
        state.emit_run(merged, partition, PACKED, pack_forwarded(side, values))


async def run_join(events: Events[Any], join: StreamJoin[Any, Any]) -> None:
    """The join's processor's body: fold every forwarded event in, reading the buffers
    a batch needs from Redis in one ``HMGET``."""
    state: PartitionState | None = _current.get()
    assert state is not None, "a join's processor runs with its state"
    view: JoinView = state.views[join]  # type: ignore[assignment]
    prepare = join.prepare_entry
    prepare_packed = join.prepare_packed
    output = join.output
    emit = state.emit_plain if join.plain else state.emit_many
    inner, partition = join._home(), events.partition
    async for entries in events._entries(BATCH):
        packs = entries.values_of(PACKED)
        if packs is not None:
            prepared = [p for data in packs for p in prepare_packed(data)]
        else:
            prepared = [p for flat in entries.fields for p in prepare(flat)]
        keys = {p[1] for p in prepared if p[3] >= 0}  # (not heartbeats')
        await view.prefetch([b"L" + key for key in keys] + [b"R" + key for key in keys])
        results = await join.fold(view, prepared)
        if results:
            emit(output, results)
        # A side behind the other that keeps a buffer open: if it is only quiet, a
        # heartbeat moves it on, with the idle rule; without it only its events do (see
        # _state_join_sides).
        if view.withholding() and view.sides.due():
            top = max(view.sides.seen)
            for side, _ in await view.sides.caught_up(top, moves=join.idle):
                state.emit_run(inner, partition, HEARTBEAT, [heartbeat(side, int(top))])


def time_getter(
    spec: StreamSpec[Any], time: str | Callable[[Any], Any] | None
) -> Callable[[Any], Any] | None:
    """What reads a record's event time: a field name read as an attribute, or as a
    key of ``dict`` records; a function as it is."""
    if not isinstance(time, str):
        return time
    return itemgetter(time) if issubclass(spec.record, Mapping) else attrgetter(time)


def check_time_field(spec: StreamSpec[Any], name: str, time: object) -> None:
    """Refuse an event time field its stream's records do not have (when their class
    says what fields it has)."""
    if not isinstance(time, str) and time is not None and not callable(time):
        raise ConfigError(name, f"expected a field name, a function or None, got {time!r}")
    if isinstance(time, str) and attrs.has(spec.record):
        fields = attrs.fields_dict(spec.record)
        if time not in fields:
            raise ConfigError(
                name,
                f"{spec.record.__qualname__} (the records of {spec.name}) has no field "
                f"{time!r} (its fields: {', '.join(fields)})",
            )


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
    ms = duration_ms(name, value)
    if ms < 0 or (name == "within" and ms == 0):
        raise ConfigError(name, f"must be positive, got {value!r}")
    return ms
