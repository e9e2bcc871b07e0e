"""saq's side of bench_jobs.py (see harness.py): a ``Worker`` with its defaults but the
concurrency, on ``Queue.from_url``. saq has no enqueue-many (``Queue.map`` enqueues with
``asyncio.gather`` and then polls for the results): jobs are enqueued the way ``map``
does, ``Queue.enqueue`` under ``asyncio.gather``, at most 50 in flight (the queue itself
runs at most 20 Redis operations at once, its ``max_concurrent_ops``)."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

import harness
from saq import Queue, Worker

if TYPE_CHECKING:
    from collections.abc import Sequence

NAME = "saq"


async def noop(ctx: Any) -> None:
    harness.job_started()
    harness.job_done()


async def sleep(ctx: Any) -> None:
    harness.job_started()
    await asyncio.sleep(harness.SLEEP)
    harness.job_done()


async def slow(ctx: Any, *, i: int) -> None:
    await harness.slow_job(i)


async def produce(url: str, kind: str, calls: Sequence[tuple[Any, ...]]) -> float:
    queue = Queue.from_url(url, name="bench")
    await queue.connect()
    try:
        began = time.perf_counter()
        if kind == "slow":
            enqueues = [lambda i=i: queue.enqueue(kind, i=i) for (i,) in calls]
        else:
            enqueues = [lambda: queue.enqueue(kind) for _ in calls]
        await harness.gather_windowed(enqueues)
        return time.perf_counter() - began
    finally:
        await queue.disconnect()


async def work(url: str, concurrency: int) -> None:
    # What `saq module.settings` does: connect, then Worker.start().
    queue = Queue.from_url(url, name="bench")
    worker = Worker(queue, [noop, sleep, slow], concurrency=concurrency)
    await queue.connect()
    try:
        await worker.start()
    finally:
        await queue.disconnect()


if __name__ == "__main__":
    harness.main(sys.modules[__name__])
