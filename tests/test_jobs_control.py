"""Control over jobs, in-process against a real Redis: rate limits and concurrency limits
(per job name and per key, across several workers), pause and resume, the job context,
middleware, a worker's lifespan, ``Retry(delay=...)``, headers, and a job's own grace at
a graceful stop. (Limits under worker processes killed with -9: test_jobs_crash.py.)"""

from __future__ import annotations

import functools
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, Backoff, ConfigError, run_worker
from streamkit.jobs import (
    JobContext,
    JobFailed,
    JobOptions,
    JobQueue,
    JobStatus,
    RateLimit,
    Retry,
    current_job,
    open_job_queue,
)
from streamkit.testing import wait_until
from tests.jobs_serving import assert_drained, serving, start_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from streamkit import Redis
    from streamkit.jobs import JobHandle

FAST = Backoff(initial=0.01, jitter=0)


@pytest.fixture
async def queue(redis: Redis) -> AsyncIterator[JobQueue]:
    async with open_job_queue(redis, "ctl", lease_ttl=1.0) as queue:
        yield queue


async def started_ms(handles: list[JobHandle[Any]]) -> list[int]:
    """When each try of each job started, on the Redis server's clock (ms), sorted."""
    times: list[int] = []
    for handle in handles:
        for attempt in (await handle.info()).history:
            assert attempt.started_at is not None
            times.append(round(attempt.started_at.timestamp() * 1000))
    return sorted(times)


def assert_rate(times: list[int], count: int, per_ms: int) -> None:
    """No more than ``count`` starts in any window of ``per_ms`` (the ``count + 1``-th
    start after any start is at least ``per_ms`` later)."""
    gaps = [times[i + count] - times[i] for i in range(len(times) - count)]
    assert min(gaps) >= per_ms, (gaps, times)


