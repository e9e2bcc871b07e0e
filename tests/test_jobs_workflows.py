"""Workflows, in-process against a real Redis: chains, groups and chords passing results,
failure callbacks, failures and aborts ending the workflow with the reason, and
dependencies across shards and queues (on Redis Cluster too)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, Backoff, ConfigError
from streamkit.jobs import (
    JobCall,
    JobFailed,
    JobQueue,
    JobStatus,
    Step,
    chain,
    chord,
    group,
    open_job_queue,
)
from streamkit.testing import wait_until
from tests.jobs_serving import assert_drained, serving, wait_settled

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Redis

FAST = Backoff(initial=0.01, jitter=0)


class Broken(Exception):
    """A step's own failure."""


@pytest.fixture(params=[1, 4], ids=["one-shard", "four-shards"])
async def queue(redis: Redis, request: pytest.FixtureRequest) -> AsyncIterator[JobQueue]:
    async with open_job_queue(redis, "flow", lease_ttl=1.0, shards=request.param) as queue:
        yield queue


def declare(queue: JobQueue) -> dict[str, Any]:
    """The jobs of these tests. With several shards, ``pinned`` (a concurrency limit on
    its name) lives on its name's shard: the workflows through it cross shards."""
    failures: list[Any] = []

    @queue.job
    async def fetch(n: int) -> int:
        return n * 10

    @queue.job(concurrency=100)
    async def pinned(value: int, plus: int = 1) -> int:
        return value + plus

    @queue.job(retries=0)
    async def explode(value: Any) -> None:
        raise Broken(f"cannot take {value!r}")

    @queue.job
    async def total(values: list[int], label: str) -> str:
        return f"{label}: {sum(values)} from {values}"

    @queue.job
    async def report(failure: dict[str, Any], where: str) -> str:
        failures.append(failure)
        return f"reported to {where}"

    @queue.job
    async def wait_forever(value: Any) -> None:
        await trio.sleep_forever()

    return {
        "fetch": fetch,
        "pinned": pinned,
        "explode": explode,
        "total": total,
        "report": report,
        "wait_forever": wait_forever,
        "failures": failures,
    }


async def test_a_chain_passes_each_result_to_the_next_step(redis: Redis, queue: JobQueue) -> None:
    jobs = declare(queue)
    flow = chain(jobs["fetch"].step(4), jobs["pinned"].step(plus=2), jobs["pinned"].step())
    async with serving(queue):
        handle = await queue.enqueue_workflow(flow)
        assert await handle.result(timeout=10) == 43  # ((4 * 10) + 2) + 1
        assert [await h.status() for h in handle.jobs] == [JobStatus.SUCCESS] * 3
        assert (await handle.jobs[1].info()).args == (40,)  # fed, then run
        await wait_settled(redis, queue)
    await assert_drained(redis, queue)


async def test_a_chord_gives_its_callback_every_result_in_order_and_a_group_gathers(
    redis: Redis, queue: JobQueue
) -> None:
    jobs = declare(queue)
    fan = chord([jobs["pinned"].step(n) for n in range(8)], jobs["total"].step("sum"))
    gathered = chain(
        jobs["fetch"].step(1), group(*(jobs["pinned"].step(plus=p) for p in (1, 2, 3)))
    )
    async with serving(queue, concurrency=16):
        chorded = await queue.enqueue_workflow(fan)
        grouped = await queue.enqueue_workflow(gathered)
        assert await chorded.result(timeout=10) == "sum: 36 from [1, 2, 3, 4, 5, 6, 7, 8]"
        assert await grouped.result(timeout=10) == [11, 12, 13]
        await wait_settled(redis, queue)
    counts = await queue.counts()
    assert counts.by_name["(group)"]["success"] == 1
    await assert_drained(redis, queue)


async def test_a_failed_step_ends_the_workflow_with_its_reason_and_calls_back(
    redis: Redis, queue: JobQueue
) -> None:
    jobs = declare(queue)
    flow = chain(
        jobs["fetch"].step(2), jobs["explode"].step(), jobs["pinned"].step(), jobs["pinned"].step()
    ).on_failure(jobs["report"].step("ops"))
    async with serving(queue):
        handle = await queue.enqueue_workflow(flow)
        with pytest.raises(JobFailed) as caught:
            await handle.result(timeout=10)
        callback = handle.jobs[-1]
        assert await callback.result(timeout=10) == "reported to ops"
        await wait_settled(redis, queue)
    failed = caught.value
    explode_id = handle.jobs[1].id
    assert failed.error_type == "DependencyFailed"
    assert failed.message.endswith(
        f"job {explode_id} ended dead: tests.test_jobs_workflows.Broken: cannot take 20"
    )
    [failure] = jobs["failures"]
    assert failure["id"] == handle.final.id
    assert failure["status"] == "dead"
    assert failure["error"]["type"] == "DependencyFailed"
    assert explode_id in failure["error"]["message"]
    await assert_drained(redis, queue)


