"""Debounce and throttle of jobs, against real servers and a real cluster: a burst of
one key runs once with its last arguments, no later than ``max_wait`` after its first
enqueue; a throttle keeps the first enqueue of its period; keys are independent, keep
to their shard and expire; the Trio queue and both clients share them; two worker
processes and two enqueuing processes too. What cannot be debounced is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, ConfigError
from streamkit.jobs import JobStatus, chain, open_job_queue
from streamkit.jobs._committed import CommittedJobs
from streamkit.testing import wait_until
from tests.apps import debouncing
from tests.jobs_serving import serving
from tests.test_clients import blocking, in_asyncio
from tests.test_jobs_crash import assert_clean, start_job_worker, wait_serving
from tests.workers import ROOT, WorkerProcess

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from streamkit import Redis
    from streamkit.jobs import JobHandle, JobQueue


@pytest.fixture
async def queue(redis: Redis) -> AsyncIterator[JobQueue]:
    async with open_job_queue(redis, "bounce", shards=4, lease_ttl=1.0) as queue:
        yield queue


async def wait_status(handle: JobHandle[Any], status: JobStatus, within: float = 10.0) -> None:
    async def reached() -> bool:
        return await handle.status() is status

    await wait_until(reached, what=f"job {handle.id} {status}", within=within)


async def server_ms(redis: Redis) -> int:
    reply: Any = await redis.eval("return redis.call('TIME')", keys=[], args=[])
    return int(reply[0]) * 1000 + int(reply[1]) // 1000


# ------------------------------------------------------------------------ debounce


@pytest.mark.cluster
async def test_a_burst_of_one_key_runs_once_with_its_last_arguments(
    redis: Redis, queue: JobQueue
) -> None:
    ran: list[tuple[str, int]] = []

    @queue.job(debounce=0.3, key="user")
    async def touch(user: str, n: int) -> int:
        ran.append((user, n))
        return n

    # Before any worker serves: however slow the enqueues, the jobs still wait.
    a = [await touch.enqueue("a", n) for n in range(8)]
    b = [await touch.enqueue("b", n) for n in range(3)]
    # One job per key, on its key's shard; the first enqueue added it.
    assert len({h.id for h in a}) == len({h.id for h in b}) == 1
    assert a[0].id != b[0].id
    assert [h.added for h in a] == [True] + [False] * 7
    assert a[-1] == a[0]
    async with serving(queue):
        assert await a[0].result(timeout=10) == 7
        assert await b[0].result(timeout=10) == 2
        assert sorted(ran) == [("a", 7), ("b", 2)]
        # The job started: the next enqueue is a new burst.
        again = await touch.enqueue("a", 100)
        assert again.added
        assert again.id != a[0].id
        assert await again.result(timeout=10) == 100
    info = await a[0].info()
    assert info.due_at is not None
    assert info.enqueued_at is not None
    # Its time was pushed back by each enqueue: due 0.3 s after the last one.
    assert info.due_at - info.enqueued_at >= timedelta(seconds=0.3)


@pytest.mark.cluster
async def test_max_wait_bounds_how_long_a_burst_is_pushed_back(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(debounce=0.3, max_wait=timedelta(seconds=0.5))
    async def rebuild(n: int) -> int:
        return n

    first = await rebuild.enqueue(0)
    start = await server_ms(redis)
    n = 0
    # Enqueued again and again (no worker: the job stays scheduled) until an enqueue
    # would push it past the first's time + max_wait: the last one at least 220 ms after
    # the first (whatever the machine's load makes of the sleeps between them).
    while True:
        late = await server_ms(redis) >= start + 220
        n += 1
        assert (await rebuild.enqueue(n)).id == first.id
        if late:
            break
        await trio.sleep(0.02)
    info = await first.info()
    assert info.enqueued_at is not None
    assert info.due_at is not None
    assert info.due_at - info.enqueued_at == timedelta(seconds=0.5)
    assert info.status is JobStatus.SCHEDULED
    async with serving(queue):
        assert await first.result(timeout=10) == n
    ran = await first.info()
    assert ran.started_at is not None
    assert ran.started_at >= info.due_at


async def test_the_keys_expire(redis: Redis, queue: JobQueue) -> None:
    @queue.job(debounce=0.2, key="user")
    async def touch(user: str) -> None:
        pass

    @queue.job(throttle=5, key="user")
    async def ping(user: str) -> None:
        pass

    handle = await touch.enqueue("a")
    await ping.enqueue("a")
    base = queue.shard_keys[handle.shard].base
    assert 0 < await redis.pttl(f"{base}:db:touch:a") <= 200 + 3_600_000
    shard = (await ping.enqueue("a")).shard
    assert 0 < await redis.pttl(f"{queue.shard_keys[shard].base}:th:ping:a") <= 5000


# ------------------------------------------------------------------------ throttle


@pytest.mark.cluster
async def test_a_throttle_keeps_the_first_of_its_period_and_accepts_again_after(
    redis: Redis, queue: JobQueue
) -> None:
    ran: list[tuple[str, int]] = []

    @queue.job(throttle=1.0, key=lambda user, n: user)
    async def ping(user: str, n: int) -> None:
        ran.append((user, n))

    async with serving(queue):
        burst = [await ping.enqueue("a", 0)]
        # After the first's script ran: its period ends 1 s after it, at the latest.
        start = await server_ms(redis)
        burst += [await ping.enqueue("a", n) for n in range(1, 5)]
        other = await ping.enqueue("b", 0)
        assert [h.added for h in burst] == [True, False, False, False, False]
        assert {h.id for h in burst} == {burst[0].id}
        assert other.added
        await burst[0].result(timeout=10)
        await other.result(timeout=10)

        async def period_over() -> bool:
            return await server_ms(redis) > start + 1010

        await wait_until(period_over, what="the throttle's period over", within=5)
        later = await ping.enqueue("a", 9)
        assert later.added
        assert later.id != burst[0].id
        await later.result(timeout=10)
    assert sorted(ran) == [("a", 0), ("a", 9), ("b", 0)]


# ------------------------------------------------------------------------ clients


@pytest.mark.cluster
async def test_the_trio_queue_and_both_clients_merge_into_one_job(redis_url: str) -> None:
    app = App("shopb", redis_url=redis_url, job_lease_ttl=1.0, job_shards=3)

    @app.job(debounce=1.0, key="cart")
    async def price(cart: str, items: int) -> int:
        return items

    @app.job(throttle=30, key="cart")
    async def mail(cart: str) -> str:
        return cart

    async with app:
        first = await price.enqueue("c1", 1)
        kept = await mail.enqueue("c1")

    def use_blocking() -> list[tuple[str, bool]]:
        with app.blocking() as client:
            return [
                (h.id, h.added)
                for h in (client.enqueue("price", "c1", 2), client.enqueue(mail, "c1"))
            ]

    async def use_asyncio() -> list[tuple[str, bool]]:
        async with app.asyncio() as client:
            price_h = await client.enqueue(price, cart="c1", items=3)
            mail_h = await client.enqueue("mail", "c1")
            return [(price_h.id, price_h.added), (mail_h.id, mail_h.added)]

    expected = [(first.id, False), (kept.id, False)]
    assert await blocking(use_blocking) == expected
    assert await in_asyncio(use_asyncio) == expected
    async with app, serving(app.job_queue):
        assert await app.job_queue.handle(first.id).result(timeout=10) == 3
        assert await app.job_queue.handle(kept.id).result(timeout=10) == "c1"
        counts = await app.job_queue.counts()
    assert counts.succeeded == 2
    assert counts.pending == 0


# ------------------------------------------------------------------------ refused


async def test_what_a_key_replaces_or_cannot_coalesce_is_refused(queue: JobQueue) -> None:
    @queue.job(debounce=1, key="user")
    async def touch(user: str) -> None:
        pass

    @queue.job(throttle=1)
    async def ping() -> None:
        pass

    with pytest.raises(ConfigError, match="job_id"):
        await touch.enqueue("a", job_id="x")
    with pytest.raises(ConfigError, match="after"):
        await ping.enqueue(after=["x"])
    for when in ({"delay": 1}, {"at": datetime.now(UTC)}):
        with pytest.raises(ConfigError, match="debounced"):
            await touch.enqueue("a", **when)
    with pytest.raises(ConfigError, match="debounced"):
        await touch.enqueue_many([("a",)], delay=1)
    await ping.enqueue(delay=0.1)  # a throttled job may be delayed
    with pytest.raises(ConfigError, match="workflow"):
        await queue.enqueue_workflow(chain(touch.step("a")))
    with pytest.raises(ConfigError, match="commit"):
        CommittedJobs([touch])

    async def tick() -> None:
        pass

    with pytest.raises(ConfigError, match="cron"):
        queue.cron("* * * * *", debounce=5)(tick)
    with pytest.raises(ConfigError, match="the key must have"):
        await touch.enqueue("x" * 201)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"debounce": 1, "throttle": 1}, "not both"),
        ({"max_wait": 1}, "bounds a debounce"),
        ({"debounce": 2, "max_wait": 1}, "at least the debounce"),
        ({"key": "user"}, "debounce= or throttle="),
        ({"debounce": 1, "key": "nobody"}, "no parameter 'nobody'"),
        ({"debounce": 0}, "debounce"),
        ({"throttle": -1}, "throttle"),
        ({"debounce": 1, "limit_key": "user", "key_concurrency": 1}, "per-key limits"),
    ],
)
async def test_bad_declarations_are_refused(
    queue: JobQueue, options: dict[str, Any], match: str
) -> None:
    async def touch(user: str) -> None:
        pass

    with pytest.raises(ConfigError, match=match):
        queue.job(touch, **options)


# ------------------------------------------------------------------------ processes


def start_enqueuer(url: str, log_dir: Path, rounds: int, source: str) -> WorkerProcess:
    log_path = log_dir / f"enqueuer-{source}.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.apps.debouncing", "enqueue", str(rounds), source],
        cwd=ROOT,
        env={**os.environ, "STREAMKIT_REDIS_URL": url, "STREAMKIT_JOB_SHARDS": "4"},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return WorkerProcess(process, log_path, log)


@pytest.mark.cluster
@pytest.mark.timeout(60)
async def test_two_workers_and_two_enqueuers_run_one_job_per_key(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    app = "tests.apps.debouncing:app"
    shards = {"STREAMKIT_JOB_SHARDS": "4"}
    servers = [start_job_worker(redis_url, tmp_path, app=app, env=shards) for _ in range(2)]
    workers.extend(servers)
    rounds = 20
    enqueuers = [start_enqueuer(redis_url, tmp_path, rounds, s) for s in ("p", "q")]
    workers.extend(enqueuers)
    await wait_serving(*servers)

    async def all_ready() -> bool:
        return int(await redis.get(debouncing.READY) or 0) == 2

    await wait_until(all_ready, what="2 enqueuers ready", within=15)
    await redis.rpush(debouncing.GO, ["go", "go"])
    for enqueuer in enqueuers:
        assert await enqueuer.wait_exit() == 0, enqueuer.log()
    users = debouncing.USERS

    async def all_ran() -> bool:
        for user in users:
            for job in ("settle", "notify"):
                if not await redis.llen(debouncing.runs_key(job, user)):
                    return False
        return True

    await wait_until(all_ran, what="a run of each job of each user", within=20)
    async with open_job_queue(redis, "bounce", shards=4) as queue:

        async def settled() -> bool:
            return (await queue.counts()).pending == 0

        await wait_until(settled, what="no job pending", within=10)
        counts = await queue.counts()
    # One job of each kind per user, however many enqueues from both processes.
    assert counts.succeeded == 2 * len(users), counts
    for user in users:
        for job, kept in (("settle", rounds - 1), ("notify", 0)):
            runs = [
                r.decode().split()
                for r in await redis.lrange(debouncing.runs_key(job, user), 0, -1)
            ]
            assert len(runs) == 1, (job, user, runs)
            assert int(runs[0][0]) == kept, (job, user, runs)
            handles = [
                h.decode().split()
                for h in await redis.lrange(debouncing.handles_key(job, user), 0, -1)
            ]
            assert len(handles) == 2 * rounds
            assert len({job_id for job_id, _ in handles}) == 1
            assert Counter(added for _, added in handles) == {"1": 1, "0": 2 * rounds - 1}
    for process in workers:
        assert_clean(process)
