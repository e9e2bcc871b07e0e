"""Window logic, pure: which windows an event falls in, lateness, closing, expiry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from streamkit import ConfigError, Window, hopping, session, tumbling
from streamkit._windows import (
    Slot,
    apply,
    idle_watermark,
    next_action,
    settle,
    to_ms,
)

if TYPE_CHECKING:
    from collections.abc import Callable

LONG_AGO = -(2**62)


def add(n: int) -> Callable[[int], int]:
    return lambda total: total + n


def test_times_and_durations_in_milliseconds() -> None:
    assert to_ms(datetime(2026, 1, 1, tzinfo=UTC)) == 1_767_225_600_000
    assert to_ms(datetime(2026, 1, 1)) == 1_767_225_600_000  # naive is UTC
    assert to_ms(timedelta(minutes=1)) == 60_000
    assert to_ms(1.5) == 1500
    with pytest.raises(ConfigError):
        to_ms(float("nan"))
    with pytest.raises(ConfigError):
        to_ms("soon")  # type: ignore[arg-type]


def test_tumbling_windows_are_back_to_back() -> None:
    kind = tumbling(timedelta(seconds=10))
    assert kind.spans(0) == [(0, 10_000)]
    assert kind.spans(9_999) == [(0, 10_000)]
    assert kind.spans(10_000) == [(10_000, 20_000)]
    with pytest.raises(ConfigError):
        tumbling(0)


def test_hopping_windows_overlap() -> None:
    kind = hopping(size=timedelta(seconds=30), every=timedelta(seconds=10))
    assert kind.spans(25_000) == [(0, 30_000), (10_000, 40_000), (20_000, 50_000)]
    assert kind.spans(30_000) == [(10_000, 40_000), (20_000, 50_000), (30_000, 60_000)]
    with pytest.raises(ConfigError, match="divide"):
        hopping(size=30, every=7)


def test_apply_creates_and_updates_windows() -> None:
    kind = tumbling(10)
    slots, late = apply([], kind, 1_000, add(5), initial=0, watermark=LONG_AGO, grace=0)
    assert not late
    assert slots == [Slot(0, 10_000, 5)]
    slots, _ = apply(slots, kind, 2_000, add(1), initial=0, watermark=2_000, grace=0)
    slots, _ = apply(slots, kind, 12_000, add(7), initial=0, watermark=2_000, grace=0)
    assert slots == [Slot(0, 10_000, 6), Slot(10_000, 20_000, 7)]


def test_an_event_for_closed_windows_is_late_unless_within_grace() -> None:
    kind = tumbling(10)
    slots = [Slot(0, 10_000, 6)]
    # The watermark is past the end, but within the grace: still counted.
    within, late = apply(slots, kind, 9_000, add(1), initial=0, watermark=12_000, grace=5_000)
    assert not late
    assert within == [Slot(0, 10_000, 7)]
    # Past end + grace: late, and nothing changes.
    after, late = apply(slots, kind, 9_000, add(1), initial=0, watermark=15_000, grace=5_000)
    assert late
    assert after == slots


def test_hopping_late_for_some_windows_only_updates_the_open_ones() -> None:
    kind = hopping(size=20, every=10)
    slots, late = apply([], kind, 15_000, add(1), initial=0, watermark=20_000, grace=0)
    # [0, 20 s) closed at 20 s; [10 s, 30 s) is open.
    assert not late
    assert slots == [Slot(10_000, 30_000, 1)]


def test_sessions_extend_and_merge() -> None:
    kind = session(timedelta(seconds=5))
    slots, _ = apply([], kind, 0, add(1), initial=0, watermark=LONG_AGO, grace=0)
    slots, _ = apply(slots, kind, 3_000, add(1), initial=0, watermark=3_000, grace=0)
    assert slots == [Slot(0, 8_000, 2)]
    slots, _ = apply(slots, kind, 20_000, add(1), initial=0, watermark=3_000, grace=0)
    assert slots == [Slot(0, 8_000, 2), Slot(20_000, 25_000, 1)]
    # An event within the gap of both of two sessions merges them.
    slots = [Slot(0, 8_000, 2), Slot(12_000, 17_000, 1)]
    with pytest.raises(ConfigError, match="merge"):
        apply(slots, kind, 7_500, add(1), initial=0, watermark=3_000, grace=0)
    merged, _ = apply(
        slots,
        kind,
        7_500,
        add(1),
        initial=0,
        watermark=3_000,
        grace=0,
        merge=lambda a, b: a + b,
    )
    assert merged == [Slot(0, 17_000, 4)]


def test_settle_closes_once_then_expires_after_retention() -> None:
    slots = [Slot(0, 10_000, 6), Slot(10_000, 20_000, 2)]
    kept, closed = settle(slots, watermark=14_000, grace=3_000, retention=60_000)
    assert closed == [Slot(0, 10_000, 6, emitted=True)]
    assert kept == [Slot(0, 10_000, 6, emitted=True), Slot(10_000, 20_000, 2)]
    # Settling again emits nothing twice.
    again, closed = settle(kept, watermark=15_000, grace=3_000, retention=60_000)
    assert closed == []
    assert again == kept
    assert next_action(kept, grace=3_000, retention=60_000) == 23_000
    # Past the retention, the closed window goes.
    gone, closed = settle(kept, watermark=70_000, grace=3_000, retention=60_000)
    assert closed == [Slot(10_000, 20_000, 2, emitted=True)]
    assert gone == [Slot(10_000, 20_000, 2, emitted=True)]
    assert next_action([], grace=0, retention=0) is None


def test_without_retention_a_window_goes_when_it_closes() -> None:
    kept, closed = settle([Slot(0, 10_000, 1)], watermark=10_000, grace=0, retention=0)
    assert closed == [Slot(0, 10_000, 1, emitted=True)]
    assert kept == []


def test_an_idle_partition_moves_on_with_the_wall_clock() -> None:
    assert idle_watermark(5_000, 0) == 5_000
    assert idle_watermark(5_000, 4_000) == 9_000
    assert idle_watermark(5_000, -1) == 5_000


def test_window_as_datetimes() -> None:
    window = Window.from_ms(0, 60_000)
    assert window.start == datetime(1970, 1, 1, tzinfo=UTC)
    assert window.end - window.start == timedelta(minutes=1)
