"""The job queue's behaviours, in-process against a real Redis: statuses transition by
transition, results, dedupe, ETAs, priorities, bad input, dead letters, graceful stops
and leases. (Workers killed mid-job: tests/reliability.)"""

from __future__ import annotations

import contextlib
import enum
import random
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import pytest
import trio

from streamkit import (
    App,
    Backoff,
    EncodeError,
    NotConnected,
    Record,
    open_redis,
)
from streamkit.jobs import (
    JobCall,
    JobFailed,
    JobNotFound,
    JobQueue,
    JobStatus,
    Priority,
    ResultNotKept,
    chain,
    open_job_queue,
    progress,
)
from streamkit.jobs._layout import shard_for
from streamkit.lowlevel import redis_statistics
from streamkit.testing import wait_until
from tests.jobs_serving import assert_drained, serving, start_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Redis
    from streamkit.jobs import JobHandle
    from streamkit.testing import RedisServer

#: Retries at once (well: as soon as a worker looks), for fast tests.
FAST = Backoff(initial=0.01, jitter=0)


class Bounce(Exception):
    """A job's own failure."""


@pytest.fixture
async def queue(redis: Redis) -> AsyncIterator[JobQueue]:
    async with open_job_queue(redis, "work", lease_ttl=1.0) as queue:
        yield queue


async def wait_status(handle: JobHandle[Any], status: JobStatus, within: float = 5.0) -> None:
    async def reached() -> bool:
        return await handle.status() is status

    await wait_until(reached, what=f"job {handle.id} {status}", within=within)


async def failure(handle: JobHandle[Any], within: float = 5.0) -> JobFailed:
    """The JobFailed that waiting for ``handle``'s result raises."""
    with pytest.raises(JobFailed) as caught:
        await handle.result(timeout=within)
    return caught.value


async def server_time(redis: Redis) -> datetime:
    """The server's clock (what the queue's scripts go by)."""
    reply = await redis.eval("return redis.call('TIME')", keys=[], args=[])
    seconds, micros = cast("list[bytes]", reply)
    return datetime.fromtimestamp(int(seconds), UTC) + timedelta(microseconds=int(micros))


# ---------------------------------------------------------------------- the status machine


@pytest.mark.cluster
async def test_a_job_goes_sent_then_executing_then_success(redis: Redis, queue: JobQueue) -> None:
    started, release = trio.Event(), trio.Event()

    @queue.job
    async def add(a: int, b: int) -> int:
        started.set()
        await release.wait()
        return a + b

    handle = await add.delay(2, b=3)
    info = await handle.info()
    assert info.status is JobStatus.SENT
    assert (info.name, info.args, info.kwargs, info.priority) == ("add", (2,), {"b": 3}, "normal")
    assert (info.tries, info.max_tries, info.started_at, info.worker) == (0, 4, None, None)
    assert (await queue.counts()).queued == {"high": 0, "normal": 1, "low": 0}

    async with serving(queue):
        with trio.fail_after(5):
            await started.wait()
        info = await handle.info()
        assert info.status is JobStatus.EXECUTING
        assert info.tries == 1
        assert info.worker is not None
        assert info.enqueued_at is not None
        assert info.started_at is not None
        assert info.started_at >= info.enqueued_at
        counts = await queue.counts()
        assert (counts.running, counts.queued["normal"]) == (1, 0)

        release.set()
        assert await handle.result(timeout=5) == 5
        info = await handle.info()
        assert info.status is JobStatus.SUCCESS
        assert info.finished_at is not None
        assert info.started_at is not None
        assert info.finished_at >= info.started_at
        assert info.error is None
        counts = await queue.counts()
        assert (counts.succeeded, counts.running, counts.pending) == (1, 0, 0)
    await assert_drained(redis, queue)


async def test_jobs_that_wait_for_each_other_all_start(queue: JobQueue) -> None:
    # Claimed together, run by a worker whose runners take a claim's jobs back to back
    # while they never await (jobs/_handoff.py): each of these awaits the others, so
    # they end only if each started on a runner of its own.
    started = 0
    everyone = trio.Event()

    @queue.job()
    async def meet() -> int:
        nonlocal started
        started += 1
        if started == 12:
            everyone.set()
        await everyone.wait()
        return started

    handles = await meet.enqueue_many([() for _ in range(12)])
    async with serving(queue, concurrency=12):
        for handle in handles:
            assert await handle.result(timeout=10) == 12


async def test_retries_leave_the_applications_random_generator_alone(queue: JobQueue) -> None:
    # The jitter of a retry's delay comes from streamkit's own generator: an application
    # seeding ``random`` for a reproducible run (or hypothesis, checking its draws from
    # another thread) sees its global state untouched by a worker.
    tries: list[int] = []

    @queue.job(retries=3, backoff=Backoff(initial=0.01, jitter=0.5))
    async def flaky() -> int:
        tries.append(1)
        if len(tries) < 3:
            raise Bounce("fails")
        return len(tries)

    random.seed(1234)
    before = random.getstate()
    async with serving(queue):
        handle = await flaky.delay()
        assert await handle.result(timeout=10) == 3
    assert random.getstate() == before


@pytest.mark.cluster
async def test_a_failed_try_goes_to_retry_then_runs_again(redis: Redis, queue: JobQueue) -> None:
    starts: list[float] = []
    failed = trio.Event()

    @queue.job(retries=2, backoff=Backoff(initial=0.5, jitter=0))
    async def flaky(n: int) -> int:
        starts.append(trio.current_time())
        if len(starts) == 1:
            failed.set()
            raise Bounce("first try fails")
        return n * 10

    async with serving(queue):
        handle = await flaky.delay(4)
        with trio.fail_after(5):
            await failed.wait()
        await wait_status(handle, JobStatus.RETRY)
        info = await handle.info()
        assert info.tries == 1
        assert info.error is not None
        assert (info.error.type, info.error.message) == (
            "tests.test_jobs.Bounce",
            "first try fails",
        )
        assert (await queue.counts()).retrying == 1

        assert await handle.result(timeout=5) == 40
    info = await handle.info()
    assert (info.status, info.tries, len(starts)) == (JobStatus.SUCCESS, 2, 2)
    assert starts[1] - starts[0] >= 0.49, "the retry waited its backoff"
    await assert_drained(redis, queue)


