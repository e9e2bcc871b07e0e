"""The job queue's size limits, against real servers, one of them with Redis' smallest
``proto-max-bulk-len`` (1 MB): arguments too big are refused at enqueue, a result too
big ends its job dead, an outcome Redis refuses ends that job dead without holding back
the others of its batch, and batches are cut by bytes as well as count."""

from __future__ import annotations

import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, ConfigError, EncodeError, Settings, open_redis
from streamkit._lua import script
from streamkit._redis import LuaScript, call_once
from streamkit.jobs import JobCall, JobFailed, JobStatus, open_job_queue
from streamkit.jobs._claim import ensure_groups, hand_back
from streamkit.jobs._finish import settle_all
from streamkit.jobs._scripts import SETTLE_BUDGET
from streamkit.testing import RedisServer
from tests.jobs_serving import serving
from tests.test_jobs_crash import assert_clean, start_job_worker, wait_serving

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from streamkit import Redis
    from streamkit.jobs import JobHandle, JobQueue
    from tests.workers import WorkerProcess

HOSTILE = "tests.apps.jobs_hostile:app"
MB = 1024 * 1024
_ABORT = LuaScript(script("jobs/abort"))
_CLAIM = LuaScript(script("jobs/claim"))
_FINISH = LuaScript(script("jobs/finish"))
_SETTLE = LuaScript(script("jobs/settle"))


@pytest.fixture(scope="module")
def small_server() -> Iterator[RedisServer]:
    """A server that refuses any argument over 1 MB (the smallest limit Redis takes)."""
    with RedisServer(extra_args=["--proto-max-bulk-len", "1mb"]) as server:
        yield server


@pytest.fixture
async def small_redis(small_server: RedisServer) -> AsyncIterator[Redis]:
    async with open_redis(small_server.url) as client:
        await client.flushall()
        yield client


async def failure(handle: JobHandle[Any], within: float = 15) -> JobFailed:
    with pytest.raises(JobFailed) as failed:
        await handle.result(timeout=within)
    return failed.value


async def evalsha_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    found = stats.get("cmdstat_evalsha") or {}
    assert isinstance(found, dict)
    return int(found.get("calls", 0))


# ---------------------------------------------------------------------- the setting


def test_the_limit_is_a_validated_setting_of_1_mib_by_default() -> None:
    assert Settings.from_env({}).job_max_bytes == MB
    assert Settings.from_env({"STREAMKIT_JOB_MAX_BYTES": "4000000"}).job_max_bytes == 4_000_000
    for bad in ("0", "-5", "lots"):
        with pytest.raises(ConfigError, match="STREAMKIT_JOB_MAX_BYTES"):
            Settings.from_env({"STREAMKIT_JOB_MAX_BYTES": bad})


async def test_an_apps_queue_takes_the_setting(redis_url: str) -> None:
    app = App("sized", redis_url=redis_url, job_max_bytes=2048)

    @app.job
    async def store(blob: str) -> None:
        pass

    async with app:
        assert app.job_queue.max_bytes == 2048
        with pytest.raises(EncodeError, match="over the queue's limit of 2,048"):
            await store.delay("x" * 2048)
        await store.delay("x" * 2000)


async def test_a_queue_refuses_a_limit_that_is_no_positive_integer(redis: Redis) -> None:
    with pytest.raises(ConfigError, match="max_bytes"):
        async with open_job_queue(redis, "work", max_bytes=0):
            pass


# ---------------------------------------------------------------------- enqueueing


async def test_arguments_over_the_limit_are_refused_before_anything_is_sent(
    redis: Redis,
) -> None:
    async with open_job_queue(redis, "work") as queue:

        @queue.job
        async def store(blob: str) -> None:
            pass

        with pytest.raises(EncodeError) as refused:
            await store.delay("x" * (2 * MB))
        with pytest.raises(EncodeError):
            await store.enqueue_many([("small",), ("y" * MB,)])
        await store.delay("z" * (MB - 100))  # within the limit, with the JSON around it
    assert str(refused.value) == (
        "the arguments of job store: 2,097,161 bytes encoded, over the queue's limit of "
        "1,048,576 (max_bytes)"
    )
    assert "\n" not in str(refused.value)
    async with open_job_queue(redis, "work") as queue:
        assert (await queue.counts()).by_name == {"store": {"sent": 1}}


