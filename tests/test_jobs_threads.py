"""Plain ``def`` jobs and the worker's threads: a worker claims no more of them than it
has free threads, so the others stay queued for other workers, and a try's timeout
counts from when its thread starts it."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest
import trio

from streamkit import App
from streamkit.jobs import JobStatus
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit.jobs import JobHandle

JOBS = 6
THREADS = 2


@pytest.mark.timeout(40)
async def test_def_jobs_beyond_the_free_threads_stay_queued_for_other_workers(
    redis_url: str,
) -> None:
    app = App("threads", redis_url=redis_url)
    release = threading.Event()
    started: list[int] = []

    @app.job
    def convert(n: int) -> str:
        started.append(n)
        if not release.wait(timeout=30):
            raise TimeoutError("never released")
        return current_worker()

    async with app, trio.open_nursery() as nursery:
        first = await nursery.start(lambda **kw: app.job_queue.serve(threads=THREADS, **kw))
        handles = [await convert.delay(n) for n in range(JOBS)]

        # One worker alone: it runs as many as it has threads, and claims no more.
        await wait_until(lambda: len(started) == THREADS, what="the first jobs started", within=10)
        await _wait_statuses(handles, executing=THREADS, sent=JOBS - THREADS)
        assert first.running_jobs == THREADS
        # A second worker takes the jobs the first has no thread for.
        second = await nursery.start(lambda **kw: app.job_queue.serve(threads=THREADS, **kw))
        await wait_until(
            lambda: len(started) == 2 * THREADS, what="the second's jobs started", within=10
        )
        await _wait_statuses(handles, executing=2 * THREADS, sent=JOBS - 2 * THREADS)
        assert (first.running_jobs, second.running_jobs) == (THREADS, THREADS)
        release.set()
        workers = [await handle.result(timeout=20) for handle in handles]
        assert sorted(started) == list(range(JOBS))
        assert {first.consumer, second.consumer} <= set(workers)
        infos = [await handle.info() for handle in handles]
        assert all(info.tries == 1 for info in infos)
        nursery.cancel_scope.cancel()


def current_worker() -> str:
    from streamkit.jobs import current_job

    return current_job().worker


async def _wait_statuses(handles: list[JobHandle[str]], *, executing: int, sent: int) -> None:
    async def reached() -> bool:
        statuses = [(await handle.info()).status for handle in handles]
        return (statuses.count(JobStatus.EXECUTING), statuses.count(JobStatus.SENT)) == (
            executing,
            sent,
        )

    await wait_until(reached, what=f"{executing} executing, {sent} queued", within=10)


@pytest.mark.timeout(40)
async def test_a_def_jobs_timeout_counts_from_when_its_thread_starts_it(redis_url: str) -> None:
    app = App("threads", redis_url=redis_url)

    @app.job(timeout=1.5, retries=0)
    def nap(n: int) -> int:
        time.sleep(0.6)
        return n

    async with app, trio.open_nursery() as nursery:
        # One thread: the jobs run one after another, each well within its timeout,
        # though the last ends 1.8 s after the first started.
        await nursery.start(lambda **kw: app.job_queue.serve(threads=1, **kw))
        handles = [await nap.delay(n) for n in range(3)]
        assert [await handle.result(timeout=20) for handle in handles] == [0, 1, 2]
        nursery.cancel_scope.cancel()
