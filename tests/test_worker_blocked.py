"""A worker whose processor blocks the event loop (``time.sleep``): the watchdog
names the processor and partition, and signals still work."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from streamkit.testing import wait_until
from tests.apps.blocking import STARTED, Job, app, jobs
from tests.workers import WorkerProcess, start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis

APP = "tests.apps.blocking:app"
GROUP = "blocking.jobs.sleepy"


async def blocked_worker(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> tuple[WorkerProcess, int]:
    """A worker whose processor sleeps 60 s in time.sleep; and the job's partition."""
    worker = start_worker(redis_url, tmp_path, app=APP)
    workers.append(worker)
    await wait_members(redis, 1, group=GROUP)
    app.settings = attrs.evolve(app.settings, redis_url=redis_url)
    job = Job(n=7, seconds=60)
    async with app:
        await jobs.send(job)

    async def started() -> bool:
        return await redis.llen(STARTED) > 0

    await wait_until(started, what="the processor blocking", within=10)
    return worker, jobs.partition_of(job)


async def wait_for_watchdog(worker: WorkerProcess) -> None:
    await wait_until(
        lambda: "the event loop has been blocked" in worker.log(),
        what="the watchdog's warning",
        within=6,
    )


@pytest.mark.timeout(30)
async def test_the_watchdog_names_the_blocking_processor(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    with trio.fail_after(25):
        worker, partition = await blocked_worker(redis_url, redis, tmp_path, workers)
        await wait_for_watchdog(worker)
        log = worker.log()
        assert f"processor 'sleepy' on jobs partition {partition}" in log, log
        assert "tests/apps/blocking.py:" in log, log
        assert "in sleepy" in log, log
        assert "trio.to_thread.run_sync" in log


@pytest.mark.timeout(30)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_a_second_signal_ends_a_blocked_worker_at_once(
    redis_url: str,
    redis: Redis,
    tmp_path: Path,
    workers: list[WorkerProcess],
    signum: signal.Signals,
) -> None:
    with trio.fail_after(25):
        worker, partition = await blocked_worker(redis_url, redis, tmp_path, workers)
        await wait_for_watchdog(worker)
        worker.send_signal(signum)
        # The first signal is acknowledged although the loop cannot run.
        await wait_until(
            lambda: f"{signum.name}: stopping once the event loop runs again" in worker.log(),
            what="the first signal acknowledged",
            within=5,
        )
        assert f"processor 'sleepy' on jobs partition {partition}" in worker.log()
        assert worker.process.poll() is None
        worker.send_signal(signum)
        assert await worker.wait_exit(within=5) == 128 + signum, worker.log()