async def test_a_batch_of_large_jobs_goes_in_calls_of_about_half_a_megabyte(
    redis: Redis,
) -> None:
    async with open_job_queue(redis, "work") as queue:

        @queue.job
        async def store(blob: str) -> None:
            pass

        before = await evalsha_calls(redis)
        handles = await store.enqueue_many([(f"{n}" * 300_000,) for n in range(6)])
        calls = await evalsha_calls(redis) - before
        small = await store.enqueue_many([(f"{n}",) for n in range(1200)])
        small_calls = await evalsha_calls(redis) - before - calls
        statuses = {await h.status() for h in [*handles, *small]}
    # 300 KB each: one job per call (two would be over 512 KiB); small ones 250 a call.
    assert (calls, small_calls) == (6, 5)
    assert statuses == {JobStatus.SENT}


# ---------------------------------------------------------------------- results


async def test_a_result_over_the_limit_ends_the_job_dead_and_the_others_succeed(
    small_redis: Redis,
) -> None:
    async with open_job_queue(small_redis, "work", lease_ttl=1.0) as queue:

        @queue.job(retries=3)
        async def produce(n: int) -> str:
            return "x" * n

        async with serving(queue):
            big, small = await produce.delay(2 * MB), await produce.delay(10)
            failed = await failure(big)
            assert await small.result(timeout=10) == "x" * 10
        info = await big.info()
    assert (failed.status, failed.error_type) == ("dead", "EncodeError")
    assert failed.message == (
        "the result of job produce: 2,097,154 bytes encoded, over the queue's limit of "
        "1,048,576 (max_bytes)"
    )
    assert info.tries == 1  # not retried: it would be as big again


async def test_an_outcome_redis_refuses_ends_that_job_dead_and_not_its_batch(
    small_redis: Redis,
) -> None:
    # A limit above the server's: Redis itself refuses the finish script's argument.
    async with open_job_queue(small_redis, "work", lease_ttl=1.0, max_bytes=4 * MB) as queue:
        started = 0
        everyone = trio.Event()
        go = trio.Event()

        @queue.job(retries=3)
        async def produce(n: int) -> str:
            nonlocal started
            started += 1
            if started == 5:
                everyone.set()
            await go.wait()  # all end at once: their outcomes go in one batch
            return "x" * n

        async with serving(queue):
            handles = [await produce.delay(n) for n in (10, 2 * MB, 20, 30, 40)]
            await everyone.wait()
            go.set()
            failed = await failure(handles[1])
            results = [await handles[i].result(timeout=10) for i in (0, 2, 3, 4)]
            # The worker goes on.
            assert await (await produce.delay(5)).result(timeout=10) == "xxxxx"
    assert (failed.status, failed.error_type) == ("dead", "OutcomeRefused")
    assert failed.message.startswith(
        "Redis refused to record the outcome of its try (ok): streamkit.BackendError: "
    )
    assert "invalid bulk length" in failed.message
    assert results == ["x" * n for n in (10, 20, 30, 40)]


