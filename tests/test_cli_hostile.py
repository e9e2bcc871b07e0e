"""Text from Redis is shown literally: by every command that shows it, and in log lines.

Error messages, names, ids, arguments and tracebacks come from producers and events.
Each test writes a hostile value (rich markup, ANSI escapes, a newline, an emoji code,
HTML and a bidirectional override) into a real Redis where a producer, an event or
another process could, runs the real command in a subprocess and checks that the
value appears escaped, on its own line, and that nothing of it was obeyed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from streamkit._keys import halt_key, partition_lock_name
from streamkit._locks import lock_key
from streamkit.jobs import JobCall
from streamkit.testing import wait_until
from tests import cli_forkserver
from tests.apps import jobbing
from tests.test_cli import ROOT, Result, read_into
from tests.test_cli_jobs import run_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import App, Redis

HOSTILE = (
    "[/] [link=https://evil.example]x[/link] \x1b[31mred\x1b[0m\nforged :smile: <b>b</b> \u202eevil"
)
#: How it must look: every control character escaped, the rest as it is.
SHOWN = (
    r"[/] [link=https://evil.example]x[/link] \x1b[31mred\x1b[0m\nforged :smile: <b>b</b> "
    r"\u202eevil"
)
HOSTILE_ID = "id[/]\x1b[2J\nx"
SHOWN_ID = r"id[/]\x1b[2J\nx"

FAILING = "tests.apps.failing:app"
JOBBING = "tests.apps.jobbing:app"
#: Wide enough that no table cuts or folds a cell.
WIDE = {"COLUMNS": "2000"}


def assert_literal(result: Result, *shown: str, traceback: bool = False) -> None:
    """The command succeeded and showed ``shown`` literally, obeying none of it (and
    showed no traceback, unless it shows a job's)."""
    text = result.out + result.err
    assert result.code == 0, text
    assert traceback or "Traceback" not in text
    for value in shown:
        assert value in text, text
    assert "\x1b" not in text
    assert "\u202e" not in text
    assert not any(line.startswith(("forged", "x")) for line in text.splitlines()), text


async def run_wide(*args: str, redis_url: str) -> Result:
    env = {**os.environ, **WIDE, "STREAMKIT_REDIS_URL": redis_url}
    with trio.fail_after(60):
        code, out, err = await cli_forkserver.run(list(args), cwd=ROOT, env=env)
    return Result(code, out.decode(), err.decode())


async def hostile_halt(redis: Redis) -> None:
    """Partition 0 of the failing app's processor halted on a hostile error, by a
    hostile worker, which holds the partition's lease."""
    await redis.hset(
        halt_key("failing", "jobs", "handle", 0),
        {
            "error_type": HOSTILE,
            "error": HOSTILE,
            "entry_ids": "1-0",
            "since": "1767225600.0",
            "worker": HOSTILE,
        },
    )
    lock = lock_key(partition_lock_name("failing", "jobs", "handle", 0))
    await redis.set(lock, f"{HOSTILE}:1:token", px=60_000)


async def test_status(redis_url: str, redis: Redis) -> None:
    await hostile_halt(redis)
    result = await run_wide("status", FAILING, redis_url=redis_url)
    assert_literal(result, SHOWN)
    [halted] = [line for line in result.out.splitlines() if "partition 0 HALTED" in line]
    assert halted.startswith("partition 0 HALTED "), halted
    assert halted.endswith(f" ago: {SHOWN}: {SHOWN} (on {SHOWN})"), halted


async def test_status_watch(redis_url: str, redis: Redis) -> None:
    await hostile_halt(redis)
    env = {**os.environ, **WIDE, "STREAMKIT_REDIS_URL": redis_url}
    out = bytearray()
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "streamkit", "status", FAILING, "--watch", "--interval", "0.2"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_into, process.stdout, out)
            await wait_until(lambda: b"HALTED" in out, what="a snapshot", within=30)
            process.send_signal(signal.SIGINT)
            code = await process.wait()
    assert_literal(Result(code, out.decode(), ""), f"HALTED ({SHOWN}) · {SHOWN}")


