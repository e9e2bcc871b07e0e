"""The CLI run as real processes, as a person runs them: in a terminal of a given
size, or serving the dashboard."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
from typing import TYPE_CHECKING

import trio

from tests.test_cli import ROOT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence


@contextlib.asynccontextmanager
async def in_pty(
    command: Sequence[str], *, redis_url: str, rows: int, columns: int
) -> AsyncIterator[tuple[trio.Process, trio.lowlevel.FdStream]]:
    """Start ``command`` (from the repository's root, with ``redis_url`` as
    ``STREAMKIT_REDIS_URL``) with an xterm of ``rows`` by ``columns`` as its standard
    input, output and error; yield the process and the terminal's other end. A
    process still running at the end is killed."""
    env = {
        **os.environ,
        "STREAMKIT_REDIS_URL": redis_url,
        "TERM": "xterm-256color",
        "COLUMNS": str(columns),
        "LINES": str(rows),
    }
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    process = await trio.lowlevel.open_process(
        list(command), cwd=ROOT, env=env, stdin=child, stdout=child, stderr=child
    )
    os.close(child)
    try:
        async with trio.lowlevel.FdStream(main) as terminal:
            yield process, terminal
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@contextlib.asynccontextmanager
async def serving_dashboard(
    redis_url: str, app: str, *args: str, env: Mapping[str, str] | None = None
) -> AsyncIterator[str]:
    """``streamkit dashboard APP --port 0 ARGS`` running; yield the first line it
    prints (where it serves). Stopped with Ctrl-C at the end, which must end it
    cleanly."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "streamkit", "dashboard", app, "--port", "0", *args],
        cwd=ROOT,
        env={**os.environ, "STREAMKIT_REDIS_URL": redis_url, **(env or {})},
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        with trio.fail_after(30):
            first = b""
            while b"\n" not in first:
                first += await process.stdout.receive_some()
        yield first.decode().splitlines()[0]
        process.send_signal(signal.SIGINT)
        with trio.fail_after(15):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