async def test_a_failure_callback_of_a_workflow_that_succeeds_is_not_run(
    queue: JobQueue,
) -> None:
    jobs = declare(queue)
    flow = chain(jobs["fetch"].step(1), jobs["pinned"].step()).on_failure(jobs["report"].step("x"))
    async with serving(queue):
        handle = await queue.enqueue_workflow(flow)
        assert await handle.result(timeout=10) == 11
        with pytest.raises(JobFailed) as caught:
            await handle.jobs[-1].result(timeout=10)
    assert (caught.value.status, caught.value.error_type) == ("aborted", "NotNeeded")
    assert jobs["failures"] == []


async def test_a_chord_member_that_fails_ends_the_chord_without_a_hang(
    redis: Redis, queue: JobQueue
) -> None:
    jobs = declare(queue)
    members = [jobs["pinned"].step(n) for n in range(5)] + [jobs["explode"].step("x")]
    async with serving(queue, concurrency=8):
        handle = await queue.enqueue_workflow(chord(members, jobs["total"].step("sum")))
        with pytest.raises(JobFailed) as caught:
            await handle.result(timeout=10)
        for member in handle.jobs[:-1]:  # the others run on, their results unused
            with contextlib.suppress(JobFailed):
                await member.result(timeout=10)
        await wait_settled(redis, queue)
    assert caught.value.error_type == "DependencyFailed"
    assert "cannot take 'x'" in caught.value.message
    await assert_drained(redis, queue)


async def test_aborting_a_workflow_ends_it_with_the_reason(redis: Redis, queue: JobQueue) -> None:
    jobs = declare(queue)
    flow = chain(jobs["fetch"].step(1), jobs["wait_forever"].step(), jobs["pinned"].step())
    async with serving(queue):
        handle = await queue.enqueue_workflow(flow)
        stuck = handle.jobs[1]

        async def running() -> bool:
            return await stuck.status() is JobStatus.EXECUTING

        await wait_until(running, what="the middle step running", within=5)
        assert await handle.abort("deploy cancelled") is JobStatus.ABORTED
        with pytest.raises(JobFailed) as caught:
            await handle.result(timeout=10)
        with pytest.raises(JobFailed):
            await stuck.result(timeout=10)  # its worker cancelled it
        await wait_settled(redis, queue)  # its end delivered to its dependent
    assert (caught.value.status, caught.value.message) == ("aborted", "deploy cancelled")
    assert await stuck.status() is JobStatus.ABORTED
    await assert_drained(redis, queue)


async def test_a_step_aborted_alone_ends_its_workflow_with_the_reason(queue: JobQueue) -> None:
    jobs = declare(queue)
    flow = chain(jobs["wait_forever"].step(1), jobs["pinned"].step(), jobs["pinned"].step())
    async with serving(queue):
        handle = await queue.enqueue_workflow(flow)
        await handle.jobs[0].abort("no longer needed")
        with pytest.raises(JobFailed) as caught:
            await handle.result(timeout=10)
    assert caught.value.error_type == "DependencyFailed"
    assert caught.value.message.endswith("ended aborted: Aborted: no longer needed")


@pytest.mark.cluster
async def test_after_across_shards_waits_for_every_dependency(redis: Redis, redis_url: str) -> None:
    async with open_job_queue(redis, "across", shards=4, lease_ttl=1.0) as queue:
        release = trio.Event()

        @queue.job(retries=0)
        async def part(n: int) -> int:
            await release.wait()
            if n < 0:
                raise Broken(f"part {n}")
            return n

        @queue.job
        async def join(tag: str) -> str:
            return tag

        # Dependencies on every shard (ids of their own, hashed), a dependent with an
        # id on yet another: each dependency on another shard is linked to it.
        parts = [await part.enqueue(n, job_id=f"part-{n}") for n in range(6)]
        assert len({p.shard for p in parts}) > 1
        joined = await join.enqueue("all", after=parts, job_id="joined")
        doomed = await join.enqueue("never", after=[parts[0], await part.delay(-1)])
        async with serving(queue, concurrency=8):
            assert await joined.status() is JobStatus.WAITING
            release.set()
            assert await joined.result(timeout=10) == "all"
            with pytest.raises(JobFailed) as caught:
                await doomed.result(timeout=10)
            # depending on jobs that ended already, across shards: at once
            late = await join.enqueue("late", after=parts[:3])
            assert await late.result(timeout=10) == "late"
            await wait_settled(redis, queue)
        await assert_drained(redis, queue)
    assert caught.value.error_type == "DependencyFailed"
    assert "Broken: part -1" in caught.value.message