@pytest.mark.cluster
async def test_a_job_whose_tries_run_out_goes_dead_with_its_error(
    redis: Redis, queue: JobQueue
) -> None:
    tries: list[int] = []

    @queue.job(retries=2, backoff=FAST)
    async def doomed(n: int) -> None:
        tries.append(n)
        raise Bounce(f"no luck with {n}")

    async with serving(queue):
        handle = await doomed.delay(7)
        failed = await failure(handle)
    assert (failed.job_id, failed.status) == (handle.id, "dead")
    assert failed.error_type == "tests.test_jobs.Bounce"
    assert failed.message == "no luck with 7"
    assert "Traceback (most recent call last)" in failed.traceback
    assert 'raise Bounce(f"no luck with {n}")' in failed.traceback
    assert failed.traceback.rstrip().endswith("tests.test_jobs.Bounce: no luck with 7")
    assert tries == [7, 7, 7]
    info = await handle.info()
    assert (info.status, info.tries, info.max_tries) == (JobStatus.DEAD, 3, 3)
    assert [d.id for d in await queue.dead_letters()] == [handle.id]
    counts = await queue.counts()
    assert (counts.dead, counts.retrying, counts.pending) == (1, 0, 0)
    await assert_drained(redis, queue)


@pytest.mark.cluster
async def test_a_delayed_job_is_scheduled_then_runs_once_due(redis: Redis, queue: JobQueue) -> None:
    @queue.job
    async def stamp() -> str:
        return "stamped"

    handle = await stamp.enqueue(delay=0.4)
    info = await handle.info()
    assert info.status is JobStatus.SCHEDULED
    assert info.due_at is not None
    assert info.enqueued_at is not None
    assert info.due_at - info.enqueued_at == timedelta(milliseconds=400)
    assert (await queue.counts()).scheduled == 1

    due = (await server_time(redis)) + timedelta(milliseconds=500)
    at_handle = await stamp.enqueue(at=due)
    at_info = await at_handle.info()
    assert at_info.status is JobStatus.SCHEDULED
    assert at_info.due_at is not None
    assert abs(at_info.due_at - due) < timedelta(milliseconds=1)

    async with serving(queue):
        for h in (handle, at_handle):
            assert await h.result(timeout=5) == "stamped"
            info = await h.info()
            assert info.started_at is not None
            assert info.due_at is not None
            assert info.started_at >= info.due_at
    await assert_drained(redis, queue)


async def test_nothing_runs_before_its_eta(redis: Redis, queue: JobQueue) -> None:
    ran_at: dict[str, datetime] = {}

    @queue.job
    async def stamp(tag: str) -> None:
        ran_at[tag] = await server_time(redis)

    async with serving(queue):
        due: dict[str, datetime] = {}
        handles = []
        for i, delay in enumerate([0.05, 0.3, 0.1, 0.6, 0.2]):
            now = await server_time(redis)
            handles.append(await stamp.enqueue(f"d{i}", delay=delay))
            due[f"d{i}"] = now + timedelta(seconds=delay)
        for i, delay in enumerate([0.15, 0.4]):
            at = await server_time(redis) + timedelta(seconds=delay)
            handles.append(await stamp.enqueue(f"a{i}", at=at))
            due[f"a{i}"] = at
        handles.append(await stamp.enqueue("td", delay=timedelta(milliseconds=250)))
        due["td"] = (await handles[-1].info()).due_at  # type: ignore[assignment]
        for handle in handles:
            await handle.result(timeout=5)
    assert set(ran_at) == set(due)
    for tag, ran in ran_at.items():
        # the server's clock has millisecond steps in the job's due time
        assert ran >= due[tag] - timedelta(milliseconds=1), tag


@pytest.mark.cluster
async def test_a_sharded_queue_runs_and_counts_jobs_across_its_shards(redis: Redis) -> None:
    # On a cluster its six shards are six slots, spread over the masters.
    async with open_job_queue(redis, "wide", shards=6, lease_ttl=1.0) as wide:

        @wide.job
        async def square(n: int) -> int:
            return n * n

        async with serving(wide):
            handles = [await square.delay(n) for n in range(24)]
            assert [await h.result(timeout=5) for h in handles] == [n * n for n in range(24)]
        assert len({shard_for(h.id, 6) for h in handles}) > 1
        counts = await wide.counts()
        assert (counts.succeeded, counts.pending) == (24, 0)


@pytest.mark.cluster
async def test_a_job_waits_for_its_dependencies_then_runs(redis: Redis, queue: JobQueue) -> None:
    release = trio.Event()
    order: list[str] = []

    @queue.job
    async def first() -> int:
        await release.wait()
        order.append("first")
        return 1

    @queue.job
    async def then(tag: str) -> str:
        order.append(tag)
        return tag

    async with serving(queue):
        a = await first.delay()
        b = await then.enqueue("b", after=[a])
        c = await then.enqueue("c", after=[a, b.id])
        for handle in (b, c):
            assert await handle.status() is JobStatus.WAITING
        assert (await queue.counts()).waiting == 2

        release.set()
        assert await c.result(timeout=5) == "c"
        assert await b.result(timeout=5) == "b"
        assert order == ["first", "b", "c"]

        # a dependency that succeeded already holds nothing up
        d = await then.enqueue("d", after=[a])
        assert await d.result(timeout=5) == "d"
    assert (await queue.counts()).succeeded == 4
    await assert_drained(redis, queue)


@pytest.mark.cluster
async def test_a_dead_dependency_kills_its_dependents_transitively(
    redis: Redis, queue: JobQueue
) -> None:
    release = trio.Event()
    ran: list[str] = []

    @queue.job(retries=0)
    async def base() -> None:
        await release.wait()
        raise Bounce("base fails")

    @queue.job
    async def then(tag: str) -> None:
        ran.append(tag)

    async with serving(queue):
        a = await base.delay()
        b = await then.enqueue("b", after=[a])
        c = await then.enqueue("c", after=[b])
        d = await then.enqueue("d", after=[a])
        release.set()
        assert (await failure(a)).error_type == "tests.test_jobs.Bounce"
        cause = "tests.test_jobs.Bounce: base fails"
        for handle, parent in ((b, a), (c, b), (d, a)):
            failed = await failure(handle)
            assert (failed.status, failed.error_type) == ("dead", "DependencyFailed")
            # the parent's end, with the root cause of the failure
            assert failed.message == f"job {parent.id} it depends on ended dead: " + (
                cause if parent is a else f"job {a.id} ended dead: {cause}"
            )
        # depending on a job that is dead already: dead at once
        e = await then.enqueue("e", after=[a])
        assert await e.status() is JobStatus.DEAD
        unknown = await then.enqueue("f", after=["no-such-job"])
        failed = await failure(unknown)
        assert failed.error_type == "DependencyFailed"
        assert "no-such-job" in failed.message
        assert "unknown" in failed.message
    assert ran == []
    assert (await queue.counts()).dead == 6
    assert len(await queue.dead_letters()) == 6
    await assert_drained(redis, queue)


