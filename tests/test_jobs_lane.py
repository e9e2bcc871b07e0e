"""A try runner's lane: one cancel scope shared by its tries, cancelled for one try only.

No Redis: the lane is the time and cancellation logic of running tries, on Trio's
mock clock.
"""

from __future__ import annotations

import math

import trio
import trio.testing

from streamkit.jobs._tries import Lane, Try


def a_try(job_id: str) -> Try:
    return Try(job_id, 0, f"w:{job_id}", None, 1)


async def run(lane: Lane, current: Try, seconds: float, limit: float | None = None) -> str:
    """Run ``current`` in ``lane`` for ``seconds``, with a timeout of ``limit``."""
    lane.begin(current, limit)
    try:
        await trio.sleep(seconds)
    except trio.Cancelled:
        lane.interrupted = current
        raise
    finally:
        lane.end()
    return "done"


async def test_a_try_cancelled_before_it_starts_is_cancelled_as_it_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first = a_try("a")
    first.abort("no longer wanted")
    lane = Lane()
    with lane.scope:
        await run(lane, first, 10)
    assert lane.scope.cancelled_caught
    assert lane.interrupted is first
    assert first.abort_reason == "no longer wanted"


async def test_a_cancel_after_a_try_ended_leaves_the_next_one_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lane = Lane()
    first, second = a_try("a"), a_try("b")
    with lane.scope:
        assert await run(lane, first, 1) == "done"
        first.take_over()  # too late: it ended
        assert await run(lane, second, 5) == "done"
    assert not lane.scope.cancelled_caught
    assert lane.interrupted is None


async def test_cancelling_a_try_cancels_it_and_no_other(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lane, other_lane = Lane(), Lane()
    running, elsewhere = a_try("a"), a_try("b")
    ended: list[str] = []

    async def run_in(where: Lane, current: Try) -> None:
        with where.scope:
            ended.append(await run(where, current, 10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_in, lane, running)
        nursery.start_soon(run_in, other_lane, elsewhere)
        await trio.sleep(1)
        running.stop()
        # A try of another lane (or one not running) does not reach this lane.
        lane.cancel(elsewhere, "not here")
    assert lane.scope.cancelled_caught
    assert lane.interrupted is running
    assert running.stopping
    assert not other_lane.scope.cancelled_caught
    assert ended == ["done"]


async def test_a_timeout_is_each_try_own(autojump_clock: trio.testing.MockClock) -> None:
    lane = Lane()
    with lane.scope:
        began = trio.current_time()
        # Ends before its timeout: the deadline goes with it.
        assert await run(lane, a_try("a"), 1, limit=3) == "done"
        assert lane.scope.deadline == math.inf
        # Longer than the first try's timeout would have allowed: no timeout of its own.
        assert await run(lane, a_try("b"), 5) == "done"
        # Its own timeout, counted from its start.
        await run(lane, a_try("c"), 10, limit=2)
    assert lane.scope.cancelled_caught
    assert lane.interrupted is not None
    assert lane.interrupted.id == "c"
    assert trio.current_time() - began == 1 + 5 + 2
