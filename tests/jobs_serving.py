"""In-process job workers for the job queue tests, and checks of a queue's Redis keys."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

import attrs
import trio

from streamkit.jobs._scripts import GROUP

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Redis
    from streamkit.jobs import JobQueue


@attrs.define(eq=False)
class ServingWorker:
    """One ``queue.serve`` running in a test's nursery, stoppable on its own."""

    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    stopped: trio.Event = attrs.field(factory=trio.Event)

    async def stop(self) -> None:
        """Stop it gracefully (its running tries go back to the queue) and wait."""
        self.scope.cancel("test stops the worker")
        with trio.fail_after(10):
            await self.stopped.wait()


async def _serve(
    queue: JobQueue,
    handlers: Any,
    options: dict[str, Any],
    *,
    task_status: trio.TaskStatus[ServingWorker],
) -> None:
    worker = ServingWorker()
    try:
        with worker.scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(queue.serve, handlers, **options))
                task_status.started(worker)
    finally:
        worker.stopped.set()


async def start_worker(
    nursery: trio.Nursery, queue: JobQueue, handlers: Any = None, **options: Any
) -> ServingWorker:
    """Start ``queue.serve(handlers, **options)``; return once it serves."""
    worker: ServingWorker = await nursery.start(_serve, queue, handlers, options)
    return worker


@contextlib.asynccontextmanager
async def serving(queue: JobQueue, handlers: Any = None, **options: Any) -> AsyncIterator[None]:
    """A block during which ``queue.serve(handlers, **options)`` runs."""
    async with trio.open_nursery() as nursery:
        await start_worker(nursery, queue, handlers, **options)
        yield
        nursery.cancel_scope.cancel("test block over")


async def stream_backlog(redis: Redis, queue: JobQueue) -> dict[str, tuple[int, int]]:
    """Per ready stream of ``queue``, (entries, entries pending in the group)."""
    out: dict[str, tuple[int, int]] = {}
    for keys in queue.shard_keys:
        for priority in range(3):
            key = keys.ready(priority)
            length = await redis.xlen(key)
            pending = 0
            if await redis.exists([key]):
                for group in await redis.xinfo_groups(key):
                    if group[b"name"] == GROUP.encode():
                        count = group[b"pending"]  # as XPENDING's summary counts
                        assert isinstance(count, int)
                        pending = count
            out[key] = (length, pending)
    return out


async def assert_drained(redis: Redis, queue: JobQueue) -> None:
    """Nothing of ``queue`` left queued, pending or scheduled, no concurrency slot held,
    no end left to deliver to another shard."""
    backlog = await stream_backlog(redis, queue)
    assert all(v == (0, 0) for v in backlog.values()), backlog
    for keys in queue.shard_keys:
        assert await redis.zcard(keys.schedule) == 0
        slots = [key async for key in redis.scan_iter(match=f"{keys.base}:cc:*")]
        assert slots == [], slots
        assert await redis.llen(f"{keys.base}:xout") == 0


async def wait_settled(redis: Redis, queue: JobQueue, within: float = 10.0) -> None:
    """Wait until no ended job of ``queue`` has dependents left to settle or ends left
    to deliver to other shards (the workers do it, right after the job ends)."""
    from streamkit.testing import wait_until

    async def settled() -> bool:
        for keys in queue.shard_keys:
            if await redis.llen(f"{keys.base}:settle") or await redis.llen(f"{keys.base}:xout"):
                return False
        return True

    await wait_until(settled, what="the ended jobs' dependents settled", within=within)