@pytest.mark.timeout(60)
async def test_a_worker_whose_result_redis_refuses_keeps_running(
    small_server: RedisServer,
    small_redis: Redis,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    # The limit set above the server's, so that Redis refuses: the worker used to exit 1.
    worker = start_job_worker(
        small_server.url, tmp_path, app=HOSTILE, env={"STREAMKIT_JOB_MAX_BYTES": str(4 * MB)}
    )
    workers.append(worker)
    await wait_serving(worker)
    async with open_job_queue(small_redis, "hostile") as queue:

        @queue.job(name="big")
        async def big(n: int) -> str:
            raise AssertionError("runs on the worker only")

        @queue.job(name="echo")
        async def echo(value: Any) -> Any:
            raise AssertionError("runs on the worker only")

        refused = await big.delay(2 * MB)
        failed = await failure(refused)
        assert await (await echo.delay("still here")).result(timeout=15) == "still here"
        assert await (await big.delay(3)).result(timeout=15) == "xxx"
    assert (failed.status, failed.error_type) == ("dead", "OutcomeRefused")
    assert worker.process.poll() is None, worker.log()
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log()
    assert_clean(worker)
    assert "Redis refused to record its outcome" in worker.log()


# ---------------------------------------------------------------------- bounded work


async def _step(n: int) -> int:
    return n


@pytest.fixture
async def queue(redis: Redis) -> AsyncIterator[JobQueue]:
    """Queue ``work`` with the job ``step(n)``, returning ``n``."""
    async with open_job_queue(redis, "work") as queue:
        queue.job(_step, name="step")
        yield queue


async def command_calls(redis: Redis, command: str) -> int:
    stats = await redis.info("commandstats")
    found = stats.get(f"cmdstat_{command}") or {}
    assert isinstance(found, dict)
    return int(found.get("calls", 0))


async def statuses(handles: list[JobHandle[Any]]) -> Counter[str]:
    return Counter([str(await h.status()) for h in handles])


async def test_dependents_are_settled_a_bounded_number_per_script_call(
    redis: Redis, queue: JobQueue
) -> None:
    step = queue.jobs["step"]
    first = await step.delay(0)
    dependents = await step.enqueue_many(
        [JobCall(args=(n,), after=[first]) for n in range(1, 1001)]
    )
    keys = queue.shard_keys[0]
    # Aborting the job it waits for kills every dependent; one call settles
    # SETTLE_BUDGET of them and says how many jobs have dependents left.
    outcome, unsettled = await call_once(
        _ABORT, redis, keys.keys, (keys.base, first.id, "test"), what="aborting"
    )
    assert (outcome, unsettled) == (b"aborted", 1)
    assert (await statuses(dependents))["dead"] == SETTLE_BUDGET
    left = await call_once(_SETTLE, redis, keys.keys, (keys.base, 200), what="settling")
    assert left == 1
    assert (await statuses(dependents))["dead"] == SETTLE_BUDGET + 200
    # Every claim settles some too (should the worker that ended the job die).
    await ensure_groups(queue, 0)
    claim = (keys.base, "w1", 1, 60_000, "0", 3, "{}")
    reply = await call_once(_CLAIM, redis, keys.keys, claim, what="claiming")
    assert reply[3] == 1
    assert (await statuses(dependents))["dead"] == 2 * SETTLE_BUDGET + 200
    await settle_all(queue, 0)
    assert await statuses(dependents) == {"dead": 1000}
    info = await dependents[0].info()
    counts = await queue.counts()
    assert info.error is not None
    assert (info.error.type, info.error.message) == (
        "DependencyFailed",
        f"job {first.id} it depends on ended aborted: Aborted: test",
    )
    assert (counts.dead, counts.aborted, counts.waiting) == (1000, 1, 0)
    assert await redis.exists([f"{keys.base}:settle", f"{keys.base}:deps:{first.id}"]) == 0


async def test_abort_settles_every_dependent_before_it_returns(queue: JobQueue) -> None:
    step = queue.jobs["step"]
    first = await step.delay(0)
    dependents = await step.enqueue_many([JobCall(args=(n,), after=[first]) for n in range(1, 701)])
    assert await first.abort() is JobStatus.ABORTED
    assert await statuses(dependents) == {"dead": 700}


async def test_a_job_with_thousands_of_dependents_releases_them_all(queue: JobQueue) -> None:
    step = queue.jobs["step"]
    first = await step.delay(0)
    dependents = await step.enqueue_many(
        [JobCall(args=(n,), after=[first]) for n in range(1, 2501)]
    )
    assert (await queue.counts()).waiting == 2500
    async with serving(queue, concurrency=64):
        results = [await h.result(timeout=30) for h in dependents]
    counts = await queue.counts()
    assert results == list(range(1, 2501))
    assert (counts.succeeded, counts.waiting, counts.pending) == (2501, 0, 0)


async def test_dependents_of_a_replayed_job_are_not_those_of_its_first_run(
    redis: Redis, queue: JobQueue
) -> None:
    step = queue.jobs["step"]
    keys = queue.shard_keys[0]
    first = await step.delay(0)
    early = await step.enqueue_many([JobCall(args=(n,), after=[first]) for n in range(300)])
    await ensure_groups(queue, 0)

    async def claim_and_finish(outcome: str, data: bytes) -> int:
        claim = (keys.base, "w1", 1, 60_000, "0", 3, "{}")
        reply = await call_once(_CLAIM, redis, keys.keys, claim, what="claiming")
        [job] = reply[0]
        finish = (keys.base, 60_000, first.id, job[4], outcome, data, 1)
        _, unsettled = await call_once(_FINISH, redis, keys.keys, finish, what="finishing")
        return int(unsettled)

    # Its first run dies: one call kills SETTLE_BUDGET of its dependents ...
    assert await claim_and_finish("dead", b'{"type": "X", "message": "no"}') == 1
    # ... and before the rest are settled, it is replayed and gets a new dependent.
    assert await queue.replay([first.id]) == [first.id]
    late = await step.enqueue(7, after=[first])
    await settle_all(queue, 0)
    assert await statuses(early) == {"dead": 300}
    assert await late.status() is JobStatus.WAITING  # not its first run's dependent
    # Its second run succeeds: only the new dependent is released.
    assert await claim_and_finish("ok", b"0") == 0
    assert await late.status() is JobStatus.SENT
    assert await statuses(early) == {"dead": 300}


async def test_a_job_depends_on_at_most_a_thousand_jobs(redis: Redis, queue: JobQueue) -> None:
    step = queue.jobs["step"]
    with pytest.raises(ConfigError, match="at most 1000 jobs, got 1001"):
        await step.enqueue(1, after=[f"j{n}" for n in range(1001)])
    assert await redis.dbsize() == 0


async def test_counts_and_hand_backs_read_many_pending_entries_in_bounded_steps(
    redis: Redis, queue: JobQueue
) -> None:
    step = queue.jobs["step"]
    await step.enqueue_many([(n,) for n in range(1200)])
    keys = queue.shard_keys[0]
    await ensure_groups(queue, 0)
    # A worker that claimed them all (and runs them): pending, not queued.
    claim = (keys.base, "w1", 1200, 60_000, "0", 3, "{}")
    reply = await call_once(_CLAIM, redis, keys.keys, claim, what="claiming")
    assert len(reply[0]) == 1200
    before = await command_calls(redis, "evalsha")
    running = await queue.counts()
    count_calls = await command_calls(redis, "evalsha") - before
    # Handed back (as after a lost reply): pending still, but queued.
    assert await hand_back(queue, "w1", 0, []) == 1200
    handed_back = await queue.counts()
    assert (running.running, running.queued["normal"]) == (1200, 0)
    assert count_calls == 5  # 250 + 250 + 250 + 250 + 200 pending entries
    assert (handed_back.running, handed_back.queued["normal"]) == (0, 1200)


async def test_dead_letters_are_read_in_pages(redis: Redis, queue: JobQueue) -> None:
    step = queue.jobs["step"]
    # Dead at once: the job each depends on is unknown.
    await step.enqueue_many([JobCall(args=(n,), after=["nobody"]) for n in range(2500)])
    before = await command_calls(redis, "xrange")
    dead = await queue.dead_letters()
    reads = await command_calls(redis, "xrange") - before
    some = await queue.dead_letters(limit=1500)
    purged = await queue.purge()
    assert len(dead) == 2500
    assert [info.id for info in some] == [info.id for info in dead[:1500]]
    assert reads == 3  # 1000 + 1000 + 500
    assert len(purged) == 2500
