"""The fence of the claim and finish scripts, call by call, against a real Redis: a
finish is recorded once for the claim that started the try (sent again after a lost
reply, it says so and writes nothing), refused for a claim whose lease another worker
took over; a job taken over from a dead worker spends that try, one a worker takes back
from itself (a claim whose reply it lost) does not. (The same under workers and faults:
test_jobs_crash.py, tests/reliability/.)"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pytest

from streamkit._lua import script
from streamkit._redis import LuaScript
from streamkit.jobs import JobStatus, open_job_queue
from streamkit.jobs._claim import ensure_groups
from tests.test_jobs_limit_scripts import claim, wait_redis_past

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Redis
    from streamkit.jobs import JobQueue

_FINISH = LuaScript(script("jobs/finish"))
LEASE = 0.2


@pytest.fixture
async def queue(redis: Redis) -> AsyncIterator[JobQueue]:
    async with open_job_queue(redis, "fence", lease_ttl=LEASE) as queue:
        await ensure_groups(queue, 0)
        yield queue


async def finish(queue: JobQueue, token: Any, job_id: Any) -> int:
    keys = queue.shard_keys[0]
    args = [keys.base, math.ceil(queue.lease_ttl * 1000), job_id, token, "ok", b"7", 1]
    reply: list[Any] = await _FINISH(queue.redis, keys.keys, args)
    return int(reply[0][0])


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def test_a_finish_sent_again_is_known_and_a_stale_one_refused(
    redis: Redis, queue: JobQueue
) -> None:
    async def noop() -> int:
        return 7

    job = queue.job(noop)
    first = await job.enqueue()
    [started] = await claim(queue, 10, "w1")
    assert text(started[4]) == "w1:1"
    assert await finish(queue, started[4], started[0]) == 1
    # the same outcome again (its reply was lost): known, nothing written twice
    assert await finish(queue, started[4], started[0]) == 2
    info = await first.info()
    assert info.status is JobStatus.SUCCESS
    assert info.tries == 1

    second = await job.enqueue()
    [stale] = await claim(queue, 10, "w1")
    await wait_redis_past(redis, LEASE)
    [taken] = await claim(queue, 10, "w2", reclaim=True)
    assert text(taken[4]) == "w2:2"  # w1 held it when its lease ran out: that try is spent
    assert await finish(queue, stale[4], stale[0]) == 0
    assert (await second.info()).status is JobStatus.EXECUTING
    assert await finish(queue, taken[4], taken[0]) == 1
    assert (await second.info()).status is JobStatus.SUCCESS


async def test_a_worker_taking_back_its_own_lost_claim_does_not_spend_a_try(
    redis: Redis, queue: JobQueue
) -> None:
    async def noop() -> None:
        pass

    handle = await queue.job(noop).enqueue()
    [lost] = await claim(queue, 10, "w1")  # as if its reply never reached w1
    await wait_redis_past(redis, LEASE)
    [again] = await claim(queue, 10, "w1", reclaim=True)
    assert text(lost[4]) == text(again[4]) == "w1:1"
    assert await finish(queue, again[4], again[0]) == 1
    info = await handle.info()
    assert info.status is JobStatus.SUCCESS
    assert info.tries == 1
