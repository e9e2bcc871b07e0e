"""taskiq's side of bench_jobs.py (see harness.py): taskiq-redis's ``RedisStreamBroker``
(the one its README shows, with acknowledgements; ``ListQueueBroker`` loses a killed
worker's jobs), no result backend (taskiq's default), the receiver that ``taskiq worker``
runs, with its defaults but the concurrency (``max_async_tasks``). taskiq has no batch
enqueue: jobs are enqueued with ``kiq()`` under ``asyncio.gather``, at most 50 in flight
(the broker's connection pool holds 50). Its authors' configuration: uvloop (which
``taskiq worker`` takes by itself when it is installed) and taskiq-redis's result
backend, ``RedisAsyncResultBackend``, as taskiq-redis's README sets the broker up."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

import harness
from taskiq.api import run_receiver_task
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

if TYPE_CHECKING:
    from collections.abc import Sequence

NAME = "taskiq"
AUTHORS = "uvloop, RedisAsyncResultBackend"
AUTHORS_UVLOOP = True


async def noop() -> None:
    harness.job_started()
    harness.job_done()


async def sleep() -> None:
    harness.job_started()
    await asyncio.sleep(harness.SLEEP)
    harness.job_done()


async def slow(i: int) -> None:
    await harness.slow_job(i)


def _broker(url: str) -> tuple[RedisStreamBroker, dict[str, Any]]:
    broker = RedisStreamBroker(url=url, queue_name="bench")
    if harness.CONFIG == "authors":
        broker = broker.with_result_backend(RedisAsyncResultBackend(redis_url=url))
    tasks = {fn.__name__: broker.task(task_name=fn.__name__)(fn) for fn in (noop, sleep, slow)}
    return broker, tasks


async def produce(url: str, kind: str, calls: Sequence[tuple[Any, ...]]) -> float:
    broker, tasks = _broker(url)
    # startup() creates the consumer group, at "$": jobs sent before it would be skipped.
    await broker.startup()
    try:
        task = tasks[kind]
        began = time.perf_counter()
        await harness.gather_windowed([lambda args=args: task.kiq(*args) for args in calls])
        return time.perf_counter() - began
    finally:
        await broker.shutdown()


async def work(url: str, concurrency: int) -> None:
    broker, _ = _broker(url)
    await run_receiver_task(broker, max_async_tasks=concurrency, run_startup=True)


if __name__ == "__main__":
    harness.main(sys.modules[__name__])
