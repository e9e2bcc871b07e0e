"""Windowed tables: per key, an aggregate per window of event time, emitted once closed.

A :class:`WindowedTable` keeps, per key, a value per window of event time
(:mod:`streamkit._windows`). Tumbling and hopping windows are kept a hash per window
(every key's value in it) and a sorted set of the windows (see
:mod:`streamkit._state_windows`); sessions, whose bounds depend on the events, as one
hash field per key holding its list of sessions (``__wind:{app.stream.N}.table``),
beside a sorted set ``__wndx:{app.stream.N}.table`` scoring each key by the next time
its sessions need the watermark. Like a plain table it is written by one processor and
committed with the acknowledgements, so every window's value, and every final result
emitted to the ``output`` stream, reflects each event exactly once.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import attrs
import orjson

from . import _keys
from ._errors import ConfigError, DecodeError, EncodeError, LateEvent
from ._event import Event
from ._json_converter import converter
from ._keys import parse_window_member as parse_member
from ._partitioner import canonical_key_bytes, key_text
from ._redis import redis_errors
from ._state import _current, current_window_view, default_result
from ._state_late import note_late
from ._state_windows import NEEDS_READ, FixedWindowView
from ._tables_base import SCAN_COUNT, KeyedState, check_storable
from ._windows import Session, Slot, Window, to_ms

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from ._redis import Redis
    from ._spec import HasSpec, StreamSpec
    from ._state_views import WindowView
    from ._windows import WindowKind

__all__ = ["WindowedTable", "default_result"]

V = TypeVar("V")

_PLAIN = frozenset({int, float, str, bool})

LatePolicy = Literal["drop", "dead_letter"]


def _check_late(_: object, __: attrs.Attribute[str], late: str) -> None:
    if late not in ("drop", "dead_letter"):
        raise ConfigError("late", f"must be 'drop' or 'dead_letter', got {late!r}")


@attrs.define(eq=False, repr=False)
class WindowedTable(KeyedState, Generic[V]):
    """Aggregates per key and window of event time, written by one processor.

    Declare one with :meth:`streamkit.App.window` and name it in the processor that
    writes it (``tables=[...]``). Inside the processor,
    ``await table.update(key, at, fn, *args)`` folds an event into every open window
    containing its time ``at``: ``fn(value, *args) -> value``. A window closes when the
    partition's watermark passes its end plus ``grace``; its final value then goes,
    once, to ``output`` (built by ``result``), and an event for it afterwards is late.

    Attributes:
        name: the table's name (unique in its app).
        kind: the windows: :func:`~streamkit.tumbling`, :func:`~streamkit.hopping` or
            :func:`~streamkit.session`.
        value: the type of a window's value.
        initial: the value a new window starts from.
        grace: milliseconds a window stays open after its end, for late events.
        retention: milliseconds a closed window stays readable after its end.
        time: how ``update`` finds an event's time when ``at`` is a record: a field
            name or a function of the record; ``None``: pass times or events.
        output: the stream final results go to, if any.
        result: builds the record for ``output`` from ``(key, window, value)``.
        late: what happens to a late event: ``"drop"`` (counted) or
            ``"dead_letter"`` (``update`` raises :class:`~streamkit.LateEvent`, and
            the exception policy dead-letters the event).
        merge: combines two sessions' values when an event bridges them (sessions).
        idle: whether a quiet partition's event time moves on with the wall clock (so
            its windows close without a later event); ``False`` for event times that
            do not follow the wall clock (synthetic ones): then only events close
            windows.
    """

    kind: WindowKind
    value: Any
    initial: Any
    grace: int = 0
    retention: int = 0
    time: str | Callable[[Any], Any] | None = None
    output: StreamSpec[Any] | HasSpec[Any] | None = None
    result: Callable[[str, Window, Any], Any] = default_result
    late: LatePolicy = attrs.field(default="drop", validator=_check_late)
    merge: Callable[[Any, Any], Any] | None = None
    idle: bool = True

    kind_name = "windowed table"

    def __attrs_post_init__(self) -> None:
        check_storable(f"windowed table {self.name!r}", "initial", self.initial, self.value)

    @property
    def fixed(self) -> bool:
        """Whether the windows are tumbling or hopping (a hash per window), not sessions."""
        return not isinstance(self.kind, Session)

    # -- encoding --

    def encode_value(self, value: V) -> bytes:
        """One window's value as stored (tumbling and hopping windows)."""
        try:
            if type(value) is self.value and type(value) in _PLAIN:
                return orjson.dumps(value)
            return orjson.dumps(converter.unstructure(value, self.value))
        except Exception as exc:
            raise EncodeError(f"windowed table {self.name!r}: cannot encode: {exc}") from exc

    def decode_value(self, raw: bytes) -> V:
        """One window's stored value, decoded."""
        try:
            return converter.structure(orjson.loads(raw), self.value)  # type: ignore[no-any-return]
        except Exception as exc:
            raise DecodeError(
                f"a stored window value: {exc}", stream=f"windowed table {self.name!r}"
            ) from exc

    def encode(self, slots: list[Slot]) -> bytes:
        """A key's windows as stored: ``[[start, end, value, emitted], ...]``."""
        try:
            return orjson.dumps(
                [
                    [s.start, s.end, converter.unstructure(s.value, self.value), int(s.emitted)]
                    for s in slots
                ]
            )
        except Exception as exc:
            raise EncodeError(f"windowed table {self.name!r}: cannot encode: {exc}") from exc

    def decode(self, raw: bytes) -> list[Slot]:
        """A key's stored windows, decoded."""
        try:
            return [
                Slot(int(s), int(e), converter.structure(v, self.value), bool(m))
                for s, e, v, m in orjson.loads(raw)
            ]
        except Exception as exc:
            raise DecodeError(
                f"stored windows: {exc}", stream=f"windowed table {self.name!r}"
            ) from exc

    # -- where keys live --

    def key(self, partition: int) -> str:
        """The Redis hash holding ``partition`` of the table."""
        home = self._home()
        return _keys.window_key(home.app, home.name, self.name, partition)

    def index_key(self, partition: int) -> str:
        """The sorted set of ``partition``'s keys by the time they are next due."""
        home = self._home()
        return _keys.window_index_key(home.app, home.name, self.name, partition)

    def windows_key(self, partition: int) -> str:
        """The sorted set of ``partition``'s windows (tumbling and hopping)."""
        home = self._home()
        return _keys.windows_key(home.app, home.name, self.name, partition)

    def values_key(self, partition: int, start: int) -> str:
        """The hash of every key's value in ``partition``'s open window ``start``."""
        home = self._home()
        return _keys.window_values_key(home.app, home.name, self.name, partition, start)

    def closed_key(self, partition: int, start: int) -> str:
        """The hash of every key's value in ``partition``'s closed window ``start``."""
        home = self._home()
        return _keys.window_closed_key(home.app, home.name, self.name, partition, start)

    # -- event time --

    def time_of(self, at: object) -> int:
        """The event time (ms) of ``at``: a datetime, seconds since the epoch, an
        :class:`~streamkit.Event` (its record's time with ``time=``, else its entry
        id's), or a record (through ``time=``)."""
        if type(at) is float and -1e15 < at < 1e15:  # seconds since the epoch (not NaN)
            return round(at * 1_000_000) // 1000  # to_ms, inlined
        if isinstance(at, Event):
            if self.time is None:
                return int(at.entry_id.partition("-")[0])
            at = at.record
        elif isinstance(at, int | float | datetime) and not isinstance(at, bool):
            return to_ms(at)
        if self.time is not None and not isinstance(at, int | float):
            at = getattr(at, self.time) if isinstance(self.time, str) else self.time(at)
        return to_ms(at)  # type: ignore[arg-type]

    # -- inside the processor --

    async def update(self, key: object, at: object, fn: Callable[..., V], *args: Any) -> bool:
        """Fold an event into its windows: ``fn(value, *args)`` for each open window
        of ``key`` containing the event time ``at``, e.g.
        ``await revenue.update(sale.shop, sale, operator.add, sale.amount)``.

        Returns:
            ``True``; ``False`` for a late event (every window it falls in closed)
            dropped under ``late="drop"``.

        Error handling:
            :class:`~streamkit.LateEvent` for a late event under
            ``late="dead_letter"``; :class:`~streamkit.WrongPartition` for a key of
            another partition; :class:`~streamkit.ConfigError` outside the processor
            that writes the table.
        """
        state = _current.get()  # current_window_view(self), inlined: once per event
        fixed = None if state is None else state.fixed_views.get(self)
        moment = self.time_of(at)
        view: WindowView | FixedWindowView
        if fixed is not None:
            view = fixed
            # Known here (the usual case): folded without a second coroutine, and no
            # checkpoint, as a table's get of a known key (the processor's loop has one
            # per event).
            late = fixed.fold(key, moment, fn, args)
            if late is NEEDS_READ:
                late = await fixed.update(key, moment, fn, args)
            elif not late:
                return True
        else:
            view = current_window_view(self)
            late = await view.update(key, moment, fn, args)
        if late:
            note_late(self, view, key, moment, self.late)
            if self.late == "dead_letter":
                raise LateEvent(self.name, key, int(view.watermark))
        return not late

    # -- from anywhere --

    def _windows(self, slots: list[Slot]) -> list[tuple[Window, V]]:
        return [(Window.from_ms(s.start, s.end), s.value) for s in slots]

    async def read(self, key: object, *, redis: Redis | None = None) -> list[tuple[Window, V]]:
        """The committed windows of ``key`` and their values, oldest first (open ones,
        and closed ones within the retention)."""
        client = self._redis(redis)
        partition = self.partition_of(key)
        field = canonical_key_bytes(key)
        if not self.fixed:
            with redis_errors():
                raw = await client.hget(self.key(partition), field)
            return [] if raw is None else self._windows(self.decode(raw))
        with redis_errors():
            members = await client.zrange(self.windows_key(partition), 0, -1)
            windows = [parse_member(m) for m in members]
            if not windows:
                return []
            async with client.pipeline(transaction=False) as pipe:
                requests = [
                    pipe.hget(self._window_hash(partition, start, closed), field)
                    for start, _, closed in windows
                ]
            raws = [await request for request in requests]
        found = [
            (start, end, self.decode_value(raw))
            for (start, end, _), raw in zip(windows, raws, strict=True)
            if raw is not None
        ]
        return [(Window.from_ms(start, end), value) for start, end, value in sorted(found)]

    def _window_hash(self, partition: int, start: int, closed: bool) -> str:
        return (self.closed_key if closed else self.values_key)(partition, start)

    async def items(
        self, *, partition: int | None = None, redis: Redis | None = None
    ) -> AsyncIterator[tuple[str, list[tuple[Window, V]]]]:
        """Every key's committed windows, partition by partition (see ``Table.items``)."""
        if not self.fixed:
            async for field, raw in self._scan(partition, redis):
                yield key_text(field), self._windows(self.decode(raw))
            return
        client = self._redis(redis)
        home = self._home()
        partitions = range(home.partition_count) if partition is None else [partition]
        for p in partitions:
            by_key: dict[bytes, list[tuple[int, int, V]]] = {}
            async for start, end, field, raw in self._scan_windows(client, p):
                by_key.setdefault(field, []).append((start, end, self.decode_value(raw)))
            for field, found in by_key.items():
                yield key_text(field), [(Window.from_ms(s, e), v) for s, e, v in sorted(found)]

    async def _scan_windows(
        self, client: Redis, partition: int
    ) -> AsyncIterator[tuple[int, int, bytes, bytes]]:
        """Every ``(start, end, key field, raw value)`` of ``partition``'s windows."""
        with redis_errors():
            members = await client.zrange(self.windows_key(partition), 0, -1)
        for start, end, closed in (parse_member(m) for m in members):
            key = self._window_hash(partition, start, closed)
            cursor = 0
            while True:
                with redis_errors():
                    cursor, page = await client.hscan(key, cursor, count=SCAN_COUNT)
                for field, raw in page.items():
                    yield start, end, field, raw
                if cursor == 0:
                    break

    async def sizes(self, *, redis: Redis | None = None) -> list[int]:
        """The number of keys in each partition, in partition order: for tumbling and
        hopping windows, of a key's windows (a key with two open windows counts two)."""
        if not self.fixed:
            return await super().sizes(redis=redis)
        client = self._redis(redis)
        out = []
        for p in range(self._home().partition_count):
            with redis_errors():
                members = await client.zrange(self.windows_key(p), 0, -1)
                if not members:
                    out.append(0)
                    continue
                async with client.pipeline(transaction=False) as pipe:
                    requests = [
                        pipe.hlen(self._window_hash(p, s, c))
                        for s, _, c in (parse_member(m) for m in members)
                    ]
                out.append(sum([int(await request) for request in requests]))
        return out

    def __repr__(self) -> str:
        where = f" of {self.stream.name!r} by {self.processor!r}" if self.stream is not None else ""
        return f"<WindowedTable {self.name!r}{where} {self.kind}>"