async def test_dead_letters_list(redis_url: str, redis: Redis) -> None:
    await redis.xadd(
        "__dead:{failing.jobs.handle}",
        {
            "dl.reason": HOSTILE,
            "dl.error_type": HOSTILE,
            "dl.error": HOSTILE,
            "dl.entry_id": HOSTILE,
            # Not numbers, as the dead-letter policy writes them: read as defaults.
            "dl.partition": "[/]",
            "dl.delivery_count": "\x1b",
            "dl.time": "1e999",
            "data": HOSTILE,
        },
    )
    result = await run_wide("deadletters", "list", FAILING, "handle", redis_url=redis_url)
    assert_literal(result, SHOWN, f"{SHOWN}: {SHOWN}")


@pytest.fixture
async def app(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[App]:
    monkeypatch.setattr(
        jobbing.app, "settings", attrs.evolve(jobbing.app.settings, redis_url=redis_url)
    )
    async with jobbing.app:
        yield jobbing.app


async def hostile_dead_job(app: App, redis: Redis) -> None:
    """A dead job with a hostile id, arguments and error, then a hostile name and
    worker (as another producer or process could have written them)."""
    queue = app.job_queue
    [handle] = await jobbing.explode.enqueue_many(
        [JobCall(args=(1,), kwargs={"why": HOSTILE}, job_id=HOSTILE_ID)]
    )

    async def dead() -> bool:
        return (await queue.counts()).dead >= 1

    with trio.fail_after(30):
        await run_until(queue, "the job dead", dead)
    job = queue.shard_keys[handle.shard].job(HOSTILE_ID)
    await redis.hset(job, {"name": HOSTILE, "worker": HOSTILE})
    await redis.hincrby(queue.shard_keys[handle.shard].counts, f"dead|{HOSTILE}", 1)


async def test_jobs_commands(app: App, redis: Redis, redis_url: str) -> None:
    await hostile_dead_job(app, redis)
    shown = await run_wide("jobs", "show", JOBBING, HOSTILE_ID, redis_url=redis_url)
    assert_literal(shown, SHOWN_ID, SHOWN, f"  worker    {SHOWN}", traceback=True)
    assert f"  call      {SHOWN}(1, why=" in shown.out
    listed = await run_wide("jobs", "dlq", "list", JOBBING, redis_url=redis_url)
    assert_literal(listed, SHOWN_ID, SHOWN)
    info = await run_wide("jobs", "info", JOBBING, redis_url=redis_url)
    assert_literal(info, SHOWN)
    aborted = await run_wide("jobs", "abort", JOBBING, HOSTILE_ID, redis_url=redis_url)
    assert_literal(aborted, f"job {SHOWN_ID} ({SHOWN}) already ended dead")
    status = await run_wide("status", JOBBING, redis_url=redis_url)
    assert_literal(status, SHOWN)


async def test_worker_log_lines(app: App, redis_url: str) -> None:
    env = {**os.environ, "STREAMKIT_REDIS_URL": redis_url}
    err = bytearray()
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "streamkit", "worker", JOBBING],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_into, process.stderr, err)
            await wait_until(lambda: b"running" in err, what="the worker running", within=30)
            await jobbing.explode.enqueue_many(
                [JobCall(args=(1,), kwargs={"why": HOSTILE}, job_id=HOSTILE_ID)]
            )
            await wait_until(lambda: b"it is dead" in err, what="the job's death", within=30)
            process.send_signal(signal.SIGINT)
            await process.wait()
    text = err.decode()
    [line] = [line for line in text.splitlines() if "it is dead" in line]
    # One line: the job's context, its id and its error, escaped.
    assert f"[job explode {SHOWN_ID}]" in line
    assert f"(ValueError: explode 1: {SHOWN}); it is dead" in line
    # The traceback follows on lines of its own, with no raw escape codes.
    assert "\x1b" not in text
    assert "\u202e" not in text