@pytest.mark.parametrize("shards", [1, 4])
async def test_after_a_job_of_another_queue(redis_url: str, shards: int) -> None:
    # A dependent on the app's queue, its dependencies on its named queue "gpu": it
    # ended dead, "depends on ... is unknown" (looked up on its own queue).
    app = App(f"afterq{shards}", redis_url=redis_url, job_shards=shards)
    release = trio.Event()

    @app.job(queue="gpu", retries=0)
    async def render(n: int) -> str:
        await release.wait()
        if n < 0:
            raise Broken(f"frame {n}")
        return f"frame {n}"

    @app.job
    async def publish(tag: str) -> str:
        return tag

    async with app:
        gpu, main = app.job_queues["gpu"], app.job_queue
        async with serving(main), serving(gpu):
            frames = [await render.delay(n) for n in range(3)]
            assert {f.queue.name for f in frames} == {gpu.name}
            published = await publish.enqueue("done", after=frames)
            mixed = await publish.enqueue("mixed", after=[frames[0], await publish.delay("first")])
            doomed = await publish.enqueue("never", after=[frames[1], await render.delay(-1)])
            assert await published.status() is JobStatus.WAITING
            release.set()
            assert await published.result(timeout=10) == "done"
            assert await mixed.result(timeout=10) == "mixed"
            with pytest.raises(JobFailed) as caught:
                await doomed.result(timeout=10)
            assert caught.value.error_type == "DependencyFailed"
            assert "Broken: frame -1" in caught.value.message
            # after jobs of the other queue that ended already; and from a blocking client
            late = await publish.enqueue("late", after=frames[:2])
            assert await late.result(timeout=10) == "late"

            def blocking() -> Any:
                with app.blocking() as client:
                    frame = client.enqueue(render, 9)
                    return client.enqueue(publish, "from a client", after=[frame]).result(10)

            assert await trio.to_thread.run_sync(blocking) == "from a client"
            for queue in (main, gpu):
                await wait_settled(app.redis, queue)
        for queue in (main, gpu):
            await assert_drained(app.redis, queue)


def test_workflows_are_checked_before_anything_is_sent() -> None:
    app = App("checks")

    @app.job
    async def one(n: int) -> int:
        return n

    with pytest.raises(ConfigError, match="at least one step"):
        chain()
    with pytest.raises(ConfigError, match="takes steps"):
        group(one)  # type: ignore[arg-type]
    step = Step(one, JobCall(args=(1,), after=["x"]))
    with pytest.raises(ConfigError, match="leave after= out"):
        chain(step)


@pytest.mark.cluster
async def test_a_chain_across_shards_and_queues_on_a_cluster(redis_url: str) -> None:
    app = App("crossing", redis_url=redis_url, job_shards=4)

    @app.job
    async def begin(n: int) -> int:
        return n

    @app.job(queue="gpu", concurrency=10)
    async def render(n: int) -> str:
        return f"frame {n}"

    @app.job(rate_limit="100/s")
    async def store(frames: list[str]) -> str:
        return ", ".join(frames)

    async with app, serving(app.job_queue), serving(app.job_queues["gpu"]):
        # begin (default queue) -> three renders (gpu queue) -> their gather (gpu)
        # -> store (default queue, on its rate limit's shard)
        flow = chain(begin.step(7), group(*[render.step() for _ in range(3)]), store.step())
        handle = await app.job_queue.enqueue_workflow(flow)
        assert await handle.result(timeout=15) == "frame 7, frame 7, frame 7"
        queues = {h.queue.name for h in handle.jobs}
        assert queues == {"crossing", "crossing.gpu"}


async def test_the_blocking_and_asyncio_clients_enqueue_workflows(redis_url: str) -> None:
    app = App("clientflow", redis_url=redis_url)

    @app.job
    async def double(n: int) -> int:
        return 2 * n

    @app.job
    async def add(values: list[int]) -> int:
        return sum(values)

    flow = chord([double.step(n) for n in (1, 2, 3)], add.step())
    async with app, serving(app.job_queue):

        def blocking() -> Any:
            with app.blocking() as client:
                return client.enqueue_workflow(chain(double.step(5), double.step())).result(5)

        assert await trio.to_thread.run_sync(blocking) == 20

        def in_asyncio() -> Any:
            import asyncio

            async def main() -> Any:
                async with app.asyncio() as client:
                    handle = await client.enqueue_workflow(flow)
                    return await handle.result(5)

            return asyncio.run(main())

        assert await trio.to_thread.run_sync(in_asyncio) == 12
