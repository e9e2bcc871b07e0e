"""streaq's side of bench_jobs.py (see harness.py): a ``Worker`` with its defaults but
the concurrency, jobs enqueued with its batch API, ``Worker.enqueue_many`` (one
pipeline). Its authors' configuration: the same on uvloop (its ``Worker`` runs on
anyio, whose asyncio backend takes uvloop: ``anyio_kwargs={"use_uvloop": True}`` for
``run_sync``; here the harness runs the loop); streaq's README names no other option
for speed."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import anyio
import harness
from streaq import Worker

if TYPE_CHECKING:
    from collections.abc import Sequence

NAME = "streaq"
AUTHORS = "uvloop"
AUTHORS_UVLOOP = True


async def noop() -> None:
    harness.job_started()
    harness.job_done()


async def sleep() -> None:
    harness.job_started()
    await anyio.sleep(harness.SLEEP)
    harness.job_done()


async def slow(i: int) -> None:
    await harness.slow_job(i, anyio.sleep)


def _worker(url: str, concurrency: int) -> tuple[Worker[Any], dict[str, Any]]:
    worker: Worker[Any] = Worker(redis_url=url, concurrency=concurrency, queue_name="bench")
    tasks = {fn.__name__: worker.task()(fn) for fn in (noop, sleep, slow)}
    return worker, tasks


async def produce(url: str, kind: str, calls: Sequence[tuple[Any, ...]]) -> float:
    worker, tasks = _worker(url, 32)
    async with worker:
        began = time.perf_counter()
        await worker.enqueue_many([tasks[kind].enqueue(*args) for args in calls])
        return time.perf_counter() - began


async def work(url: str, concurrency: int) -> None:
    worker, _ = _worker(url, concurrency)
    await worker.run_async()


if __name__ == "__main__":
    harness.main(sys.modules[__name__])
