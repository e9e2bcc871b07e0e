"""Late window events made visible: a log line per window, and the counts, read back.

An event is *late* when every window it falls in has closed (its end plus the grace
at or below the partition's watermark). The commit already counts them, per windowed
table, in the partition's state hash (the ``late:TABLE`` fields of ``__stat:``, see
:mod:`streamkit._state`), exactly once per event like every other effect. This module
is how they are seen:

* :func:`note_late`, called by the writing processor when it meets one, logs a
  warning the first time a window gets a late event (which window, the event time,
  the watermark and the grace), at most one line per table and partition every
  :data:`LOG_EVERY` seconds (a line then says how many more windows got some since);
* :func:`late_requests` and :func:`late_counts` read the counts with one ``HMGET``
  per partition: ``streamkit status`` and the dashboard show them (a ``late`` column),
  and the worker exports them (``streamkit_late_events_total``).
"""

from __future__ import annotations

import logging
import time
import weakref
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from . import _keys
from ._state import LATE_FIELD
from ._wire import text

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "LOG_EVERY",
    "late_counts",
    "late_fields",
    "late_keys",
    "note_late",
    "total_late",
    "windowed_names",
]

log = logging.getLogger("streamkit.state")

#: Seconds between two log lines about late events of one table on one partition.
LOG_EVERY = 10.0
#: Windows remembered per table and partition as already reported (the oldest go).
_REMEMBERED = 4096


def windowed_names(tables: Iterable[Any]) -> list[str]:
    """The names of the windowed tables and stream-stream joins among ``tables`` (what
    meets late events), in order."""
    return [
        table.name
        for table in tables
        if getattr(table, "kind", None) is not None or getattr(table, "joins", False)
    ]


def late_fields(names: Sequence[str]) -> list[str]:
    """The state hash's fields counting the late events of the windowed tables ``names``."""
    return [LATE_FIELD + name for name in names]


def late_keys(app: str, stream: str, processor: str, partitions: Iterable[int]) -> list[str]:
    """The state hashes of ``processor``'s ``partitions``, in order."""
    return [_keys.state_key(app, stream, processor, p) for p in partitions]


def late_counts(names: Sequence[str], reply: Sequence[Any] | None) -> dict[str, int]:
    """Per windowed table of ``names``, its late events, from an ``HMGET`` of their
    :func:`late_fields` (a missing field, or hash: none)."""
    values = list(reply or [])
    counts = {}
    for index, name in enumerate(names):
        value = values[index] if index < len(values) else None
        try:
            counts[name] = int(text(value)) if value is not None else 0
        except ValueError:
            counts[name] = 0  # not streamkit's: shown as none rather than failing
    return counts


class _Reporter:
    """The log lines of one windowed table on one partition."""

    __slots__ = ("last", "reported", "suppressed")

    def __init__(self) -> None:
        self.reported: dict[tuple[int, int], None] = {}
        self.last = -float("inf")
        self.suppressed = 0

    def first_time(self, window: tuple[int, int]) -> bool:
        if window in self.reported:
            return False
        self.reported[window] = None
        if len(self.reported) > _REMEMBERED:
            del self.reported[next(iter(self.reported))]
        return True


# Per windowed table, per partition its processor met late events on in this process,
# what it has logged.
_reporters: weakref.WeakKeyDictionary[Any, dict[int, _Reporter]] = weakref.WeakKeyDictionary()


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def note_late(table: Any, view: Any, key: object, at: int, policy: str) -> None:
    """The processor met a late event of ``key`` at ``at`` (ms) in ``view`` (the
    partition's view of the windowed ``table``): log it if its window is new, and
    no line about this table and partition was logged in the last :data:`LOG_EVERY`
    seconds."""
    partitions = _reporters.get(table)
    if partitions is None:
        partitions = _reporters[table] = {}
    reporter = partitions.get(view.partition)
    if reporter is None:
        reporter = partitions[view.partition] = _Reporter()
    spans = getattr(table.kind, "spans", None)
    start, end = spans(at)[-1] if spans is not None else (at, at + table.kind.gap)
    if not reporter.first_time((start, end)):
        return
    now = time.monotonic()
    if now - reporter.last < LOG_EVERY:
        reporter.suppressed += 1
        return
    more = (
        f" ({reporter.suppressed} more windows got late events since the last line)"
        if reporter.suppressed
        else ""
    )
    reporter.last, reporter.suppressed = now, 0
    log.warning(
        "late event on windowed table %r partition %d: the window %s/%s of key %r had "
        "closed (event time %s, watermark %s, grace %d ms); %s%s. Counted in "
        "`streamkit status` (late) and streamkit_late_events_total",
        table.name,
        view.partition,
        _iso(start),
        _iso(end),
        key,
        _iso(at),
        _iso(int(view.watermark)),
        table.grace,
        "dead-lettered" if policy == "dead_letter" else "dropped",
        more,
    )


def total_late(counts: Mapping[str, int]) -> int:
    """All late events of a partition, over its windowed tables."""
    return sum(counts.values())