class Running:
    """Counts the jobs running now, per key, and the most that ever ran at once."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()

    async def hold(self, key: str, seconds: float) -> None:
        for k in (key, "*"):
            self.now[k] += 1
            self.most[k] = max(self.most[k], self.now[k])
        try:
            await trio.sleep(seconds)
        finally:
            for k in (key, "*"):
                self.now[k] -= 1


# ---------------------------------------------------------------------- rate limits


async def test_a_rate_limit_holds_jobs_back_and_never_starts_more_in_any_window(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(rate_limit="4/0.3s", retries=0)
    async def call_api(n: int) -> int:
        return n

    handles = await call_api.enqueue_many([(n,) for n in range(14)])
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            await start_worker(nursery, queue, concurrency=8)
        results = [await handle.result(timeout=10) for handle in handles]
        held = [info.held_by for info in [await h.info() for h in handles]]
        nursery.cancel_scope.cancel()
    assert results == list(range(14))
    assert held == [None] * 14  # let out: no longer held
    assert_rate(await started_ms(handles), 4, 300)
    await assert_drained(redis, queue)


async def test_a_job_over_its_rate_limit_waits_as_held_and_says_why(queue: JobQueue) -> None:
    @queue.job(rate_limit=RateLimit(1, per=60))
    async def once_a_minute(n: int) -> int:
        return n

    first, second = await once_a_minute.enqueue_many([(1,), (2,)])
    async with serving(queue):
        assert await first.result(timeout=5) == 1
        await wait_status(second, JobStatus.HELD)
        info = await second.info()
        counts = await queue.counts()
    assert info.held_by == "rate limit 1 per 60000 ms of once_a_minute"
    assert (counts.held, counts.pending, counts.queued["normal"]) == (1, 1, 0)
    assert await second.abort("no longer needed") is JobStatus.ABORTED


async def test_rate_limits_per_key_are_separate(queue: JobQueue) -> None:
    @queue.job(limit_key="token", key_rate_limit="1/60s")
    async def fetch(token: str, page: int) -> str:
        return f"{token}:{page}"

    handles = await fetch.enqueue_many([("a", 1), ("b", 1), ("a", 2), ("c", 1)])
    async with serving(queue):
        ran = [await handles[i].result(timeout=5) for i in (0, 1, 3)]
        await wait_status(handles[2], JobStatus.HELD)
        info = await handles[2].info()
    assert ran == ["a:1", "b:1", "c:1"]
    assert (info.limit_key, info.held_by) == ("a", "rate limit 1 per 60000 ms of fetch:a")


# ---------------------------------------------------------------------- concurrency


async def test_concurrency_limits_hold_across_workers_per_name_and_per_key(
    redis: Redis, queue: JobQueue
) -> None:
    running = Running()

    @queue.job(concurrency=3, limit_key="account", key_concurrency=1)
    async def sync_account(account: str, n: int) -> int:
        await running.hold(account, 0.03)
        return n

    calls = [(f"acct-{n % 4}", n) for n in range(24)]
    handles = await sync_account.enqueue_many(calls)
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            await start_worker(nursery, queue, concurrency=4)
        assert [await h.result(timeout=15) for h in handles] == list(range(24))
        nursery.cancel_scope.cancel()
    assert running.most["*"] == 3
    assert max(running.most[f"acct-{a}"] for a in range(4)) == 1
    await assert_drained(redis, queue)
    slots = [key async for key in redis.scan_iter(match="__jobs:{ctl.0}:cc:*")]
    assert slots == []  # every slot given back


@pytest.mark.parametrize("ending", ["fails", "aborted", "retried"])
async def test_a_concurrency_slot_is_given_back_however_a_try_ends(
    queue: JobQueue, ending: str
) -> None:
    release = trio.Event()
    tries: Counter[str] = Counter()

    @queue.job(concurrency=1, retries=1 if ending == "retried" else 0, backoff=FAST)
    async def exclusive(tag: str) -> str:
        tries[tag] += 1
        if tag == "first":
            if ending == "aborted":
                await trio.sleep_forever()
            await release.wait()
            if ending != "retried" or tries[tag] == 1:
                raise RuntimeError("boom")
        return tag

    first, second = await exclusive.enqueue_many([("first",), ("second",)])
    async with serving(queue, concurrency=4):
        await wait_status(first, JobStatus.EXECUTING)
        await wait_status(second, JobStatus.HELD)
        if ending == "aborted":
            await first.abort("stop")
        release.set()
        assert await second.result(timeout=5) == "second"
        if ending == "retried":
            assert await first.result(timeout=5) == "first"
        else:
            with pytest.raises(JobFailed):
                await first.result(timeout=5)


# ---------------------------------------------------------------------- pause and resume


async def test_pausing_a_job_name_holds_its_jobs_while_running_ones_finish(
    redis: Redis, queue: JobQueue
) -> None:
    running = trio.Event()
    finish = trio.Event()

    @queue.job
    async def report(n: int) -> int:
        if n == 0:
            running.set()
            await finish.wait()
        return n

    @queue.job
    async def other(n: int) -> int:
        return n

    first = await report.delay(0)
    async with serving(queue):
        await running.wait()
        await queue.pause(report)
        assert await queue.paused() == ["report"]
        later = await report.enqueue_many([(n,) for n in range(1, 5)])
        unpaused = await other.delay(7)
        assert await unpaused.result(timeout=5) == 7  # other jobs run on
        for handle in later:
            await wait_status(handle, JobStatus.HELD)
        finish.set()
        assert await first.result(timeout=5) == 0  # the running try ends normally
        assert (await later[0].info()).held_by == "paused"
        assert await queue.resume(report) == 4
        assert [await h.result(timeout=5) for h in later] == [1, 2, 3, 4]
        assert await queue.paused() == []
    await assert_drained(redis, queue)


async def test_pausing_the_queue_starts_nothing_until_resumed(queue: JobQueue) -> None:
    @queue.job
    async def work(n: int) -> int:
        return n

    await queue.pause()
    handles = await work.enqueue_many([(n,) for n in range(5)])
    async with serving(queue):
        with trio.move_on_after(0.8):
            await handles[0].result()
        assert [await h.status() for h in handles] == [JobStatus.SENT] * 5
        assert await queue.paused() == ["*"]
        await queue.resume()
        assert [await h.result(timeout=5) for h in handles] == list(range(5))


# ---------------------------------------------------------------------- context and hooks


async def test_a_job_sees_its_context_and_middleware_wraps_each_try(queue: JobQueue) -> None:
    seen: list[JobContext] = []
    around: list[str] = []

    async def outer(context: JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        around.append(f"outer {context.try_number}")
        return await call_next()

    async def inner(context: JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        around.append(f"inner {context.name}")
        result = await call_next()
        return f"<{result}>"

    queue.add_middleware(outer)
    queue.add_middleware(inner)

    @queue.set_lifespan
    async def lifespan() -> AsyncIterator[dict[str, str]]:
        around.append("start-up")
        yield {"pool": "db"}
        around.append("shut-down")

    @queue.job(retries=1, backoff=FAST)
    async def greet(name: str) -> str:
        seen.append(current_job())
        if len(seen) == 1:
            raise Retry(delay=0.05)
        return f"hello {name}"

    handle = await greet.enqueue("ada", headers={"tenant": "acme"})
    async with serving(queue):
        assert await handle.result(timeout=5) == "<hello ada>"
    first, second = seen
    assert (second.id, second.name, second.queue) == (handle.id, "greet", "ctl")
    assert (first.try_number, second.try_number, second.max_tries) == (1, 2, 2)
    assert second.headers == {"tenant": "acme"}
    assert second.state == {"pool": "db"}
    assert isinstance(second.enqueued_at, datetime)
    assert around == [
        "start-up",
        "outer 1",
        "inner greet",
        "outer 2",
        "inner greet",
        "shut-down",
    ]
    info = await handle.info()
    assert info.history[0].outcome == "retry"
    assert info.history[0].error_type == "Retry"
    assert info.headers == {"tenant": "acme"}
    gap = info.history[1].started_at - info.history[0].ended_at  # type: ignore[operator]
    assert gap.total_seconds() >= 0.05


async def test_retry_with_no_try_left_ends_the_job_dead(queue: JobQueue) -> None:
    @queue.job(retries=0)
    async def impatient() -> None:
        raise Retry(delay=1, message="not yet")

    handle = await impatient.delay()
    async with serving(queue):
        with pytest.raises(JobFailed) as caught:
            await handle.result(timeout=5)
    assert (caught.value.error_type, caught.value.message) == ("Retry", "not yet")


def test_current_job_outside_a_job_raises() -> None:
    with pytest.raises(RuntimeError, match="inside a running job"):
        current_job()


def test_limit_options_are_checked_when_declared() -> None:
    with pytest.raises(ConfigError, match="need a limit_key"):
        JobOptions(key_concurrency=1)
    with pytest.raises(ConfigError, match="rate limit"):
        JobOptions(rate_limit="lots")
    assert JobOptions(rate_limit="3/5m").rate_limit == RateLimit(3, 300.0)
    assert str(RateLimit(10, 1)) == "10/1s"


# ---------------------------------------------------------------------- grace at a stop


async def test_a_job_with_its_own_grace_finishes_during_a_graceful_stop(
    queue: JobQueue,
) -> None:
    started: Counter[str] = Counter()

    @queue.job(grace=5.0)
    async def migrate() -> str:
        started["migrate"] += 1
        await trio.sleep(0.5)
        return "migrated"

    @queue.job
    async def quick_tempered() -> str:
        started["quick"] += 1
        await trio.sleep(5)
        return "slow"

    long_one, short_one = await migrate.delay(), await quick_tempered.delay()
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(functools.partial(queue.serve, concurrency=2))
        await wait_status(long_one, JobStatus.EXECUTING)
        await wait_status(short_one, JobStatus.EXECUTING)
        assert not await worker.drain(grace=0.1)
        nursery.cancel_scope.cancel()
    assert await long_one.status() is JobStatus.SUCCESS
    info = await short_one.info()
    assert (info.status, info.tries, info.history[-1].outcome) == (JobStatus.SENT, 0, "released")


async def wait_status(handle: JobHandle[Any], status: JobStatus, within: float = 5.0) -> None:
    async def reached() -> bool:
        return await handle.status() is status

    await wait_until(reached, what=f"job {handle.id} {status}", within=within)


# ---------------------------------------------------------------------- named queues


def router_app(redis_url: str, seen: list[Any]) -> App:
    """An app with a job on its default queue and one routed to its queue ``gpu``."""
    app = App("router", redis_url=redis_url)

    @app.job
    async def light(n: int) -> int:
        return n

    @app.job(queue="gpu")
    async def render(n: int) -> str:
        seen.append(current_job().state)
        return f"frame {n}"

    @app.lifespan
    async def pool() -> AsyncIterator[str]:
        yield "a pool"

    return app


async def test_jobs_routed_to_a_named_queue_wait_for_a_worker_that_serves_it(
    redis_url: str,
) -> None:
    seen: list[Any] = []
    app = router_app(redis_url, seen)
    light, render = app.jobs["light"], app.jobs["render"]
    assert app.queue_names() == ["default", "gpu"]
    async with app, trio.open_nursery() as nursery:
        general = await nursery.start(
            functools.partial(
                run_worker, router_app(redis_url, seen), queues=["default"], blocked_warning=None
            )
        )
        frame = await render.delay(1)
        assert frame.queue.name == "router.gpu"
        with app.blocking() as client:
            by_client = client.delay(render, 2)
            assert await (await light.delay(3)).result(timeout=5) == 3
            assert await frame.status() is JobStatus.SENT  # not dead: nobody serves gpu
            assert set(general.job_workers) == {"default"}
            special = await nursery.start(
                functools.partial(
                    run_worker, router_app(redis_url, seen), queues=["gpu"], blocked_warning=None
                )
            )
            assert await frame.result(timeout=5) == "frame 1"
            assert await trio.to_thread.run_sync(by_client.result, 5) == "frame 2"
        await general.stop()
        await special.stop()
    assert seen == ["a pool", "a pool"]
    with pytest.raises(ConfigError, match="unknown job queue 'cpu'"):
        await run_worker(app, queues=["cpu"])


# ---------------------------------------------------------------------- trace context


async def test_the_enqueuers_trace_context_follows_the_job(redis_url: str) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    app = App("traced", redis_url=redis_url)
    seen: list[tuple[int, dict[str, str]]] = []

    @app.job
    async def traced() -> None:
        context = trace.get_current_span().get_span_context()
        seen.append((context.trace_id, dict(current_job().headers)))

    parent = SpanContext(
        trace_id=0x5CE0E9A56015FEC5AADFA328AE398115,
        span_id=0xAB54A98CEB1F0AD2,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    async with app, serving(app.job_queue):
        with trace.use_span(NonRecordingSpan(parent)):
            traced_handle = await traced.enqueue(headers={"tenant": "acme"})

            def from_a_thread() -> Any:
                with app.blocking() as client:
                    return client.delay(traced)

            # (a thread started here sees the same context: the blocking client too)
            by_client = await trio.to_thread.run_sync(from_a_thread)
        untraced = await traced.delay()
        for handle in (traced_handle, untraced):
            await handle.result(timeout=5)
        await app.job_queue.handle(by_client.id).result(timeout=5)
        recorded = (await traced_handle.info()).headers
    expected = "00-5ce0e9a56015fec5aadfa328ae398115-ab54a98ceb1f0ad2-01"
    assert sorted(seen, key=lambda s: (s[0], sorted(s[1].items()))) == [
        (0, {}),  # no current span: no trace context, and no parent in the job
        (parent.trace_id, {"traceparent": expected, "tenant": "acme"}),
        (parent.trace_id, {"traceparent": expected}),  # the blocking client's
    ]
    assert recorded == {"traceparent": expected, "tenant": "acme"}