async def test_an_aborted_dependency_kills_its_dependents(redis: Redis, queue: JobQueue) -> None:
    @queue.job
    async def step(tag: str) -> str:
        return tag

    a = await step.delay("a")
    b = await step.enqueue("b", after=[a])
    c = await step.enqueue("c", after=[b])
    assert await a.abort("changed my mind") is JobStatus.ABORTED
    for handle, parent in ((b, a), (c, b)):
        failed = await failure(handle)
        assert failed.error_type == "DependencyFailed"
        assert failed.message == f"job {parent.id} it depends on ended " + (
            "aborted: Aborted: changed my mind"
            if parent is a
            else f"dead: job {a.id} ended aborted: Aborted: changed my mind"
        )
    counts = await queue.counts()
    assert (counts.aborted, counts.dead, counts.waiting, counts.pending) == (1, 2, 0, 0)
    await assert_drained(redis, queue)


async def test_aborting_a_queued_job_ends_it_at_once(redis: Redis, queue: JobQueue) -> None:
    ran: list[str] = []

    @queue.job
    async def work(tag: str) -> str:
        ran.append(tag)
        return tag

    queued = await work.delay("queued")
    scheduled = await work.enqueue("scheduled", delay=0.2)
    waiting = await work.enqueue("waiting", after=[scheduled])
    assert await queued.abort("not needed") is JobStatus.ABORTED
    assert await scheduled.abort() is JobStatus.ABORTED
    assert await queued.status() is JobStatus.ABORTED
    failed = await failure(queued)
    assert (failed.status, failed.error_type, failed.message) == (
        "aborted",
        "Aborted",
        "not needed",
    )
    assert (await failure(waiting)).error_type == "DependencyFailed"
    await assert_drained(redis, queue)  # its ready entry and its schedule entry are gone

    async with serving(queue):
        done = await work.delay("after")
        assert await done.result(timeout=5) == "after"
        # aborting what ended already changes nothing
        assert await done.abort() is JobStatus.SUCCESS
        assert await queued.abort() is JobStatus.ABORTED
    assert ran == ["after"]
    with pytest.raises(JobNotFound):
        await queue.abort("no-such-job")
    counts = await queue.counts()
    assert (counts.aborted, counts.dead, counts.succeeded) == (2, 1, 1)


@pytest.mark.cluster
async def test_aborting_a_running_job_cancels_its_try(redis: Redis, queue: JobQueue) -> None:
    started = trio.Event()
    cancelled: list[bool] = []

    @queue.job(retries=3)
    async def endless() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(True)
            raise

    @queue.job
    async def quick() -> str:
        return "still serving"

    async with serving(queue):
        handle = await endless.delay()
        with trio.fail_after(5):
            await started.wait()
        begun = trio.current_time()
        assert await handle.abort("operator said so") is JobStatus.EXECUTING
        failed = await failure(handle)
        assert trio.current_time() - begun < 2.0
        assert (failed.status, failed.error_type, failed.message) == (
            "aborted",
            "Aborted",
            "operator said so",
        )
        assert cancelled == [True]
        info = await handle.info()
        assert (info.status, info.tries) == (JobStatus.ABORTED, 1), "not retried"
        assert await (await quick.delay()).result(timeout=5) == "still serving"
    counts = await queue.counts()
    assert (counts.aborted, counts.running, counts.retrying) == (1, 0, 0)
    await assert_drained(redis, queue)


@pytest.mark.parametrize("how", ["the try fails", "its worker stops"])
async def test_a_job_aborted_while_running_is_not_started_again(
    redis: Redis, queue: JobQueue, how: str
) -> None:
    started, fail_now = trio.Event(), trio.Event()
    runs: list[str] = []

    @queue.job(retries=2, backoff=FAST)
    async def fragile() -> None:
        runs.append("run")
        started.set()
        await fail_now.wait()
        raise Bounce("failed as the abort came")

    async with trio.open_nursery() as nursery:
        worker = await start_worker(nursery, queue)
        handle = await fragile.delay()
        with trio.fail_after(5):
            await started.wait()
        # The try ends before the worker's next lease renewal sees the abort.
        assert await handle.abort("stop it") is JobStatus.EXECUTING
        if how == "the try fails":
            fail_now.set()
        else:
            await worker.stop()
            await start_worker(nursery, queue)
        failed = await failure(handle)
        nursery.cancel_scope.cancel()
    assert (failed.status, failed.error_type, failed.message) == ("aborted", "Aborted", "stop it")
    assert runs == ["run"]
    await assert_drained(redis, queue)


async def test_a_job_not_started_before_it_expires_ends_expired(
    redis: Redis, queue: JobQueue
) -> None:
    ran: list[str] = []

    @queue.job(expires=0.2)
    async def fresh(tag: str) -> str:
        ran.append(tag)
        return tag

    stale = await fresh.delay("stale")
    own = await fresh.enqueue("own", expires=timedelta(milliseconds=100))
    later = await fresh.enqueue("later", expires=60)
    info = await stale.info()
    assert info.expires_at is not None
    assert info.enqueued_at is not None
    assert info.expires_at - info.enqueued_at == timedelta(milliseconds=200)
    deadline = info.expires_at

    async def expired() -> bool:
        return await server_time(redis) > deadline + timedelta(milliseconds=2)

    await wait_until(expired, what="the jobs' expiry", within=5)
    async with serving(queue):
        for handle in (stale, own):
            failed = await failure(handle)
            assert (failed.status, failed.error_type) == ("expired", "Expired")
            assert await handle.status() is JobStatus.EXPIRED
        assert await later.result(timeout=5) == "later"
    assert ran == ["later"]
    assert (await queue.counts()).expired == 2
    await assert_drained(redis, queue)


async def test_expiry_does_not_apply_to_a_job_that_started(redis: Redis, queue: JobQueue) -> None:
    tries: Counter[str] = Counter()

    @queue.job(expires=0.3, retries=1, backoff=Backoff(initial=0.6, jitter=0))
    async def perishable(tag: str) -> str:
        tries[tag] += 1
        if tries[tag] == 1 or (tag == "replayed" and tries[tag] == 2):
            raise Bounce(f"{tag} fails")
        return tag

    async with serving(queue):
        retried = await perishable.delay("retried")
        replayed = await perishable.delay("replayed")
        # the retry is due after the expiry: it runs all the same
        assert await retried.result(timeout=5) == "retried"
        info = await retried.info()
        assert info.due_at is None
        assert info.started_at is not None
        assert info.expires_at is not None
        assert info.started_at > info.expires_at
        # and so does a dead job replayed after its expiry
        await failure(replayed)
        assert await queue.replay([replayed.id]) == [replayed.id]
        assert await replayed.result(timeout=5) == "replayed"
    assert tries == {"retried": 2, "replayed": 3}
    assert (await queue.counts()).expired == 0


