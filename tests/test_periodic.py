"""The drift-free schedule shared by heartbeats, lease renewals and timers.

The arithmetic is checked with exact numbers, the loop on trio's mock clock
(``autojump_clock``) with exact times.
"""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from streamkit._periodic import next_tick, run_periodically


def test_ticks_stay_on_the_grid() -> None:
    assert next_tick(10.0, 0.5, 10.0) == 10.5
    assert next_tick(10.0, 0.5, 10.2) == 10.5
    assert next_tick(10.0, 0.5, 10.5) == 11.0
    assert next_tick(10.0, 1.0, 10.0) == 11.0
    assert next_tick(10.0, 1.0, 10.5) == 11.0
    assert next_tick(10.0, 1.0, 11.0) == 12.0
    assert next_tick(10.0, 2.0, 10.0) == 12.0
    assert next_tick(10.0, 2.0, 11.9) == 12.0
    assert next_tick(10.0, 2.0, 12.0) == 14.0


def test_missed_ticks_are_skipped_not_bunched_up() -> None:
    assert next_tick(10.0, 0.5, 11.7) == 12.0
    assert next_tick(10.0, 2.0, 17.5) == 18.0
    assert next_tick(10.0, 1.0, 13.75) == 14.0


def test_never_before_the_first_period() -> None:
    assert next_tick(10.0, 1.0, 9.0) == 11.0


@pytest.mark.parametrize(("start", "period", "now"), [(0.0, 0.1, 4.3), (0.0, 0.1, 8.1)])
def test_float_rounding_never_gives_a_tick_at_now(start: float, period: float, now: float) -> None:
    # The naive formula lands exactly on now here: now / period rounds below k.
    naive_k = math.floor((now - start) / period) + 1
    assert start + naive_k * period == now
    tick = next_tick(start, period, now)
    assert tick > now
    assert tick == start + (naive_k + 1) * period
    assert next_tick(0.0, 0.1, 0.30000000000000004) > 0.30000000000000004


async def test_run_periodically_keeps_its_schedule(autojump_clock: trio.testing.MockClock) -> None:
    times: list[float] = []
    work = iter([0.1, 0.3, 0.9, 0.0, 0.0])

    async def tick() -> None:
        times.append(trio.current_time())
        await trio.sleep(next(work))

    start = trio.current_time()
    with trio.move_on_after(3.0):
        await run_periodically(0.5, tick, first=0.5)
    # Work of 0.1 and 0.3 s does not shift the schedule; 0.9 s skips one tick.
    # (The tick due at 3.0 loses to the cancellation due at the same instant.)
    assert [t - start for t in times] == [0.5, 1.0, 1.5, 2.5]


async def test_run_periodically_runs_once_per_tick_despite_rounding(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 0.1 is not a binary fraction: without the guard in next_tick, the schedule
    # would get stuck at 4.3 s, running a quick fn() again and again at that instant.
    times: list[float] = []

    async def tick() -> None:
        times.append(trio.current_time())

    assert trio.current_time() == 0.0
    with trio.move_on_after(9.95):
        await run_periodically(0.1, tick)
    assert times == [k * 0.1 for k in range(100)]
