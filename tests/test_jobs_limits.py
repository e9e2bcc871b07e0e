"""The job queue's size limits, against real servers, one of them with Redis' smallest
``proto-max-bulk-len`` (1 MB): arguments too big are refused at enqueue, a result too
big ends its job dead, an outcome Redis refuses ends that job dead without holding back
the others of its batch, and batches are cut by bytes as well as count."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import ConfigError, EncodeError, Settings, open_redis
from streamkit.jobs import JobFailed, JobStatus, open_job_queue
from streamkit.testing import RedisServer
from tests.jobs_serving import serving
from tests.test_jobs_crash import assert_clean, start_job_worker, wait_serving

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from streamkit import Redis
    from streamkit.jobs import JobHandle
    from tests.workers import WorkerProcess

HOSTILE = "tests.apps.jobs_hostile:app"
MB = 1024 * 1024


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


async def failure(handle: JobHandle, within: float = 15) -> JobFailed:
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
    # 300 KB each: one job per call (two would be over 512 KiB); small ones 500 a call.
    assert (calls, small_calls) == (6, 3)
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
