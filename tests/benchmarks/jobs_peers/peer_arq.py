"""arq's side of bench_jobs.py (see harness.py): a ``Worker`` with its defaults but the
concurrency (``max_jobs``). arq has no batch enqueue, and ``enqueue_job`` runs its own
``WATCH``/``MULTI`` transaction, so it cannot join a pipeline: jobs are enqueued with
``ArqRedis.enqueue_job`` under ``asyncio.gather``, at most 50 in flight."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

import harness
from arq import Worker, create_pool
from arq.connections import RedisSettings

if TYPE_CHECKING:
    from collections.abc import Sequence

NAME = "arq"


async def noop(ctx: Any) -> None:
    harness.job_started()
    harness.job_done()


async def sleep(ctx: Any) -> None:
    harness.job_started()
    await asyncio.sleep(harness.SLEEP)
    harness.job_done()


async def slow(ctx: Any, i: int) -> None:
    await harness.slow_job(i)


async def produce(url: str, kind: str, calls: Sequence[tuple[Any, ...]]) -> float:
    redis = await create_pool(RedisSettings.from_dsn(url))
    try:
        began = time.perf_counter()
        await harness.gather_windowed(
            [lambda args=args: redis.enqueue_job(kind, *args) for args in calls]
        )
        return time.perf_counter() - began
    finally:
        await redis.aclose()


async def work(url: str, concurrency: int) -> None:
    # What `arq module.WorkerSettings` does, but for the event loop it makes itself.
    worker = Worker(
        functions=[noop, sleep, slow],
        redis_settings=RedisSettings.from_dsn(url),
        max_jobs=concurrency,
    )
    try:
        await worker.main()
    finally:
        await worker.close()


if __name__ == "__main__":
    harness.main(sys.modules[__name__])
