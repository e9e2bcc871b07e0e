"""The handoff of claimed jobs to the try runners (``streamkit/jobs/_handoff.py``): a
batch of jobs that never await runs back to back in one runner, a job that awaits
leaves the others to idle runners at once.

No Redis here: runners that take jobs as the worker's do, each job recording which
runner ran it. The worker's own runners are checked against Redis in
``test_jobs_that_wait_for_each_other_all_start`` (tests/test_jobs.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing

from streamkit.jobs._handoff import STREAK, Handoff

Job = Callable[[], Awaitable[None]]


async def runner(handoff: Handoff, name: int, ran: list[tuple[int, int]], jobs: list[Job]) -> None:
    """Take jobs as TryRunner.run does; record (runner, job) as each starts."""
    taker = handoff.taker()
    while True:
        index, _ = await taker.next()
        ran.append((name, index))
        await jobs[index]()


async def serve(jobs: list[Job], runners: int, beside: Job | None = None) -> list[tuple[int, int]]:
    """Hand ``jobs`` over in one batch to ``runners`` runners, with a task running
    ``beside`` from then on; (runner, job) in the order the jobs started, once every
    job has ended."""
    handoff = Handoff()
    ran: list[tuple[int, int]] = []
    ended = 0
    all_ended = trio.Event()

    def counted(job: Job) -> Job:
        async def run() -> None:
            nonlocal ended
            await job()
            ended += 1
            if ended == len(jobs):
                all_ended.set()

        return run

    wrapped = [counted(job) for job in jobs]
    async with trio.open_nursery() as nursery:
        for name in range(runners):
            nursery.start_soon(runner, handoff, name, ran, wrapped)
        nursery.start_soon(handoff.dispatch)
        await trio.testing.wait_all_tasks_blocked()
        if beside is not None:
            nursery.start_soon(beside)
        handoff.put([(index, []) for index in range(len(jobs))])
        with trio.fail_after(10):
            await all_ended.wait()
        assert len(handoff) == 0
        nursery.cancel_scope.cancel()
    return ran


async def noop() -> None:
    pass


async def test_jobs_that_never_await_run_back_to_back_in_one_runner() -> None:
    ran = await serve([noop] * 10, runners=4)
    assert [index for _, index in ran] == list(range(10))
    assert len({name for name, _ in ran}) == 1


async def test_a_runner_lets_other_tasks_run_after_a_streak() -> None:
    ticks = 0
    seen: list[int] = []

    async def tick() -> None:
        nonlocal ticks
        while True:
            await trio.lowlevel.checkpoint()
            ticks += 1

    async def job() -> None:
        seen.append(ticks)

    ran = await serve([job] * (STREAK * 3), runners=4, beside=tick)
    assert [index for _, index in ran] == list(range(STREAK * 3))
    # The runner yields after STREAK jobs; Trio runs the tasks of a round in any order,
    # so the other task has run by the time of the streak after that.
    assert all(seen[i] < seen[i + 2 * STREAK] for i in range(len(seen) - 2 * STREAK))


async def test_jobs_that_await_start_on_runners_of_their_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started = 0
    everyone = trio.Event()

    async def meet() -> None:
        # Ends only once all have started: run one after another, none would.
        nonlocal started
        started += 1
        if started == 8:
            everyone.set()
        await everyone.wait()

    ran = await serve([meet] * 8, runners=8)
    assert sorted(index for _, index in ran) == list(range(8))
    assert len({name for name, _ in ran}) == 8


async def test_jobs_left_waiting_go_to_the_runner_that_ends_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Two runners, four jobs that sleep: each runner takes the next job as it ends one.
    async def nap() -> None:
        await trio.sleep(1)

    ran = await serve([nap] * 4, runners=2)
    assert sorted(index for _, index in ran) == list(range(4))
    assert {name for name, _ in ran} == {0, 1}
    assert trio.current_time() < 2.5