async def test_a_try_that_times_out_fails_and_is_retried(redis: Redis, queue: JobQueue) -> None:
    tries: Counter[str] = Counter()

    @queue.job(timeout=0.2, retries=1, backoff=FAST)
    async def slow(tag: str) -> str:
        tries[tag] += 1
        if tag == "never" or tries[tag] == 1:
            await trio.sleep_forever()
        return tag

    async with serving(queue):
        once = await slow.delay("once")
        never = await slow.delay("never")
        assert await once.result(timeout=5) == "once"
        failed = await failure(never)
    assert (failed.status, failed.error_type) == ("dead", "Timeout")
    assert failed.message == "timed out after 0.2s"
    assert tries == {"once": 2, "never": 2}
    assert (await once.info()).tries == 2
    assert (await never.info()).tries == 2
    await assert_drained(redis, queue)


async def test_only_the_retry_on_exceptions_are_retried(redis: Redis, queue: JobQueue) -> None:
    tries: Counter[str] = Counter()

    @queue.job(retries=3, retry_on=(ConnectionError,), backoff=FAST)
    async def fetch(tag: str) -> str:
        tries[tag] += 1
        if tag == "bad":
            raise ValueError("not retryable")
        if tries[tag] == 1:
            raise ConnectionRefusedError("retryable (a ConnectionError)")
        return tag

    async with serving(queue):
        bad = await fetch.delay("bad")
        flaky = await fetch.delay("flaky")
        failed = await failure(bad)
        assert await flaky.result(timeout=5) == "flaky"
    assert (failed.error_type, failed.message) == ("ValueError", "not retryable")
    assert tries == {"bad": 1, "flaky": 2}
    assert ((await bad.info()).tries, (await flaky.info()).tries) == (1, 2)


# ---------------------------------------------------------------------- result()


async def test_result_of_an_unknown_job_raises_at_once(queue: JobQueue) -> None:
    handle = queue.handle("never-enqueued")
    with trio.fail_after(1):
        with pytest.raises(JobNotFound, match="never-enqueued"):
            await handle.result()
        with pytest.raises(JobNotFound):
            await handle.status()
        with pytest.raises(JobNotFound):
            await handle.info()
        with pytest.raises(JobNotFound):
            await queue.find("never-enqueued")


