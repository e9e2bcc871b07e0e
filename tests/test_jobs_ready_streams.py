"""A ready stream holds exactly the entries of jobs not yet over: the queued ones (not
delivered yet) and the pending ones (running, or handed back). The finish script removes
the entries of the jobs that ended, by trimming the stream's head where every entry
older than the oldest pending one is over, and by deleting the rest: whatever order jobs
end in, and after the consumer group was made again, nothing queued is ever removed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from streamkit._wire import text
from streamkit.jobs import open_job_queue
from streamkit.jobs._claim import ensure_groups
from streamkit.jobs._scripts import GROUP
from tests.test_jobs_limit_scripts import claim, finish, ids

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Redis
    from streamkit.jobs import JobQueue


@pytest.fixture
async def queue(redis: Redis) -> AsyncIterator[JobQueue]:
    async with open_job_queue(redis, "ready", lease_ttl=30) as queue:
        await ensure_groups(queue, 0)
        yield queue


async def entries(queue: JobQueue) -> list[str]:
    """The job ids of the normal priority's ready stream, oldest first."""
    stream = await queue.redis.xrange(queue.shard_keys[0].ready(1))
    return [text(entry.field_values[b"id"]) for entry in stream]


async def test_entries_of_ended_jobs_go_whatever_order_they_end_in(queue: JobQueue) -> None:
    @queue.job
    async def job(n: int) -> None: ...

    handles = await job.enqueue_many([(n,) for n in range(8)])
    every = [h.id for h in handles]
    started = await claim(queue, 4)
    assert ids(started) == every[:4]
    # Not the oldest: deleted where they are; the oldest pending keeps its place.
    await finish(queue, started[1:3])
    assert await entries(queue) == [every[0], every[3], *every[4:]]
    # The oldest: the head trimmed up to the next pending one.
    await finish(queue, started[:1])
    assert await entries(queue) == [every[3], *every[4:]]
    # The last pending: nothing pending, the queued ones stay.
    await finish(queue, started[3:])
    assert await entries(queue) == every[4:]
    later = await claim(queue, 2)
    await finish(queue, later[1:])
    assert await entries(queue) == [every[4], *every[6:]]
    rest = await claim(queue, 10)
    await finish(queue, [*later[:1], *rest])
    assert await entries(queue) == []


async def test_a_group_made_again_does_not_lose_queued_entries(queue: JobQueue) -> None:
    """A consumer group deleted under running jobs and made again (it delivers every
    entry again): a job that ends then, its entry not pending in the new group, takes
    no queued entry with it."""

    @queue.job
    async def job(n: int) -> None: ...

    handles = await job.enqueue_many([(n,) for n in range(5)])
    every = [h.id for h in handles]
    started = await claim(queue, 2)
    stream = queue.shard_keys[0].ready(1)
    await queue.redis.xgroup_destroy(stream, GROUP)
    await ensure_groups(queue, 0)
    await finish(queue, started[1:])
    assert await entries(queue) == [every[0], *every[2:]]
    again: Any = await claim(queue, 10)  # the new group delivers what is still queued
    assert set(ids(again)) <= set(every)
    assert set(every[2:]) <= set(ids(again))
