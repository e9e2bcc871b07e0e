"""Typed jobs: ``Job[P, R]`` checks ``delay``'s arguments and types ``result()`` as ``R``.

This file is type-checked with the rest of the tests (``./dev nox -s typecheck``, strict
mypy, unused ``type: ignore`` comments refused): the ``assert_type`` lines fail the
check if a type is lost, and each ``type: ignore[...]`` below fails it if the call it
marks stops being an error. At run time the same calls are made against a real Redis.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, assert_type

import pytest

from streamkit import App
from streamkit.clients import AsyncioJobHandle, BlockingJobHandle
from streamkit.jobs import Job, JobHandle, JobQueue, open_job_queue
from streamkit.jobs._model import JobOptionsArgs
from tests.jobs_serving import serving

if TYPE_CHECKING:
    from streamkit import Redis


async def test_delay_checks_arguments_and_result_has_the_return_type(redis: Redis) -> None:
    async with open_job_queue(redis, "typed") as queue:

        @queue.job
        async def add(a: int, b: int = 0) -> int:
            return a + b

        @queue.job(retries=1)
        def shout(text: str) -> str:  # a plain def, run in a thread
            return text.upper()

        async with serving(queue):
            handle = await add.delay(1, b=2)
            assert_type(handle, JobHandle[int])
            total = await handle.result(timeout=5)
            assert_type(total, int)
            assert total == 3
            loud = await (await shout.delay("hi")).result(timeout=5)
            assert_type(loud, str)
            assert loud == "HI"
            by_id = queue.handle(handle.id)
            assert_type(by_id, JobHandle[Any])
            if TYPE_CHECKING:  # a type error, for the type checker only: "one" is no int
                await add.delay("one")  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await add.delay(1, c=3)  # type: ignore[call-arg]


def test_an_app_job_and_the_clients_are_typed_too() -> None:
    app = App("typedapp")

    @app.job(priority="high")
    async def square(n: int) -> float:
        return float(n * n)

    async def trio_use() -> float:
        handle = await square.delay(3)
        assert_type(handle, JobHandle[float])
        await square.delay("3")  # type: ignore[arg-type]
        return await handle.result()

    def blocking_use(app: App) -> float:
        with app.blocking() as client:
            handle = client.delay(square, 3)
            assert_type(handle, BlockingJobHandle[float])
            client.delay(square, 3, 4)  # type: ignore[call-overload]
            return handle.result()

    async def asyncio_use(app: App) -> float:
        async with app.asyncio() as client:
            handle = await client.delay(square, 3)
            assert_type(handle, AsyncioJobHandle[float])
            return await handle.result()

    assert isinstance(square, Job)
    assert callable(trio_use)
    assert callable(blocking_use)
    assert callable(asyncio_use)


def test_queue_job_options_are_typed_as_the_definition_spells_them() -> None:
    # The overloads of JobQueue.job type its options with JobOptionsArgs: the two
    # must name the same options, or the type checker and the code disagree.
    defined = inspect.signature(JobQueue.job).parameters.values()
    keywords = {p.name for p in defined if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(JobOptionsArgs.__annotations__) == keywords - {"name"}

    async def declare(queue: JobQueue) -> None:
        @queue.job(retries=2, timeout=1.5, rate_limit="10/s", priority="low")
        async def ping(n: int) -> int:
            return n

        assert_type(await ping.delay(1), JobHandle[int])
        queue.job(retry=2)  # type: ignore[call-overload]
        queue.job(priority="urgent")  # type: ignore[call-overload]

    assert callable(declare)
