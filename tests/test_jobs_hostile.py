"""Hostile input to the job queue: whatever a producer enqueues (a field missing after
a rolling deploy, wrong types, not an object, deep nesting) and whatever a job returns
or raises, the job's failure is the job's: it is retried or ends dead, and the worker,
with its other jobs and its processors, keeps running."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from streamkit import App, Backoff, Record
from streamkit._lua import script
from streamkit._redis import LuaScript, call_once
from streamkit.jobs import JobFailed, JobQueue, JobStatus, open_job_queue
from streamkit.testing import wait_until
from tests.apps.jobs_hostile import SEEN, Note
from tests.jobs_serving import serving
from tests.test_jobs_crash import assert_clean, start_job_worker, wait_serving

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from streamkit import Redis
    from streamkit.jobs import Job, JobHandle
    from tests.workers import WorkerProcess

HOSTILE = "tests.apps.jobs_hostile:app"
_ENQUEUE = LuaScript(script("jobs/enqueue"))


async def failure(handle: JobHandle[Any], within: float = 15) -> JobFailed:
    with pytest.raises(JobFailed) as failed:
        await handle.result(timeout=within)
    return failed.value


# ---------------------------------------------------------------------- a real worker


@pytest.mark.timeout(60)
async def test_a_record_argument_missing_a_field_ends_dead_and_the_worker_keeps_running(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = start_job_worker(redis_url, tmp_path, app=HOSTILE)
    workers.append(worker)
    await wait_serving(worker)
    async with open_job_queue(redis, "hostile") as queue:
        # A producer on an older Order, without its sku (a rolling deploy), and one
        # that declares no type (enqueues check arguments against annotations).
        @queue.job(name="ship")
        async def old_ship(o: Any) -> str:
            raise AssertionError("runs on the worker only")

        @queue.job(name="echo")
        async def echo(value: Any) -> Any:
            raise AssertionError("runs on the worker only")

        missing = await old_ship.delay({"order_id": 1})
        failed = await failure(missing)
        info = await missing.info()
        # The others: wrong types, not an object at all.
        mistyped = await old_ship.delay({"order_id": "one", "sku": 2})
        scalar = await old_ship.enqueue(o=5)
        wrong, flat = await failure(mistyped), await failure(scalar)
        # The worker still runs jobs, and its processor still processes events.
        good = await old_ship.delay({"order_id": 2, "sku": "tea"})
        assert await good.result(timeout=15) == "shipped 2 (tea)"
        assert await (await echo.delay([1, "two"])).result(timeout=15) == [1, "two"]

    assert (failed.status, failed.error_type) == ("dead", "BadInput")
    assert failed.message == (
        "bad arguments: job ship: argument 'o' (Order): required field missing @ o.sku"
    )
    assert (info.status, info.tries) == (JobStatus.DEAD, 1)  # not retried: bad input
    assert (wrong.error_type, flat.error_type) == ("BadInput", "BadInput")
    assert wrong.message == (
        "bad arguments: job ship: argument 'o' (Order): invalid value for type, expected "
        "int @ o.order_id; invalid value for type, expected str @ o.sku"
    )
    assert flat.message == (
        "bad arguments: job ship: argument 'o' (Order): expected an object, got int"
    )
    producer = App("hostile", redis_url=redis_url)
    notes = producer.stream("notes", record=Note, partition_by="key", partition_count=2)
    async with producer:
        await notes.send_many([Note(key=f"k{n % 2}", n=n) for n in range(6)])

    async def all_seen() -> bool:
        return await redis.llen(SEEN) == 6

    await wait_until(all_seen, what="6 events processed", within=20)
    assert worker.process.poll() is None, worker.log()
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log()
    assert_clean(worker)
    assert "bad arguments: job ship: argument 'o' (Order)" in worker.log()


# ---------------------------------------------------------------------- in-process


class Order(Record):
    order_id: int
    sku: str


class Tree(Record):
    children: list[Tree]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Cyclic(Record):
    items: list[Any]


class Point(Record):
    x: float


@pytest.fixture
async def queue(redis: Redis) -> AsyncIterator[JobQueue]:
    async with open_job_queue(redis, "rough", lease_ttl=1.0) as queue:
        yield queue


async def enqueue_raw(queue: JobQueue, name: str, job_id: str, args: bytes) -> JobHandle[Any]:
    """Enqueue job ``name`` with ``args`` as they are (a producer that is not
    streamkit, or a hostile one): what the enqueue script records, unchecked."""
    handle = queue.handle(job_id)
    keys = queue.shard_keys[handle.shard]
    # base, name, priority, delay, max tries, result ttl, dedupe window, expires,
    # limits; then per job id, args, options
    argv = (keys.base, name, 1, 0, 4, 3600, 3600, 0, "", job_id, args, b"")
    await call_once(_ENQUEUE, queue.redis, keys.keys, argv, what="enqueueing raw")
    return handle


async def test_arguments_of_any_shape_end_the_job_dead_as_bad_input(queue: JobQueue) -> None:
    @queue.job
    async def take(o: Order, n: int = 0) -> int:
        return o.order_id + n

    @queue.job
    async def grow(tree: Tree) -> int:
        return len(tree.children)

    @queue.job
    async def anything(value: Any) -> Any:
        return value

    cases: dict[str, tuple[Job[Any, Any], bytes, str]] = {
        "not JSON": (take, b"{not json", "job take: not JSON (unexpected character"),
        "not a pair": (take, b'{"o": 1}', "job take: not a JSON [args, kwargs] pair"),
        "args not a list": (take, b'[{"o": 1}, {}]', "job take: not a JSON [args, kwargs]"),
        "kwargs not an object": (take, b"[[], []]", "job take: not a JSON [args, kwargs]"),
        "a number": (take, b"7", "job take: not a JSON [args, kwargs] pair"),
        "nothing": (take, b"", "job take: not JSON"),
        "twice": (
            take,
            b'[[{"order_id": 1, "sku": "a"}], {"o": {}}]',
            "job take: multiple values for argument 'o'",
        ),
        "a list for a record": (
            take,
            b"[[[1, 2]], {}]",
            "job take: argument 'o' (Order): expected an object, got list",
        ),
        "null for a record": (
            take,
            b"[[null], {}]",
            "job take: argument 'o' (Order): expected an object, got NoneType",
        ),
        "nested too deeply to decode": (
            anything,
            b"[[" + b"[" * 2000 + b"]" * 2000 + b"], {}]",
            "job anything: not JSON (depth limit exceeded",
        ),
        # orjson encodes no more than 254 levels: a hostile producer writes them by hand.
        "nested too deeply to structure": (
            grow,
            b"[[" + b'{"children": [' * 400 + b"]}" * 400 + b"], {}]",
            "job grow: argument 'tree' (Tree): ",
        ),
    }
    handles = {
        case: await enqueue_raw(queue, job.name, f"raw-{i}", raw)
        for i, (case, (job, raw, _)) in enumerate(cases.items())
    }
    async with serving(queue):
        failures = {case: await failure(handle) for case, handle in handles.items()}
        # The worker that met them all still runs jobs.
        handle = await take.delay(Order(order_id=1, sku="a"), n=2)
        assert await handle.result(timeout=5) == 3
    for case, (_, _, message) in cases.items():
        failed = failures[case]
        assert (failed.status, failed.error_type) == ("dead", "BadInput"), case
        assert failed.message.startswith(f"bad arguments: {message}"), (case, failed.message)
        assert len(failed.message) < 2100, case
    for handle in handles.values():
        assert (await handle.info()).tries == 1  # bad input is never retried


async def test_results_that_do_not_encode_end_the_job_dead_and_the_worker_goes_on(
    queue: JobQueue,
) -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)

    results: dict[str, Any] = {
        "an object": object(),
        "a set inside": {"a": {1, 2}, "b": object()},
        "a huge integer": 2**70,
        "non-string keys": {(1, 2): "pair"},
        "a cycle": cyclic,
        "a record holding a cycle": Cyclic(items=cyclic),
        "a lone surrogate": "\ud800",
        "a record holding NaN": Point(x=float("nan")),
    }

    @queue.job(retries=3)
    async def produce(case: str) -> Any:
        return results.get(case, case)

    async with serving(queue):
        handles = {case: await produce.delay(case) for case in results}
        failures = {case: await failure(handle) for case, handle in handles.items()}
        assert await (await produce.delay("fine")).result(timeout=5) == "fine"
    for case, failed in failures.items():
        assert (failed.status, failed.error_type) == ("dead", "EncodeError"), case
        assert failed.message.startswith("the result of job produce: "), (case, failed.message)
    for handle in handles.values():
        assert (await handle.info()).tries == 1


async def test_an_exception_that_cannot_be_shown_or_is_huge_is_the_jobs_failure(
    queue: JobQueue,
) -> None:
    @queue.job(retries=1, backoff=Backoff(initial=0.01, jitter=0))
    async def unprintable() -> None:
        raise Unprintable

    @queue.job(retries=0)
    async def verbose() -> None:
        raise ValueError("x" * 5_000_000)

    @queue.job
    async def fine() -> str:
        return "fine"

    async with serving(queue):
        quiet, loud = await unprintable.delay(), await verbose.delay()
        first, second = await failure(quiet), await failure(loud)
        assert await (await fine.delay()).result(timeout=5) == "fine"
    assert (first.status, first.error_type) == ("dead", f"{__name__}.Unprintable")
    assert first.message == f"<{__name__}.Unprintable whose str() failed>"
    assert (await quiet.info()).tries == 2  # an ordinary failure: retried
    assert (second.status, second.error_type) == ("dead", "ValueError")
    assert second.message.startswith("xxxx")
    assert second.message.endswith("characters cut)")
    assert len(second.message) <= 8_000
    assert len(second.traceback) <= 32_000


async def test_ids_names_and_abort_reasons_that_are_not_utf8_stop_no_worker(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job
    async def take(n: int) -> int:
        return n

    started = trio.Event()

    @queue.job
    async def linger() -> None:
        started.set()
        await trio.sleep_forever()

    keys = queue.shard_keys[0]
    bad_id, bad_name = b"\xff\xfe-id", b"t\xffke"
    bad_key = keys.base.encode() + b":job:" + bad_id
    for job_id, name in [(bad_id, b"take"), (b"bad-name", bad_name)]:
        argv = (keys.base, name, 1, 0, 4, 3600, 3600, 0, "", job_id, b"[[1], {}]", b"")
        await call_once(_ENQUEUE, queue.redis, keys.keys, argv, what="enqueueing raw")
    async with serving(queue):

        async def both_dead() -> bool:
            statuses = [await redis.hget(key, "status") for key in (bad_key, keys.job("bad-name"))]
            return statuses == [b"dead", b"dead"]

        await wait_until(both_dead, what="both jobs dead", within=10)
        lingering = await linger.delay()
        await started.wait()
        # An abort reason written by something other than streamkit.
        await redis.hset(keys.job(lingering.id), {"abort": b"stop \xff now"})
        stopped = await failure(lingering)
        assert await (await take.delay(3)).result(timeout=5) == 3
    error = orjson.loads(await redis.hget(bad_key, "error") or b"null")
    assert (error["type"], error["message"]) == ("BadInput", "its id or name is not UTF-8")
    assert (stopped.status, stopped.error_type) == ("aborted", "Aborted")
    assert stopped.message == "stop \ufffd now"
