"""``streamkit status --watch`` as a real subprocess, against a real worker and Redis:
JSON lines, plain snapshots in a pipe, and a live view redrawn in place on a pty."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import pytest
import trio

from tests.apps import fleet
from tests.cli_processes import in_pty
from tests.test_cli import ROOT, streamkit
from tests.workers import start_worker

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator
    from pathlib import Path

    from tests.workers import WorkerProcess

APP = "tests.apps.fleet:app"
CLICKS = 2_000
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: What rich's Live writes to go back to the top of its previous frame: erase the
#: line, then (cursor up, erase the line) once per other line.
REDRAW = re.compile(r"\r(?:\x1b\[2K\x1b\[1A)+\x1b\[2K")


@pytest.fixture
async def backlog(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``CLICKS`` clicks sent and not processed yet (no worker has run)."""
    monkeypatch.setattr(
        fleet.app, "settings", attrs.evolve(fleet.app.settings, redis_url=redis_url)
    )
    async with fleet.app:
        await fleet.clicks.send_many(fleet.Click(user=f"u{n % 50}", n=n) for n in range(CLICKS))


def watch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamkit", "status", APP, "--watch", *args]


def env(redis_url: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "STREAMKIT_REDIS_URL": redis_url, **extra}


async def lines_of(stream: trio.abc.ReceiveStream) -> AsyncGenerator[str, None]:
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.decode()


async def stop(process: trio.Process) -> int:
    """Ctrl-C, as a person stops the view; the exit code."""
    process.send_signal(signal.SIGINT)
    with trio.fail_after(15):
        return await process.wait()


async def test_json_lines_show_the_lag_falling_to_zero(
    redis_url: str, backlog: None, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    process = await trio.lowlevel.open_process(
        watch_command("--json", "--interval", "0.2"),
        cwd=ROOT,
        env=env(redis_url),
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    docs: list[dict[str, Any]] = []
    try:
        with trio.fail_after(60):
            async with contextlib.aclosing(lines_of(process.stdout)) as lines:
                async for line in lines:
                    doc = orjson.loads(line)  # every line is a JSON document
                    docs.append(doc)
                    [count] = doc["processors"]
                    if len(docs) == 1:
                        assert count["lag"] == CLICKS  # before any worker
                        workers.append(start_worker(redis_url, tmp_path, app=APP))
                    elif count["lag"] == 0 and count["workers"]:
                        break
        assert await stop(process) == 0
    finally:
        with trio.move_on_after(5) as cleanup:
            cleanup.shield = True
            if process.returncode is None:
                process.kill()
                await process.wait()
    [count] = docs[-1]["processors"]
    pid = workers[0].pid
    assert {p["worker"] for p in count["partitions"]} == {f"{os.uname().nodename}:{pid}"}
    lags = [doc["processors"][0]["lag"] for doc in docs]
    assert lags[0] == CLICKS
    assert lags[-1] == 0
    # The rate is the counter's growth: some reading saw the clicks go through.
    rates = [doc["processors"][0]["rate"] for doc in docs[1:]]
    assert any(rate is not None and rate > 0 for rate in rates), rates
    assert docs[-1]["jobs"]["queue"] == "fleet"


async def test_plain_snapshots_when_not_a_terminal(redis_url: str, backlog: None) -> None:
    process = await trio.lowlevel.open_process(
        watch_command("--interval", "0.2"),
        cwd=ROOT,
        env=env(redis_url),
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    out: list[str] = []
    try:
        with trio.fail_after(30):
            async with contextlib.aclosing(lines_of(process.stdout)) as lines:
                async for line in lines:
                    out.append(line)
                    # The fourth snapshot begins: three are complete.
                    if sum(1 for seen in out if seen.startswith("app fleet, Redis at")) == 4:
                        break
        assert await stop(process) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = "\n".join(out)
    assert "\x1b" not in text  # no escape codes in a pipe
    assert max(len(line) for line in out) <= 80
    assert text.count("processor count (stream clicks)") == 3
    assert text.count(f"lag {CLICKS:,}") == 3
    assert "more partitions" not in text  # no height: every row
    for n in range(4):
        assert any(line.split()[:1] == [str(n)] for line in out)


async def test_a_terminal_redraws_in_place_and_fits_its_size(redis_url: str, backlog: None) -> None:
    columns, rows = 80, 14
    output = b""
    command = watch_command("--interval", "0.2")
    opened = in_pty(command, redis_url=redis_url, rows=rows, columns=columns)
    async with opened as (process, terminal):
        with trio.fail_after(30):
            while output.count(b"\x1b[1A") < 3 * (rows - 2):  # three redraws at least
                output += await terminal.receive_some()
        assert await stop(process) == 0
        with trio.move_on_after(2):
            # The last frame; EIO (BrokenResourceError) once the process is gone.
            with contextlib.suppress(trio.BrokenResourceError):
                while chunk := await terminal.receive_some():
                    output += chunk
    text = output.decode(errors="replace")
    frames = REDRAW.split(text)
    assert len(frames) >= 4
    for frame in frames[1:-1]:
        lines = ANSI.sub("", frame).replace("\r", "").split("\n")
        assert len(lines) <= rows - 1, lines
        assert max(len(line) for line in lines) <= columns, lines
        # 4 partitions and 3 jobs do not fit in 14 lines: the view says what it left out.
        assert any("more partitions" in line for line in lines), lines
        assert any(line.startswith("app fleet, Redis at") for line in lines)
        assert any(f"lag {CLICKS:,}" in line for line in lines)


async def test_interval_needs_watch(redis_url: str) -> None:
    result = await streamkit("status", APP, "--interval", "2", redis_url=redis_url)
    assert result.code == 2
    assert "--interval goes with --watch" in result.err
