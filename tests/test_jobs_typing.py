"""Typed jobs: ``Job[P, R]`` checks ``delay``'s arguments and types ``result()`` as ``R``.

This file is type-checked with the rest of the tests (``./dev nox -s typecheck``, strict
mypy, unused ``type: ignore`` comments refused): the ``assert_type`` lines fail the
check if a type is lost, and each ``type: ignore[...]`` below fails it if the call it
marks stops being an error. At run time the same calls are made against a real Redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, assert_type

import attrs
import pytest

from streamkit import App
from streamkit.clients import AsyncioJobHandle, BlockingJobHandle
from streamkit.jobs import Job, JobHandle, JobQueue, open_job_queue
from streamkit.jobs._model import JobOptions, JobOptionsArgs
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

    def misuse(app: App) -> None:  # the type checker refuses a misspelt or bad option
        app.job(queue="gpu", retry=2)  # type: ignore[call-overload]
        app.cron("* * * * *", priority="urgent")  # type: ignore[arg-type]

    assert isinstance(square, Job)
    assert callable(trio_use)
    assert callable(blocking_use)
    assert callable(asyncio_use)
    assert callable(misuse)


def test_queue_job_options_are_typed_as_job_options_takes_them() -> None:
    # JobQueue.job types its options with JobOptionsArgs and hands them to
    # JobOptions: the two must name the same options (but an App's ``queue``), or
    # the type checker and the code disagree.
    taken = {a.name for a in attrs.fields(JobOptions) if a.init}
    assert set(JobOptionsArgs.__annotations__) == taken - {"queue"}

    async def declare(queue: JobQueue) -> None:
        @queue.job(retries=2, timeout=1.5, rate_limit="10/s", priority="low")
        async def ping(n: int) -> int:
            return n

        assert_type(await ping.delay(1), JobHandle[int])
        queue.job(retry=2)  # type: ignore[call-overload]
        queue.job(priority="urgent")  # type: ignore[call-overload]

    assert callable(declare)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("queue", r"JobQueue\.job\(\) got an unexpected keyword argument 'queue'$"),
        ("retry", r"JobQueue\.job\(\) got .* 'retry'; did you mean 'retry_on' or 'retries'\?"),
    ],
)
async def test_a_queue_job_refuses_an_option_it_does_not_take(
    redis: Redis, option: str, message: str
) -> None:
    # ``queue`` routes an App's jobs; a queue has no use for it. ``retry`` is a typo.
    async with open_job_queue(redis, "typing-refuses") as queue:
        declare: Any = queue.job  # the type checker would refuse both too
        with pytest.raises(TypeError, match=message):
            declare(**{option: 2})
        assert queue.jobs == {}


def test_an_app_job_names_itself_and_the_option_meant() -> None:
    app = App("typo")
    declare: Any = app.job
    with pytest.raises(TypeError, match=r"App.job\(\) got .* 'timout'; did you mean 'timeout'"):
        declare(lambda: None, timout=3)
    with pytest.raises(TypeError, match=r"App.job\(\) got .* 'colour'$"):
        declare(colour="red")
    assert app.jobs == {}
