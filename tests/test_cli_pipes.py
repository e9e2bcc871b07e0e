"""Commands whose standard output is a real pipe that its reader closes early, as
``streamkit read ... | head -1`` does: each stops quietly with exit code 0, never a
message blaming Redis, never a traceback (see streamkit._cli._exits)."""

from __future__ import annotations

import os
import subprocess
import sys

import attrs
import pytest
import trio

from streamkit import App
from tests.apps.readable import Note
from tests.test_cli import ROOT, read_into
from tests.test_cli_tables import fill

NOTES = "tests.apps.readable:notes"
TABLES = "tests.apps.stateful:app"
#: Enough notes that their lines overflow a pipe's buffer (64 KiB) many times.
MANY = 3000


@attrs.frozen
class Piped:
    code: int
    read: list[bytes]
    err: str


async def piped(*args: str, redis_url: str, lines: int) -> Piped:
    """``python -m streamkit ARGS``, its standard output a pipe whose reader reads
    ``lines`` lines (0: none, closed before the command writes anything) and closes
    it, as ``| head -N`` does, while the command goes on."""
    env = {**os.environ, "STREAMKIT_REDIS_URL": redis_url, "STREAMKIT_CONNECT_GIVE_UP_AFTER": "0"}
    reading, writing = os.pipe()
    err = bytearray()
    with trio.fail_after(60):
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "streamkit", *args],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=writing,
                stderr=subprocess.PIPE,
            )
        finally:
            os.close(writing)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_into, process.stderr, err)
            with os.fdopen(reading, "rb") as reader:
                read = [await trio.to_thread.run_sync(reader.readline) for _ in range(lines)]
            # The reader is gone: the command meets it at its next write.
            code = await process.wait()
    return Piped(code, read, err.decode(errors="replace"))


def quiet(result: Piped) -> None:
    assert result.code == 0, result.err
    assert result.err == ""


@pytest.fixture
async def notes(redis_url: str) -> None:
    app = App("readable", redis_url=redis_url)
    stream = app.stream("notes", record=Note, partition_by="key", partition_count=4)
    async with app:
        await stream.send_many([Note(key=f"k{n % 7}", n=n, text="x" * 40) for n in range(MANY)])


@pytest.mark.parametrize(
    "args",
    [
        ("read", NOTES),
        ("read", NOTES, "--json"),
        ("tail", NOTES, "-n", str(MANY)),
    ],
    ids=["read", "read-json", "tail"],
)
async def test_head_1_of_a_long_listing_ends_it_quietly(
    notes: None, redis_url: str, args: tuple[str, ...]
) -> None:
    result = await piped(*args, redis_url=redis_url, lines=1)
    quiet(result)
    assert result.read[0].count(b"\t") == 2 or result.read[0].startswith(b"{")


@pytest.mark.parametrize(
    "args",
    [
        ("read", NOTES, "--count", "1"),
        ("tail", NOTES, "-n", "1"),
        ("status", "tests.apps.readable:app"),
        ("status", "tests.apps.readable:app", "--json"),
        ("status", "tests.apps.readable:app", "--watch", "--interval", "0.1"),
        ("status", "tests.apps.readable:app", "--watch", "--json", "--interval", "0.1"),
        ("table", "list", TABLES, "counts"),
        ("table", "get", TABLES, "counts", "k1"),
        ("jobs", "info", "tests.apps.jobbing:app"),
        ("--help",),
        ("--version",),
        ("status", "--help"),
    ],
    ids=lambda args: " ".join(args),
)
async def test_a_reader_gone_before_the_first_line_ends_it_quietly(
    notes: None, redis_url: str, args: tuple[str, ...]
) -> None:
    if args[0] == "table":
        await fill(redis_url)
    quiet(await piped(*args, redis_url=redis_url, lines=0))


async def test_a_failure_with_the_reader_there_is_still_said() -> None:
    result = await piped(
        "status", "tests.apps.readable:app", redis_url="redis://127.0.0.1:1", lines=1
    )
    assert result.code == 1
    assert "Redis" in result.err