async def test_result_of_a_job_that_keeps_none_raises_result_not_kept(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(keep_result=False)
    async def fire() -> dict[str, int]:
        return {"big": 1}

    async with serving(queue):
        handle = await fire.delay()
        with pytest.raises(ResultNotKept):
            await handle.result(timeout=5)
    assert await handle.status() is JobStatus.SUCCESS
    assert not await redis.hexists(queue.shard_keys[0].job(handle.id), "result")


async def test_a_waiter_arriving_after_the_end_gets_the_result(
    redis_url: str, queue: JobQueue
) -> None:
    @queue.job
    async def compute(x: int) -> dict[str, Any]:
        return {"x": x, "squares": [x * x]}

    async with serving(queue):
        handle = await compute.delay(3)
        await wait_status(handle, JobStatus.SUCCESS)
    assert await handle.result(timeout=1) == {"x": 3, "squares": [9]}
    # and so does another process, knowing the id only
    async with open_redis(redis_url) as other, open_job_queue(other, "work") as elsewhere:
        late = await elsewhere.find(handle.id)
        assert await late.result(timeout=1) == {"x": 3, "squares": [9]}


async def test_result_gives_up_after_its_timeout(queue: JobQueue) -> None:
    @queue.job
    async def never_run() -> None:
        pass

    handle = await never_run.delay()
    begun = trio.current_time()
    with trio.fail_after(5), pytest.raises(trio.TooSlowError):
        await handle.result(timeout=0.2)
    assert 0.2 <= trio.current_time() - begun < 1.0
    assert await handle.status() is JobStatus.SENT


@pytest.mark.cluster
async def test_many_waiters_share_one_blocking_reader(redis_url: str, queue: JobQueue) -> None:
    @queue.job
    async def square(x: int) -> int:
        return x * x

    async with open_redis(redis_url) as client, open_job_queue(client, "work") as producer:

        @producer.job(name="square")
        async def produced(x: int) -> int:
            return x * x

        handles = await produced.enqueue_many((i,) for i in range(200))
        results: dict[int, int] = {}

        async def wait(i: int, handle: JobHandle[Any]) -> None:
            results[i] = await handle.result(timeout=20)

        async def all_watched() -> bool:
            keys = producer.shard_keys[0]
            for handle in handles:
                if not await client.hexists(keys.job(handle.id), "w"):
                    return False
            return True

        with trio.fail_after(30):
            async with trio.open_nursery() as waiters:
                for i, handle in enumerate(handles):
                    waiters.start_soon(wait, i, handle)
                await wait_until(all_watched, what="200 waiters registered", within=10)
                stats = redis_statistics(client)
                assert (stats.dedicated_connections, stats.dedicated_in_use) == (1, 1)
                async with serving(queue):
                    await wait_until(lambda: len(results) == 200, what="200 results", within=15)
        assert results == {i: i * i for i in range(200)}
        stats = redis_statistics(client)
        assert stats.dedicated_connections == 1
        assert stats.discarded == 0


# ---------------------------------------------------------------------- dedupe


@pytest.mark.cluster
async def test_a_job_id_makes_enqueue_idempotent(redis: Redis, queue: JobQueue) -> None:
    runs: list[int] = []

    @queue.job
    async def charge(amount: int) -> int:
        runs.append(amount)
        return amount

    first = await charge.enqueue(10, job_id="order-1")
    again = await charge.enqueue(99, job_id="order-1")
    assert first.id == again.id == "order-1"
    # The duplicate added nothing (it said added=True).
    assert (first.added, again.added) == (True, False)
    assert (await again.info()).args == (10,)
    assert (await queue.counts()).queued["normal"] == 1
    async with serving(queue):
        assert await again.result(timeout=5) == 10
        # In a batch too, where an id given twice is added once.
        batch = await charge.enqueue_many(
            [JobCall(args=(n,), job_id=job_id) for n, job_id in enumerate(["order-2", "order-1"])]
            + [(7,), JobCall(args=(8,), job_id="order-2")]
        )
        assert [h.added for h in batch] == [True, False, True, False]
        assert [h.id for h in batch][::3] == ["order-2", "order-2"]
        assert [await h.result(timeout=5) for h in batch] == [0, 10, 7, 0]
    assert sorted(runs) == [0, 7, 10]
    await assert_drained(redis, queue)


async def test_concurrent_enqueues_of_one_id_give_one_run(redis: Redis, queue: JobQueue) -> None:
    runs: list[int] = []

    @queue.job
    async def report(n: int) -> int:
        runs.append(n)
        return n

    ids: list[str] = []

    async def enqueue(n: int) -> None:
        ids.append((await report.enqueue(n, job_id="daily-report")).id)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for n in range(50):
                nursery.start_soon(enqueue, n)
    assert ids == ["daily-report"] * 50
    async with serving(queue):
        handle = queue.handle("daily-report")
        winner = await handle.result(timeout=5)
    assert runs == [winner]
    counts = await queue.counts()
    assert (counts.succeeded, counts.pending) == (1, 0)


async def test_a_finished_job_is_not_run_again_within_its_dedupe_window(
    redis: Redis, queue: JobQueue
) -> None:
    runs: list[int] = []

    @queue.job
    async def once(n: int) -> int:
        runs.append(n)
        return n

    async with serving(queue):
        handle = await once.enqueue(1, job_id="once")
        assert await handle.result(timeout=5) == 1
        again = await once.enqueue(2, job_id="once")
        assert again.id == handle.id
        assert await again.status() is JobStatus.SUCCESS
        assert await again.result(timeout=5) == 1
    assert runs == [1]
    counts = await queue.counts()
    assert (counts.succeeded, counts.pending) == (1, 0)
    await assert_drained(redis, queue)


async def test_after_its_dedupe_window_an_id_runs_again(redis: Redis, queue: JobQueue) -> None:
    runs: list[int] = []

    @queue.job(dedupe_window=1, retries=0)
    async def nightly(n: int) -> int:
        runs.append(n)
        if n == 1:
            raise Bounce("first night fails")
        return n

    once_key = f"{queue.shard_keys[0].base}:once:night"

    async def window_over() -> bool:
        return not await redis.exists([once_key])

    async with serving(queue):
        handle = await nightly.enqueue(1, job_id="night")
        await failure(handle)
        assert (await queue.counts()).dead == 1
        await wait_until(window_over, what="the dedupe window to pass", within=5)

        again = await nightly.enqueue(2, job_id="night")
        assert await again.result(timeout=5) == 2
        await wait_until(window_over, what="the dedupe window to pass", within=5)
        third = await nightly.enqueue(3, job_id="night")
        assert await third.result(timeout=5) == 3
    assert runs == [1, 2, 3]
    # the dead run was replaced: it left the dead letters and the dead count
    assert await queue.dead_letters() == []
    counts = await queue.counts()
    assert (counts.dead, counts.succeeded, counts.pending) == (0, 2, 0)
    await assert_drained(redis, queue)


# ---------------------------------------------------------------------- priorities


@pytest.mark.cluster
async def test_higher_priorities_run_first_and_fifo_within_one(
    redis: Redis, queue: JobQueue
) -> None:
    order: list[str] = []

    @queue.job
    async def work(tag: str) -> None:
        order.append(tag)

    @queue.job(priority="high")
    async def urgent(tag: str) -> None:
        order.append(tag)

    expected: dict[str, list[str]] = {"high": [], "normal": [], "low": []}
    for i in range(4):
        for prio in ("low", "normal", "high"):
            tag = f"{prio}{i}"
            await work.enqueue(tag, priority=prio)
            expected[prio].append(tag)
        await urgent.delay(f"urgent{i}")
        expected["high"].append(f"urgent{i}")
    assert (await queue.counts()).queued == {"high": 8, "normal": 4, "low": 4}

    async with serving(queue, concurrency=1):
        await wait_until(lambda: len(order) == 16, what="16 jobs run", within=10)
    assert order == expected["high"] + expected["normal"] + expected["low"]
    await assert_drained(redis, queue)


async def test_jobs_arriving_at_an_idle_worker_run_by_priority_within_its_concurrency(
    redis: Redis, queue: JobQueue
) -> None:
    order: list[str] = []
    running: set[str] = set()
    most = 0
    release = trio.Event()

    @queue.job
    async def hold(tag: str) -> str:
        nonlocal most
        order.append(tag)
        running.add(tag)
        most = max(most, len(running))
        await release.wait()
        running.discard(tag)
        return tag

    async def worker_blocked() -> bool:
        clients = await redis.client_list()
        return any(c["cmd"] == "xreadgroup" and "b" in c["flags"] for c in clients)

    async with serving(queue, concurrency=1):
        # The worker waits on the three ready streams at once, and one script fills
        # them all: whatever that wait returns, the worker starts one job, the high one.
        await wait_until(worker_blocked, what="the worker waiting for jobs", within=5)
        handles = await hold.enqueue_many(
            [JobCall(args=(p,), priority=p) for p in ("low", "normal", "high")]
        )
        await wait_until(lambda: order, what="a job started", within=5)
        counts = await queue.counts()
        assert counts.running == 1, counts
        assert order == ["high"]
        release.set()
        for handle in handles:
            await handle.result(timeout=5)
    assert order == ["high", "normal", "low"]
    assert most == 1
    for handle in handles:
        info = await handle.info()
        assert (info.tries, info.lost) == (1, 0)
    await assert_drained(redis, queue)


# ---------------------------------------------------------------------- enqueueing


@pytest.mark.cluster
async def test_enqueue_many_takes_tuples_dicts_and_job_calls(redis: Redis, queue: JobQueue) -> None:
    @queue.job
    async def greet(name: str, punctuation: str = "!") -> str:
        return f"hello {name}{punctuation}"

    handles = await greet.enqueue_many(
        [
            ("ann",),
            {"name": "bob", "punctuation": "?"},
            JobCall(args=("cy",), kwargs={"punctuation": "."}, job_id="cy-1", priority="high"),
            ("dee", "~"),
        ]
    )
    assert handles[2].id == "cy-1"
    assert len({h.id for h in handles}) == 4
    assert [(await h.info()).priority for h in handles] == ["normal", "normal", "high", "normal"]

    tomorrow = await server_time(redis) + timedelta(days=1)
    later = await greet.enqueue_many(
        [
            ("eve",),
            JobCall(args=("fay",), priority="high"),
            JobCall(args=("gus",), delay=60),
            JobCall(args=("hal",), at=tomorrow),
        ],
        priority="low",
        delay=30,
    )
    infos = [await h.info() for h in later]
    assert [(i.status, i.priority) for i in infos] == [
        (JobStatus.SCHEDULED, "low"),
        (JobStatus.SCHEDULED, "high"),
        (JobStatus.SCHEDULED, "low"),
        (JobStatus.SCHEDULED, "low"),
    ]
    due = [i.due_at - i.enqueued_at for i in infos if i.due_at and i.enqueued_at]
    assert due[:3] == [timedelta(seconds=30), timedelta(seconds=30), timedelta(seconds=60)]
    assert infos[3].due_at is not None
    assert abs(infos[3].due_at - tomorrow) < timedelta(milliseconds=1), "its own time"
    async with serving(queue):
        assert [await h.result(timeout=5) for h in handles] == [
            "hello ann!",
            "hello bob?",
            "hello cy.",
            "hello dee~",
        ]
    assert (await queue.counts()).scheduled == 4


async def test_bad_arguments_are_refused_before_anything_is_sent(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job
    async def greet(name: str, punctuation: str = "!") -> str:
        return f"hello {name}{punctuation}"

    with pytest.raises(TypeError, match=r"^job greet: too many positional arguments"):
        await greet.enqueue_many([("ann",), ("a", "b", "c")])
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        await greet.enqueue_many([("ann",), {"name": "x", "colour": "red"}])
    with pytest.raises(TypeError, match="missing a required argument: 'name'"):
        await greet.delay()  # type: ignore[call-arg]  # a type checker says so too
    with pytest.raises(TypeError, match="unexpected keyword argument 'nme'"):
        await greet.enqueue("ann", nme="x", job_id="x")
    with pytest.raises(EncodeError, match="the arguments of job greet"):
        await greet.delay(object())  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        await greet.enqueue_many([("ann",), JobCall(args=({1, 2}, {"a": object()}))])
    assert await redis.dbsize() == 0


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Parcel(Record):
    parcel_id: int
    weight: float


async def test_arguments_of_the_wrong_types_are_refused_at_enqueue(
    redis: Redis, queue: JobQueue
) -> None:
    """Checked against the function's annotations by the rule records follow (the JSON
    of each argument, as stored, must structure back into its annotation), before
    anything is sent: one line naming the job, the argument, the types."""

    @queue.job
    async def charge(order_id: int, amount: int, note: str | None = None) -> int:
        return amount

    @queue.job
    async def ship(parcel: Parcel, tags: list[str], anything: Any = None, loose=None) -> None:  # type: ignore[no-untyped-def]
        ...

    with pytest.raises(TypeError) as caught:
        await charge.delay("42", "100")  # type: ignore[arg-type]
    assert str(caught.value) == (
        "job charge: argument order_id: expected int, got str '42'; "
        "argument amount: expected int, got str '100'"
    )
    with pytest.raises(TypeError, match=r"^job charge: argument note: expected str \| None"):
        await charge.enqueue(1, 2, note=3)
    with pytest.raises(TypeError, match=r"^job charge: argument amount: expected int, got float"):
        await charge.enqueue_many([(1, 2), (1, 2.5)])
    with pytest.raises(TypeError) as caught:
        await ship.delay(Parcel(parcel_id="p", weight=1.0), ["a"])  # type: ignore[arg-type]
    assert str(caught.value) == "job ship: argument parcel.parcel_id: expected int, got str 'p'"
    with pytest.raises(TypeError, match=r"^job ship: argument parcel.weight: missing"):
        await ship.delay({"parcel_id": 1}, ["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^job ship: argument tags: expected list\[str\]"):
        await ship.delay(Parcel(parcel_id=1, weight=1.0), "ab")  # type: ignore[arg-type]
    # Workflows and runtime schedules check their calls the same way.
    with pytest.raises(TypeError, match=r"^job charge: argument amount"):
        await queue.enqueue_workflow(chain(charge.step(1, 2), charge.step(1.5)))
    with pytest.raises(TypeError, match=r"^job charge: argument order_id"):
        await queue.set_schedule("nightly", charge, "0 3 * * *", args=["1", 2])
    assert await redis.dbsize() == 0

    # Valid values of other types pass, as do Any and unannotated parameters; the
    # result a chain feeds a step is not known yet, so not checked.
    await charge.delay(Level.HIGH, 2)
    await ship.delay({"parcel_id": 1, "weight": 2}, ("a",), [1, "x"], loose={"y": 2})  # type: ignore[arg-type]
    await queue.enqueue_workflow(chain(charge.step(1, 2), charge.step(3)))


async def test_dict_arguments_whose_keys_json_cannot_keep_are_refused_naming_the_argument(
    redis: Redis, queue: JobQueue
) -> None:
    """A job's arguments are JSON, whose object keys are strings: a parameter declared
    ``dict[int, int]`` (or holding one) would get str keys, so any argument for it is
    refused at enqueue, naming the argument and why; a dict with int keys for a
    parameter that does not say its keys is refused naming the argument too."""

    @queue.job
    async def tally(d: dict[int, int], nested: list[dict[int, str]] | None = None) -> None: ...

    @queue.job
    async def loose(d: dict[Any, int], named: dict[str, int] | None = None) -> None: ...

    why = "its arguments are JSON, whose object keys are strings"
    for given in ({"x": 2}, {1: 2}, {"1": 2}, {}):
        with pytest.raises(TypeError) as caught:
            await tally.delay(given)  # type: ignore[arg-type]
        assert str(caught.value) == (
            f"job tally: argument d: a job cannot take a dict[int, int]: {why}, so the job "
            f"would get its int keys as str; declare the keys str (or take a list of pairs)"
        )
    nested = r"argument nested: a job cannot take a dict\[int, str\]"
    with pytest.raises(TypeError, match=nested):
        await tally.delay(None, nested=[{1: "a"}])  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match=r"^the arguments of job loose: argument d: a dict key"):
        await loose.delay({1: 2})
    with pytest.raises(EncodeError, match=r"argument named: a dict key that is not a str"):
        await loose.delay({"a": 1}, named={1: 2})  # type: ignore[dict-item]
    assert await redis.dbsize() == 0
    await loose.delay({"a": 1}, named={"b": 2})  # str keys: taken


async def test_a_worker_kills_jobs_it_cannot_run_and_keeps_serving(
    redis_url: str, redis: Redis, queue: JobQueue
) -> None:
    @queue.job
    async def resize(path: str) -> str:
        return path

    async with (
        open_redis(redis_url) as client,
        open_job_queue(client, "work") as producer,
        trio.open_nursery() as nursery,
    ):

        @producer.job(name="resize")
        async def resize_v2(path: str, width: int) -> str:
            return path

        @producer.job
        async def ghost() -> None:
            pass

        worker = await start_worker(nursery, queue)
        unknown = await ghost.delay()
        misfit = await resize_v2.delay("a.png", 10)
        fitting = await resize_v2.enqueue_many([{"path": "b.png", "width": 1}])
        checks: list[tuple[JobHandle[Any], str]] = [
            (unknown, "no job named 'ghost' (known: resize)"),
            (misfit, "bad arguments: job resize: too many positional arguments"),
            (fitting[0], "bad arguments: job resize: got an unexpected keyword argument 'width'"),
        ]
        for handle, message in checks:
            failed = await failure(handle)
            assert (failed.status, failed.error_type, failed.message) == (
                "dead",
                "BadInput",
                message,
            )
        assert not worker.stopped.is_set()
        good = await resize.delay("c.png")
        assert await good.result(timeout=5) == "c.png"
        nursery.cancel_scope.cancel()
    assert (await queue.counts()).by_name["ghost"]["dead"] == 1
    await assert_drained(redis, queue)


# ---------------------------------------------------------------------- running


async def test_plain_functions_run_in_threads_at_most_threads_at_once(
    redis: Redis, queue: JobQueue
) -> None:
    pairs = threading.Barrier(2, timeout=5)
    lock = threading.Lock()
    active = most = 0

    @queue.job
    def crunch(n: int) -> dict[str, Any]:
        nonlocal active, most
        with lock:
            active += 1
            most = max(most, active)
        try:
            pairs.wait()  # two threads at once, or this times out
            return {"n": n, "main": threading.current_thread() is threading.main_thread()}
        finally:
            with lock:
                active -= 1

    async with serving(queue, concurrency=8, threads=2):
        handles = await crunch.enqueue_many((n,) for n in range(6))
        results = [await h.result(timeout=10) for h in handles]
    assert results == [{"n": n, "main": False} for n in range(6)]
    assert most == 2
    await assert_drained(redis, queue)


async def test_progress_shows_in_info(queue: JobQueue) -> None:
    reported, release = trio.Event(), trio.Event()

    @queue.job
    async def resize() -> str:
        await progress(0.4, "resizing")
        reported.set()
        await release.wait()
        return "done"

    @queue.job
    def thumbnail() -> str:
        trio.from_thread.run(progress, 0.9, "almost")
        return "done"

    @queue.job
    async def overdo() -> str:
        try:
            await progress(1.5)
        except ValueError as exc:
            return str(exc)
        return "accepted"

    async with serving(queue):
        handle = await resize.delay()
        with trio.fail_after(5):
            await reported.wait()
        info = await handle.info()
        assert (info.progress, info.progress_message) == (0.4, "resizing")
        release.set()
        assert await handle.result(timeout=5) == "done"

        sync = await thumbnail.delay()
        assert await sync.result(timeout=5) == "done"
        info = await sync.info()
        assert (info.progress, info.progress_message) == (0.9, "almost")
        assert "fraction" in await (await overdo.delay()).result(timeout=5)
    with pytest.raises(RuntimeError, match="inside a running job"):
        await progress(0.5)


@pytest.mark.cluster
async def test_counts_per_status_and_name_after_a_mixed_run(redis: Redis, queue: JobQueue) -> None:
    @queue.job
    async def ok(n: int) -> int:
        return n

    @queue.job(expires=0.1)
    async def perishable() -> None:
        pass

    @queue.job(retries=0)
    async def boom() -> None:
        raise Bounce("boom")

    @queue.job
    async def later() -> None:
        pass

    aborted = await ok.delay(0)
    await aborted.abort()
    stale = await perishable.delay()
    deadline = (await stale.info()).expires_at
    assert deadline is not None

    async def expired() -> bool:
        return await server_time(redis) > deadline + timedelta(milliseconds=2)

    await wait_until(expired, what="the job's expiry", within=5)
    scheduled = await later.enqueue(delay=3600)
    await later.enqueue(after=[scheduled])
    async with serving(queue):
        handles = [await ok.delay(n) for n in range(1, 4)]
        dead = await boom.delay()
        for handle in handles:
            await handle.result(timeout=5)
        await failure(dead)
        await failure(stale)
    counts = await queue.counts()
    assert counts.queued == {"high": 0, "normal": 0, "low": 0}
    assert (counts.scheduled, counts.waiting, counts.running, counts.retrying) == (1, 1, 0, 0)
    assert (counts.succeeded, counts.dead, counts.aborted, counts.expired) == (3, 1, 1, 1)
    assert counts.pending == 2
    assert {name: {s: n for s, n in per.items() if n} for name, per in counts.by_name.items()} == {
        "ok": {"success": 3, "aborted": 1},
        "perishable": {"expired": 1},
        "boom": {"dead": 1},
        "later": {"scheduled": 1, "waiting": 1},
    }


async def test_counts_and_streams_are_exact_when_one_call_claims_and_ends_many_jobs(
    redis: Redis, queue: JobQueue
) -> None:
    # Queued before the worker starts, so that a claim starts up to its concurrency of
    # them at once and a finish ends many: the scripts sum their counter moves per call
    # and acknowledge the ended entries per priority once per call.
    tried: Counter[int] = Counter()

    @queue.job
    async def ok(n: int) -> int:
        return n

    @queue.job(retries=0)
    async def boom(n: int) -> None:
        raise Bounce(str(n))

    @queue.job(retries=1, backoff=FAST)
    async def flaky(n: int) -> int:
        tried[n] += 1
        if tried[n] == 1:
            raise Bounce("first try")
        return n

    prios: tuple[Priority, ...] = ("high", "normal", "low")
    handles: list[JobHandle[Any]] = [
        *await ok.enqueue_many([JobCall(args=(n,), priority=prios[n % 3]) for n in range(40)]),
        *await boom.enqueue_many([JobCall(args=(n,), priority=prios[n % 3]) for n in range(20)]),
        *await flaky.enqueue_many([JobCall(args=(n,), priority=prios[n % 3]) for n in range(20)]),
    ]
    async with serving(queue):
        for handle in handles:
            with contextlib.suppress(JobFailed):
                await handle.result(timeout=10)
    counts = await queue.counts()
    assert {name: {s: n for s, n in per.items() if n} for name, per in counts.by_name.items()} == {
        "ok": {"success": 40},
        "boom": {"dead": 20},
        "flaky": {"success": 20},
    }
    assert (counts.running, counts.retrying, counts.pending) == (0, 0, 0)
    assert all(n >= 0 for per in counts.by_name.values() for n in per.values()), counts
    assert sorted(tried.values()) == [2] * 20
    await assert_drained(redis, queue)


@pytest.mark.cluster
async def test_dead_letters_can_be_replayed_and_purged(redis: Redis, queue: JobQueue) -> None:
    broken = {0, 1, 2}
    attempts: Counter[int] = Counter()

    @queue.job(retries=1, backoff=FAST)
    async def fragile(n: int) -> int:
        attempts[n] += 1
        if n in broken:
            raise Bounce(f"broken {n}")
        return n

    async with serving(queue):
        handles = [await fragile.delay(n) for n in range(3)]
        for handle in handles:
            await failure(handle)
        dead = await queue.dead_letters()
        assert sorted(d.id for d in dead) == sorted(h.id for h in handles)
        for info in dead:
            assert info.status is JobStatus.DEAD
            assert info.tries == 2
            assert info.error is not None
            assert info.error.type == "tests.test_jobs.Bounce"
        assert len(await queue.dead_letters(limit=2)) == 2

        broken.discard(0)
        assert await queue.replay([handles[0].id]) == [handles[0].id]
        assert await handles[0].result(timeout=5) == 0
        info = await handles[0].info()
        assert (info.status, info.tries) == (JobStatus.SUCCESS, 1), "tries reset"
        assert attempts[0] == 3
        assert await queue.replay([handles[0].id]) == [], "not dead: not replayed"

    assert await queue.purge([handles[1].id]) == [handles[1].id]
    with pytest.raises(JobNotFound):
        await handles[1].status()
    assert [d.id for d in await queue.dead_letters()] == [handles[2].id]
    assert await queue.purge() == [handles[2].id]
    assert await queue.dead_letters() == []
    assert await queue.replay() == []
    counts = await queue.counts()
    assert (counts.dead, counts.succeeded, counts.pending) == (0, 1, 0)
    await assert_drained(redis, queue)


async def test_a_graceful_stop_puts_the_running_job_back_unspent(
    redis: Redis, queue: JobQueue
) -> None:
    started = trio.Event()
    runs: list[str] = []

    @queue.job(retries=0)
    async def long() -> str:
        runs.append("start")
        started.set()
        if len(runs) == 1:
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                runs.append("cancelled")
                raise
        return "finished"

    async with trio.open_nursery() as nursery:
        first = await start_worker(nursery, queue)
        handle = await long.delay()
        with trio.fail_after(5):
            await started.wait()
        assert (await handle.info()).tries == 1
        await first.stop()
        info = await handle.info()
        assert (info.status, info.tries, info.lost) == (JobStatus.SENT, 0, 0)
        assert runs == ["start", "cancelled"]
        counts = await queue.counts()
        assert counts.running == 0
        assert {s: n for s, n in counts.by_name["long"].items() if n} == {"sent": 1}

        await start_worker(nursery, queue)
        assert await handle.result(timeout=5) == "finished"
        nursery.cancel_scope.cancel()
    info = await handle.info()
    assert (info.status, info.tries, info.lost) == (JobStatus.SUCCESS, 1, 0)
    await assert_drained(redis, queue)


async def test_a_job_put_back_by_a_graceful_stop_counts_as_pending(queue: JobQueue) -> None:
    started = trio.Event()

    @queue.job
    async def endless() -> None:
        started.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        worker = await start_worker(nursery, queue)
        handle = await endless.delay()
        with trio.fail_after(5):
            await started.wait()
        await worker.stop()
    assert await handle.status() is JobStatus.SENT
    counts = await queue.counts()
    assert counts.pending == 1, counts
    assert counts.queued["normal"] == 1, counts


async def test_long_healthy_jobs_are_not_redelivered(redis: Redis, queue: JobQueue) -> None:
    assert queue.lease_ttl == 1.0
    runs: list[str] = []

    @queue.job
    async def long() -> str:
        runs.append("async")
        await trio.sleep(2.5)
        return "done"

    @queue.job
    def long_in_a_thread() -> str:
        runs.append("thread")
        time.sleep(2.5)
        return "done"

    async with trio.open_nursery() as nursery:
        for _ in range(3):  # one of them idle, looking for jobs whose lease ran out
            await start_worker(nursery, queue, concurrency=1)
        handles = [await long.delay(), await long_in_a_thread.delay()]
        for handle in handles:
            assert await handle.result(timeout=10) == "done"
        nursery.cancel_scope.cancel()
    assert sorted(runs) == ["async", "thread"]
    for handle in handles:
        info = await handle.info()
        assert (info.tries, info.lost) == (1, 0)
    await assert_drained(redis, queue)


async def test_a_worker_rides_out_redis_pausing_longer_than_the_lease(
    private_redis: RedisServer,
) -> None:
    started = trio.Event()
    runs: list[str] = []

    async with (
        open_redis(private_redis.url) as client,
        open_job_queue(client, "work", lease_ttl=1.0) as queue,
        trio.open_nursery() as nursery,
    ):

        @queue.job
        async def long() -> str:
            runs.append("run")
            started.set()
            await trio.sleep(3.0)
            return "done"

        worker = await start_worker(nursery, queue)
        handle = await long.delay()
        with trio.fail_after(5):
            await started.wait()
        private_redis.pause()
        try:
            await trio.sleep(1.5)  # the outage: longer than a lease
        finally:
            private_redis.resume()
        assert await handle.result(timeout=10) == "done"
        assert not worker.stopped.is_set()
        nursery.cancel_scope.cancel()
    assert runs == ["run"]


async def test_a_worker_started_while_redis_restarts_waits_for_it(
    private_redis: RedisServer,
) -> None:
    """A job worker whose queue reached Redis, started while Redis is down for longer
    than a command's retries (5 s): it waits for Redis (it used to give up creating the
    ready streams' groups, and exit), then runs jobs."""
    async with (
        open_redis(private_redis.url) as client,
        open_job_queue(client, "work", lease_ttl=1.0) as queue,
        trio.open_nursery() as nursery,
    ):

        @queue.job
        async def hello() -> str:
            return "hello"

        await trio.to_thread.run_sync(private_redis.stop)
        try:
            starting = trio.Event()

            async def serve() -> None:
                starting.set()
                await nursery.start(queue.serve)

            nursery.start_soon(serve)
            await starting.wait()
            await trio.sleep(6.0)  # the outage: past a command's 5 s of retries
        finally:
            await trio.to_thread.run_sync(private_redis.start)
        handle = await hello.delay()
        assert await handle.result(timeout=10) == "hello"
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------- App binding


@pytest.mark.cluster
async def test_an_app_declares_jobs_and_runs_them(redis_url: str) -> None:
    app = App("shop", redis_url=redis_url)
    ticks: list[str] = []

    @app.job(retries=1, backoff=FAST)
    async def total(prices: list[int]) -> int:
        return sum(prices)

    @app.cron("* * * * *")
    async def tick() -> None:
        ticks.append("tick")

    assert set(app.jobs) == {"total", "tick"}
    assert app.jobs["total"].options.retries == 1
    schedule = app.jobs["tick"].schedule
    assert schedule is not None
    assert schedule.expression == "* * * * *"
    with pytest.raises(NotConnected):
        _ = app.job_queue
    with pytest.raises(NotConnected):
        await total.delay([1])

    async with app:
        queue = app.job_queue
        assert queue.name == "shop"
        assert set(queue.jobs) == {"total", "tick"}
        async with serving(queue):
            handle = await total.delay([1, 2, 3])
            assert await handle.result(timeout=5) == 6
            # the last tick (under a minute ago) is run when a worker starts
            await wait_until(lambda: ticks, what="a cron tick", within=5)
        counts = await queue.counts()
        assert counts.by_name["tick"]["success"] == len(ticks)
        keys = await app.redis.keys(f"{queue.shard_keys[0].base}:job:cron:tick:*")
        stamps = [int(key.rsplit(b":", 1)[1]) for key in keys]
        assert len(stamps) == len(ticks)
        assert all(stamp % 60 == 0 for stamp in stamps), "one id per minute's tick"
    with pytest.raises(NotConnected):
        _ = app.job_queue
