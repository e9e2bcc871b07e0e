"""Windows over event time: which windows an event falls in, and when they close (pure).

Times are integers of milliseconds since the epoch. A key's windows are kept as one
list of :class:`Slot` s, ordered by start, that a windowed table stores under the key
(see :mod:`streamkit._tables_windowed`); everything here is a pure function of such a
list, the event's time and the partition's *watermark*, the highest event time the
partition has processed (moved on by the wall clock while the partition is idle).

* :func:`apply` folds one event into the windows containing its time;
* while a partition is idle its watermark moves on with the wall clock, from the last
  event's time (:func:`idle_watermark`), so that a quiet partition's windows close;
* a window *closes* once the watermark reaches its end plus the grace period: its
  final value is emitted once, and an event for it afterwards is *late*;
* a closed window is kept, readable, until the watermark reaches its end plus the
  retention, then dropped (:func:`settle`).

Kinds: :func:`tumbling` (fixed, back to back), :func:`hopping` (fixed size, starting
every ``advance``, overlapping) and :func:`session` (one per burst of activity,
ending ``gap`` after its last event, merged when a late-arriving event bridges two).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import attrs

from ._errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "Hopping",
    "Session",
    "Slot",
    "Tumbling",
    "Window",
    "WindowKind",
    "apply",
    "duration_ms",
    "hopping",
    "idle_watermark",
    "next_action",
    "positive_ms",
    "session",
    "settle",
    "to_ms",
    "tumbling",
]


def to_ms(value: datetime | timedelta | float) -> int:
    """A time (a datetime, or seconds since the epoch) or a duration, in milliseconds.

    A naive datetime is taken as UTC. A time is rounded down to its millisecond, at the
    microsecond a datetime has (so that ``2.01`` seconds, ``2.00999...`` as a float, is
    2010 ms, not 2009).
    """
    if (type(value) is float or type(value) is int) and math.isfinite(value):  # usual: first
        return round(value * 1_000_000) // 1000
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return round(value.timestamp() * 1_000_000) // 1000
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError("time", f"expected a datetime or seconds, got {value!r}")
    return round(value * 1_000_000) // 1000


def duration_ms(name: str, value: object) -> int:
    """A duration (a timedelta, or seconds) in ms, rounded as :func:`to_ms` does;
    :class:`ConfigError` naming the option ``name`` for anything else (text, a
    datetime, a bool, NaN, infinity)."""
    if isinstance(value, timedelta) or (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ):
        return to_ms(value)
    raise ConfigError(name, f"expected a duration (a timedelta, or seconds), got {value!r}")


def positive_ms(name: str, value: timedelta | float) -> int:
    """A positive duration (a timedelta, or seconds) in ms; :class:`ConfigError` if not."""
    ms = duration_ms(name, value)
    if ms <= 0:
        raise ConfigError(name, f"must be positive, got {value!r}")
    return ms


@attrs.frozen
class Window:
    """One window of a windowed table: the events from :attr:`start` up to, not
    including, :attr:`end` (a session ends ``gap`` after its last event).

    Attributes:
        start: when the window starts (UTC).
        end: when it ends (UTC).
    """

    start: datetime
    end: datetime

    @classmethod
    def from_ms(cls, start: int, end: int) -> Window:
        return cls(
            datetime.fromtimestamp(start / 1000, UTC), datetime.fromtimestamp(end / 1000, UTC)
        )


@attrs.define(eq=True)
class Slot:
    """A window of one key with its value, as stored.

    Attributes:
        start: the window's start (ms).
        end: the window's end (ms).
        value: the aggregate so far (the final one once emitted).
        emitted: whether the window closed and its final value was emitted.
    """

    start: int
    end: int
    value: Any
    emitted: bool = False


@attrs.frozen
class Tumbling:
    """Back-to-back windows of ``size`` ms: ``[k*size, (k+1)*size)``."""

    size: int

    def spans(self, at: int) -> list[tuple[int, int]]:
        start = at - at % self.size
        return [(start, start + self.size)]


@attrs.frozen
class Hopping:
    """Windows of ``size`` ms starting every ``advance`` ms (overlapping)."""

    size: int
    advance: int

    def spans(self, at: int) -> list[tuple[int, int]]:
        last = at - at % self.advance
        spans = []
        start = last
        while start > at - self.size:
            spans.append((start, start + self.size))
            start -= self.advance
        spans.reverse()
        return spans


@attrs.frozen
class Session:
    """A window per burst of events: it ends ``gap`` ms after its last event."""

    gap: int


WindowKind = Tumbling | Hopping | Session


def tumbling(size: timedelta | float) -> Tumbling:
    """Back-to-back windows of ``size`` (a timedelta, or seconds), aligned to the epoch."""
    return Tumbling(positive_ms("size", size))


def hopping(size: timedelta | float, every: timedelta | float) -> Hopping:
    """Windows of ``size`` starting every ``every``, aligned to the epoch: an event
    falls in ``size / every`` of them.

    Error handling:
        :class:`~streamkit.ConfigError` unless ``every`` divides ``size``.
    """
    size_ms = positive_ms("size", size)
    every_ms = positive_ms("every", every)
    if size_ms % every_ms:
        raise ConfigError("every", f"must divide the size ({size!r}), got {every!r}")
    return Hopping(size_ms, every_ms)


def session(gap: timedelta | float) -> Session:
    """Session windows: events less than ``gap`` apart share one; it ends ``gap``
    after its last event."""
    return Session(positive_ms("gap", gap))


def apply(
    slots: list[Slot],
    kind: WindowKind,
    at: int,
    fn: Callable[[Any], Any],
    *,
    initial: Any,
    watermark: int,
    grace: int,
    merge: Callable[[Any, Any], Any] | None = None,
) -> tuple[list[Slot], bool]:
    """Fold an event at time ``at`` into ``slots``: ``fn(value)`` for every open window
    containing it, creating windows (with ``initial``) as needed.

    Returns:
        ``(new slots, late)``: ``late`` when every window the event falls in had
        closed (its end plus ``grace`` at or below ``watermark``); then the slots are
        unchanged.
    """
    if isinstance(kind, Session):
        return _apply_session(slots, kind, at, fn, initial, watermark, grace, merge)
    spans = [s for s in kind.spans(at) if s[1] + grace > watermark]
    if not spans:
        return slots, True
    out = list(slots)
    by_start = {slot.start: i for i, slot in enumerate(out)}
    for start, end in spans:
        i = by_start.get(start)
        if i is None:
            out.append(Slot(start, end, fn(initial)))
        else:
            old = out[i]
            out[i] = Slot(start, end, fn(old.value), old.emitted)
    out.sort(key=lambda slot: slot.start)
    return out, False


def _apply_session(
    slots: list[Slot],
    kind: Session,
    at: int,
    fn: Callable[[Any], Any],
    initial: Any,
    watermark: int,
    grace: int,
    merge: Callable[[Any, Any], Any] | None,
) -> tuple[list[Slot], bool]:
    gap = kind.gap
    if at + gap + grace <= watermark:
        return slots, True
    # The open sessions this event touches: it falls within ``gap`` of them.
    touching = [
        s
        for s in slots
        if not s.emitted and s.start - gap <= at < s.end and s.end + grace > watermark
    ]
    rest = [s for s in slots if s not in touching]
    if not touching:
        merged = Slot(at, at + gap, fn(initial))
    else:
        value = touching[0].value
        for other in touching[1:]:
            if merge is None:
                raise ConfigError(
                    "merge",
                    "an event bridged two sessions: give the windowed table a merge "
                    "function (merge=lambda a, b: ...)",
                )
            value = merge(value, other.value)
        merged = Slot(
            min(min(s.start for s in touching), at),
            max(max(s.end for s in touching), at + gap),
            fn(value),
        )
    out = [*rest, merged]
    out.sort(key=lambda slot: slot.start)
    return out, False


def settle(
    slots: list[Slot], *, watermark: int, grace: int, retention: int
) -> tuple[list[Slot], list[Slot]]:
    """Close the windows the watermark has passed, and drop those past retention.

    Returns:
        ``(kept, closed)``: the slots to keep (closed ones marked emitted), and the
        windows that closed now, whose final values are to be emitted once.
    """
    kept: list[Slot] = []
    closed: list[Slot] = []
    for slot in slots:
        if not slot.emitted and slot.end + grace <= watermark:
            slot = Slot(slot.start, slot.end, slot.value, True)
            closed.append(slot)
        if slot.emitted and slot.end + max(retention, grace) <= watermark:
            continue
        kept.append(slot)
    return kept, closed


def next_action(slots: list[Slot], *, grace: int, retention: int) -> int | None:
    """When the watermark must next come back to ``slots``: the earliest time one of
    them closes or expires; ``None`` when there are none."""
    times = [slot.end + (max(retention, grace) if slot.emitted else grace) for slot in slots]
    return min(times) if times else None


def idle_watermark(event_time: int, idle_for: int) -> int:
    """The watermark of a partition idle (caught up, waiting for events) for
    ``idle_for`` ms since it processed the event time ``event_time``: event time moves
    on at the speed of the wall clock while nothing arrives.

    So a quiet partition's windows close on time instead of waiting for a later event:
    with events stamped by the wall clock as they are sent, a window closes about its
    grace period after its end, as if events had kept coming. Replaying old events
    works the same way: a pause of a minute moves event time on by a minute, not to
    today.
    """
    return event_time + max(0, idle_for)
