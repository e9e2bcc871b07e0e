"""Windowed tables: per key, an aggregate per window of event time, emitted once closed.

A :class:`WindowedTable` is a table whose value, per key, is the list of that key's
windows (:mod:`streamkit._windows`), stored as one hash field: partition N is the hash
``__wind:{app.stream.N}.table``, beside a sorted set ``__wndx:{app.stream.N}.table``
scoring each key by the next time its windows need the watermark (to close or to
expire). Like a plain table it is written by one processor and committed with the
acknowledgements, so every window's value, and every final result emitted to the
``output`` stream, reflects each event exactly once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import attrs
import orjson

from . import _keys
from ._errors import ConfigError, DecodeError, EncodeError, LateEvent
from ._event import Event
from ._json_converter import converter
from ._partitioner import canonical_key_bytes
from ._redis import redis_errors
from ._state import current_window_view
from ._state_late import note_late
from ._tables_base import KeyedState, check_storable
from ._windows import Slot, Window, to_ms

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from ._redis import Redis
    from ._spec import HasSpec, StreamSpec
    from ._windows import WindowKind

__all__ = ["WindowedTable"]

V = TypeVar("V")

LatePolicy = Literal["drop", "dead_letter"]


def _check_late(_: object, __: attrs.Attribute[str], late: str) -> None:
    if late not in ("drop", "dead_letter"):
        raise ConfigError("late", f"must be 'drop' or 'dead_letter', got {late!r}")


def default_result(key: str, window: Window, value: Any) -> dict[str, Any]:
    """A closed window as a ``dict`` record: key, start, end (ISO 8601) and value."""
    return {
        "key": key,
        "start": window.start.isoformat(),
        "end": window.end.isoformat(),
        "value": converter.unstructure(value),
    }


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

    # -- encoding --

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

    # -- event time --

    def time_of(self, at: object) -> int:
        """The event time (ms) of ``at``: a datetime, seconds since the epoch, an
        :class:`~streamkit.Event` (its record's time with ``time=``, else its entry
        id's), or a record (through ``time=``)."""
        if isinstance(at, Event):
            if self.time is None:
                return int(at.entry_id.partition("-")[0])
            at = at.record
        elif isinstance(at, int | float) and not isinstance(at, bool):
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
        view = current_window_view(self)
        moment = self.time_of(at)
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
        with redis_errors():
            raw = await client.hget(self.key(self.partition_of(key)), canonical_key_bytes(key))
        return [] if raw is None else self._windows(self.decode(raw))

    async def items(
        self, *, partition: int | None = None, redis: Redis | None = None
    ) -> AsyncIterator[tuple[str, list[tuple[Window, V]]]]:
        """Every key's committed windows, partition by partition (see ``Table.items``)."""
        async for field, raw in self._scan(partition, redis):
            yield field.decode(), self._windows(self.decode(raw))

    def __repr__(self) -> str:
        where = f" of {self.stream.name!r} by {self.processor!r}" if self.stream is not None else ""
        return f"<WindowedTable {self.name!r}{where} {self.kind}>"
