"""Drift-free periodic schedules: work runs at ``start + k * period``.

Heartbeats, lease renewals and timers all sleep until the next point of a fixed grid
instead of ``period`` after the previous run, so slow runs and round trips never make
the schedule drift, and ticks missed while a run overran are skipped rather than run
back to back. The arithmetic is pure, so it is tested on trio's mock clock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NoReturn

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["next_tick", "run_periodically"]


def next_tick(start: float, period: float, now: float) -> float:
    """Return the first ``start + k * period`` (``k >= 1``) strictly after ``now``.

    Never earlier than ``start + period``, even if ``now`` is before ``start``.
    """
    k = max(1, math.floor((now - start) / period) + 1)
    tick = start + k * period
    # Floating point can put start + k * period on or a hair below now (0.0 + 43 * 0.1
    # == 4.3, yet 4.3 / 0.1 < 43): sleeping until then returns at once, and quick
    # work would run again and again at the same instant.
    while tick <= now:
        k += 1
        tick = start + k * period
    return tick


async def run_periodically(
    period: float, fn: Callable[[], Awaitable[object]], *, first: float = 0.0
) -> NoReturn:
    """Await ``fn()`` at ``start + first + k * period`` for ``k = 0, 1, ...``, forever.

    ``start`` is the time of the call. A run that takes longer than ``period`` skips
    the ticks it overlapped.

    Cancellation:
        Returns only by cancellation.

    Error handling:
        An exception from ``fn`` propagates and ends the schedule.
    """
    start = trio.current_time() + first
    await trio.sleep_until(start)
    while True:
        await fn()
        await trio.sleep_until(next_tick(start, period, trio.current_time()))
