"""Streamed results (``current_job().stream(chunk)``, ``handle.stream()``): in order
while the job runs, from the start for a late reader, resumed after a chunk, ended by
the outcome (a failure raises), bounded and expiring with the result; read from the
Trio queue and the blocking and asyncio clients."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, EncodeError
from streamkit.jobs import JobChunk, JobFailed, current_job

if TYPE_CHECKING:
    from streamkit import Redis

TOKENS = 200


async def test_chunks_in_order_late_resumed_and_ended(redis_url: str, redis: Redis) -> None:
    app = App("streaming", redis_url=redis_url)
    go = trio.Event()

    @app.job(result_ttl=600)
    async def generate(prompt: str) -> str:
        job = current_job()
        for i in range(TOKENS):
            job.stream({"token": i})
            if i == TOKENS // 2:
                await go.wait()  # a reader is reading meanwhile
            elif i % 20 == 0:
                await trio.sleep(0.001)
        with pytest.raises(EncodeError):
            job.stream(object())
        return f"{prompt}: done"

    @app.job(retries=0)
    async def broken() -> None:
        current_job().stream("partial")
        raise ValueError("the model failed")

    async with app, trio.open_nursery() as nursery:
        await nursery.start(app.job_queue.serve)
        handle = await generate.delay("hello")
        live: list[JobChunk] = []

        async def read_live() -> None:
            async for chunk in handle.stream():
                live.append(chunk)
                if chunk.value == {"token": TOKENS // 2}:
                    go.set()

        with trio.fail_after(20):
            await read_live()
        assert [c.value["token"] for c in live] == list(range(TOKENS))
        assert {c.try_number for c in live} == {1}
        assert await handle.result(timeout=10) == "hello: done"
        # A late reader gets everything from the start; another resumes after a chunk.
        late = [c async for c in handle.stream()]
        assert late == live
        resumed = [c async for c in handle.stream(after=live[49].id)]
        assert resumed == live[50:]
        # Bounded and expiring with the result.
        key = app.job_queue.shard_keys[handle.shard].output(handle.id)
        ttl: Any = await redis.ttl(key)
        assert 0 < ttl <= 600
        # A failed job's stream ends with its failure.
        failing = await broken.delay()
        got: list[Any] = []

        async def read_failing() -> None:
            async for chunk in failing.stream():
                got.append(chunk.value)  # noqa: PERF401 (kept when the end raises)

        with pytest.raises(JobFailed, match="the model failed"):
            await read_failing()
        assert got == ["partial"]
        # The blocking and asyncio clients read the same.
        blocking = await trio.to_thread.run_sync(_read_blocking, app, handle.id)
        assert blocking == live
        via_asyncio = await trio.to_thread.run_sync(
            lambda: asyncio.run(_read_asyncio(app, handle.id, after=live[-2].id))
        )
        assert via_asyncio == live[-1:]
        nursery.cancel_scope.cancel()


def _read_blocking(app: App, job_id: str) -> list[JobChunk]:
    with app.blocking() as client:
        return list(client.handle(job_id).stream())


async def _read_asyncio(app: App, job_id: str, *, after: str) -> list[JobChunk]:
    async with app.asyncio() as client:
        return [chunk async for chunk in client.handle(job_id).stream(after=after)]
