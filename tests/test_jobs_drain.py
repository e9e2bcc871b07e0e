"""A job worker's graceful drain: no new jobs, the running ones end, then it stops."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from streamkit.jobs import JobStatus, JobWorker, open_job_queue

if TYPE_CHECKING:
    import pytest

    from streamkit import Redis


async def test_drain_lets_running_jobs_end_and_takes_no_more(redis: Redis) -> None:
    with trio.fail_after(20):
        async with open_job_queue(redis, "draining") as queue:
            started = trio.Event()
            release = trio.Event()

            @queue.job(retries=0)
            async def slow() -> str:
                started.set()
                await release.wait()
                return "done"

            first = await slow.delay()
            async with trio.open_nursery() as nursery:
                worker: JobWorker = await nursery.start(queue.serve)
                await started.wait()
                assert worker.running_jobs == 1
                second = await slow.delay()
                async with trio.open_nursery() as draining:
                    outcome: list[bool] = []

                    async def drain() -> None:
                        outcome.append(await worker.drain(grace=10))

                    draining.start_soon(drain)
                    await trio.sleep(0.3)  # room for the worker to take the second job
                    assert await second.status() is JobStatus.SENT
                    release.set()
                assert outcome == [True]
                assert await first.status() is JobStatus.SUCCESS
                assert await first.result() == "done"
                assert await second.status() is JobStatus.SENT
                nursery.cancel_scope.cancel()
            info = await second.info()
            assert (info.status, info.tries) == (JobStatus.SENT, 0)


async def test_drain_gives_up_after_its_grace_and_the_job_goes_back(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(20):
        async with open_job_queue(redis, "stuck") as queue:
            started = trio.Event()

            @queue.job
            async def endless() -> None:
                started.set()
                await trio.sleep_forever()

            handle = await endless.delay()
            async with trio.open_nursery() as nursery:
                worker: JobWorker = await nursery.start(queue.serve)
                await started.wait()
                with caplog.at_level(logging.INFO, logger="streamkit.jobs"):
                    assert await worker.drain(grace=0.2) is False
                nursery.cancel_scope.cancel()
            # Said as what happened: cancelled at the grace, put back by the stop after.
            said = [r.getMessage() for r in caplog.records if r.name == "streamkit.jobs"]
            assert (
                "draining: 1 job(s) still running when their grace ran out cancelled, to go "
                "back on the queue without spending a try"
            ) in said, said
            info = await handle.info()
            # put back without spending a try
            assert (info.status, info.tries) == (JobStatus.SENT, 0)
