"""Job events (``queue.events()``, the clients' ``job_events()``, ``streamkit jobs
events``): every state change of a job, in order, from any process and from the
blocking and asyncio clients; resumed from a cursor after a reader restarts; followed
live; none while turned off."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import defaultdict
from typing import Any

import attrs
import orjson
import pytest
import trio

from streamkit import App, Backoff, ConfigError
from streamkit.jobs import JobCall, JobEvent, JobFailed, current_job
from streamkit.testing import wait_until
from tests.apps import jobbing
from tests.test_cli import ROOT, streamkit


async def test_each_job_s_changes_in_order_resumed_and_followed(redis_url: str) -> None:
    app = App("eventful", redis_url=redis_url)
    tries: list[int] = []

    @app.job(retries=1, backoff=Backoff(initial=0.01, maximum=0.02))
    async def flaky(n: int) -> int:
        current_job().progress({"at": n})
        tries.append(n)
        if len(tries) == 1:
            raise ConnectionError("once")
        return n

    @app.job(retries=0)
    async def broken() -> None:
        raise ValueError("no")

    @app.job
    async def later() -> None: ...

    followed: list[JobEvent] = []

    async def follow(task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        async for event in app.job_queue.events():
            followed.append(event)  # noqa: PERF401 (a follower, until cancelled)

    async with app, trio.open_nursery() as nursery:
        queue = app.job_queue
        await nursery.start(follow)  # a reader in another task, from the start
        await nursery.start(queue.serve)
        ok = await flaky.delay(1)
        assert await ok.result(timeout=10) == 1
        bad = await broken.delay()
        with pytest.raises(JobFailed):
            await bad.result(timeout=10)
        waiting = await later.enqueue(delay=60)
        await waiting.abort("not needed")
        await wait_until(lambda: len(followed) >= 12, what="the events followed", within=10)
        nursery.cancel_scope.cancel()
    async with app:
        kept = [e async for e in app.job_queue.events(follow=False)]
        # A reader that restarts resumes after the last event it saw.
        resumed = [e async for e in app.job_queue.events(after=kept[3].cursor, follow=False)]
        with pytest.raises(ConfigError, match="cursor"):
            [e async for e in app.job_queue.events(after="nonsense", follow=False)]
    assert kept == followed
    by_job: dict[str, list[str]] = defaultdict(list)
    for event in kept:
        by_job[event.job_id].append(event.kind)
    assert by_job[ok.id] == [
        "enqueued", "started", "progress", "retried", "started", "progress", "succeeded"
    ]  # fmt: skip
    assert by_job[bad.id] == ["enqueued", "started", "dead"]
    assert by_job[waiting.id] == ["enqueued", "aborted"]
    started = [e for e in kept if e.job_id == ok.id and e.kind == "started"]
    assert [e.detail for e in started] == [1, 2]
    retried = next(e for e in kept if e.kind == "retried")
    assert retried.detail["type"] == "ConnectionError"
    assert resumed == kept[4:]
    # The blocking and asyncio clients read the same, and resume the same.
    assert await trio.to_thread.run_sync(_blocking_events, app, None) == kept
    from_asyncio = await trio.to_thread.run_sync(
        lambda: asyncio.run(_asyncio_events(app, kept[3].cursor))
    )
    assert from_asyncio == kept[4:]


def _blocking_events(app: App, after: str | None) -> list[JobEvent]:
    with app.blocking() as client:
        return list(client.job_events(after=after))


async def _asyncio_events(app: App, after: str | None) -> list[JobEvent]:
    async with app.asyncio() as client:
        return [event async for event in client.job_events(after=after)]


async def test_events_turned_off_are_not_written(redis_url: str) -> None:
    app = App("eventful", redis_url=redis_url)

    @app.job
    async def quiet() -> None: ...

    async with app, trio.open_nursery() as nursery:
        queue = app.job_queue
        await queue.set_events(False)
        assert not await queue.events_enabled()
        await nursery.start(queue.serve)
        await (await quiet.delay()).result(timeout=10)
        assert [e async for e in queue.events(follow=False)] == []
        await queue.set_events(True)
        assert await queue.events_enabled()
        await (await quiet.delay()).result(timeout=10)
        kinds = [e.kind async for e in queue.events(follow=False)]
        assert kinds == ["enqueued", "started", "succeeded"]
        nursery.cancel_scope.cancel()


async def test_the_command_prints_and_follows_events(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobbing_app = jobbing.app
    monkeypatch.setattr(
        jobbing_app, "settings", attrs.evolve(jobbing_app.settings, redis_url=redis_url)
    )
    async with jobbing_app:
        handle = await jobbing.explode.delay(1, why="now")
    printed = await streamkit("jobs", "events", "tests.apps.jobbing:app", redis_url=redis_url)
    assert printed.code == 0, printed.err
    [line] = printed.out.splitlines()
    assert f"enqueued   {handle.id}  explode" in line
    as_json = await streamkit(
        "jobs", "events", "tests.apps.jobbing:app", "--json", redis_url=redis_url
    )
    event: Any = orjson.loads(as_json.out)
    assert (event["kind"], event["job_id"]) == ("enqueued", handle.id)
    # --follow runs until interrupted, and resumes after a cursor.
    process = await trio.lowlevel.open_process(
        [
            sys.executable, "-m", "streamkit", "jobs", "events", "tests.apps.jobbing:app",
            "--follow", "--after", event["cursor"],
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "STREAMKIT_REDIS_URL": redis_url},
    )  # fmt: skip
    assert process.stdout is not None
    try:
        async with jobbing_app:
            second = await jobbing.explode.delay(2, why="later")
        seen = b""
        with trio.fail_after(20):
            while second.id.encode() not in seen:
                seen += await process.stdout.receive_some()
        process.send_signal(signal.SIGINT)
        with trio.fail_after(10):
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stdout.aclose()
    assert handle.id.encode() not in seen
    assert code in (0, 130, -signal.SIGINT), code


async def test_a_call_s_events_are_one_entry_and_resume_inside_it(redis_url: str) -> None:
    """A script call that changes many jobs (here an enqueue of five) writes their
    events as one entry: each event has a place of its own in it, and a reader resumes
    after any of them, in the Trio queue and in both clients, following or not."""
    app = App("batched", redis_url=redis_url, job_shards=1)
    odd_ids = ["plain", "new\nline", 'quo"te', "ünï,cöde", "tab\there"]

    @app.job
    async def step(n: int) -> None: ...

    async with app:
        queue = app.job_queue
        await step.enqueue_many([JobCall(args=(i,), job_id=j) for i, j in enumerate(odd_ids)])
        kept = [e async for e in queue.events(follow=False)]
        assert [(e.job_id, e.kind, e.name) for e in kept] == [
            (j, "enqueued", "step") for j in odd_ids
        ]
        assert len({e.id for e in kept}) == 5
        assert len({e.id.split(".")[0] for e in kept}) == 1  # one entry
        for at in (0, 2, 4):
            resumed = [e async for e in queue.events(after=kept[at].cursor, follow=False)]
            assert resumed == kept[at + 1 :]
        got: list[JobEvent] = []

        async def follow() -> None:
            async for event in queue.events(after=kept[1].cursor):
                got.append(event)  # noqa: PERF401 (a follower, until cancelled)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await wait_until(lambda: len(got) >= 3, what="the followed events", within=10)
            nursery.cancel_scope.cancel()
        assert got == kept[2:]
    assert await trio.to_thread.run_sync(_blocking_events, app, kept[2].cursor) == kept[3:]
    from_asyncio = await trio.to_thread.run_sync(
        lambda: asyncio.run(_asyncio_events(app, kept[0].cursor))
    )
    assert from_asyncio == kept[1:]
