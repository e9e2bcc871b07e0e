"""What ``streamkit status``, its ``--watch`` view and ``streamkit jobs info`` show an
operator, run in a terminal of 80 columns (a pty, as a person runs them) against a
real worker: every line fits, no title wraps, no name is cut; a halted partition
shows as HALTED with the exact command that resumes it; lag means the same on every
row; each table's size per partition; the truth after a clean stop."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import attrs
import orjson
import pytest
import trio

from streamkit._locks import lock_key
from streamkit.jobs import open_job_queue
from streamkit.testing import wait_until
from tests.apps import shopfront
from tests.cli_processes import in_pty
from tests.test_cli import streamkit
from tests.test_cli_watch import REDRAW
from tests.workers import start_worker

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

APP = "tests.apps.shopfront:app"
COLUMNS = 80
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
CUSTOMERS = [f"customer-{n}" for n in range(24)]
PER_CUSTOMER = 3
BROKEN = CUSTOMERS[5]


async def in_terminal(*args: str, redis_url: str, rows: int = 60) -> list[str]:
    """``streamkit ARGS`` in a terminal of :data:`COLUMNS` columns: its screen's lines."""
    command = [sys.executable, "-m", "streamkit", *args]
    output = b""
    async with in_pty(command, redis_url=redis_url, rows=rows, columns=COLUMNS) as (
        process,
        terminal,
    ):
        with trio.fail_after(30):
            # EIO (BrokenResourceError) once the process is gone.
            with contextlib.suppress(trio.BrokenResourceError):
                while chunk := await terminal.receive_some():
                    output += chunk
        with trio.fail_after(10):
            assert await process.wait() == 0, output.decode(errors="replace")
    text = ANSI.sub("", output.decode(errors="replace")).replace("\r", "")
    return text.split("\n")


def fits(lines: list[str]) -> None:
    """Every line within the terminal's width, and nothing cut with an ellipsis (but a
    halt's error message, which may be as long as it likes)."""
    assert max(len(line) for line in lines) <= COLUMNS, "\n".join(lines)
    cut = [line for line in lines if "…" in line and " HALTED " not in line]
    assert not cut, "\n".join(lines)


@pytest.fixture
def shop(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        shopfront.app, "settings", attrs.evolve(shopfront.app.settings, redis_url=redis_url)
    )


async def send_orders() -> None:
    """Every customer's orders, the broken customer's first: its partition halts at
    its first event, with the whole partition left unprocessed."""
    order_id = 0
    orders = []
    for customer in [BROKEN, *(c for c in CUSTOMERS if c != BROKEN)]:
        for _ in range(PER_CUSTOMER):
            order_id += 1
            orders.append(
                shopfront.Order(
                    order_id=order_id,
                    customer=customer,
                    amount=1.5,
                    created_at=datetime(2026, 1, 1, tzinfo=UTC),
                )
            )
    async with shopfront.app:
        await shopfront.orders.send_many(orders)


def partition_of(customer: str) -> int:
    return shopfront.orders.partition_of(
        shopfront.Order(order_id=0, customer=customer, amount=0, created_at=datetime.now(UTC))
    )


async def halted_and_the_rest_done(redis: Redis) -> int:
    """Wait for the halt and the totals of the other partitions' customers; the
    halted partition."""
    halted = partition_of(BROKEN)
    others = [c for c in CUSTOMERS if partition_of(c) != halted]

    async def done() -> bool:
        if not await redis.exists([f"__halt:{{shopfront.orders.{halted}}}.printer"]):
            return False
        async with shopfront.app:
            totals = [await shopfront.totals.read(c) for c in others]
        return all(total == 1.5 * PER_CUSTOMER for total in totals)

    await wait_until(done, what="the halt and every other customer processed", within=30)
    return halted


@pytest.mark.timeout(90)
async def test_status_fits_80_columns_and_shows_the_halt_with_its_command(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess], shop: None
) -> None:
    await redis.sadd(shopfront.BROKEN, [BROKEN])
    worker = start_worker(redis_url, tmp_path, app=APP)
    workers.append(worker)
    await all_owned(redis, worker, 8)
    await send_orders()
    async with shopfront.app:
        await shopfront.send_receipt.delay(1)
    halted = await halted_and_the_rest_done(redis)

    lines = await in_terminal("status", APP, redis_url=redis_url)
    fits(lines)
    text = "\n".join(lines)
    # The title whole, on one line: no wrap.
    [title] = [line for line in lines if line.startswith("processor printer")]
    assert title.startswith("processor printer (stream orders): lag ")
    assert title.endswith(" · 1 worker · 1 HALTED"), title
    # The worker's name whole: host:pid.
    assert any(line.split()[:2] == [worker_name(worker), "alive"] for line in lines), text
    # The halted partition in the table, and the exact command under it.
    rows = partition_rows(lines)
    assert rows[halted][1] == "HALTED", rows[halted]
    assert [p for p, row in rows.items() if "HALTED" in row] == [halted]
    summary = f"partition {halted} HALTED "
    [said] = [line for line in lines if line.startswith(summary)]
    assert f"s ago: ValueError: cannot print the order of {BROKEN}" in said
    # The command, exact and whole on a line of its own (too long to follow the words).
    command = f"streamkit resume {APP} printer --partition {halted}"
    at = lines.index(said)
    assert lines[at + 1 : at + 3] == ["fix the cause, then run (--skip skips the event):", command]
    # The job's name whole.
    assert any(line.split()[:1] == ["send_receipt"] for line in lines), text

    # Lag means the same on every row: every event not processed yet, the pending
    # ones among them. The halted partition processed none of its events.
    report = orjson.loads((await streamkit("status", APP, "--json", redis_url=redis_url)).out)
    [processor] = report["processors"]
    for row in processor["partitions"]:
        assert row["pending"] <= row["lag"], row
        if row["partition"] == halted:
            assert row["lag"] == row["entries"] > 0, row
        else:
            assert row["lag"] == 0, row
    # Each table's size per partition: the customers whose totals it holds.
    sizes = [row["tables"]["totals"] for row in processor["partitions"]]
    assert sizes[halted] == 0
    assert sum(sizes) == len([c for c in CUSTOMERS if partition_of(c) != halted])
    header = next(line for line in lines if line.lstrip().startswith("part "))
    assert header.split() == [
        "part",
        "worker",
        "entries",
        "lag",
        "pending",
        "totals",
        "last",
        "event",
    ]
    for partition, row in rows.items():
        assert int(row[-3]) == sizes[partition], row


async def all_owned(redis: Redis, worker: WorkerProcess, partitions: int) -> None:
    """Wait until ``worker`` holds the lease of every partition of ``printer``."""
    names = [lock_key(f"{{shopfront.orders.{p}}}.printer") for p in range(partitions)]

    async def owned() -> bool:
        values = await redis.mget(names)
        return all(v is not None and f":{worker.pid}:" in v.decode() for v in values)

    await wait_until(owned, what="every partition owned", within=20)


def worker_name(worker: WorkerProcess) -> str:
    return f"{os.uname().nodename}:{worker.pid}"


def partition_rows(lines: list[str]) -> dict[int, list[str]]:
    """The partitions table's rows: partition -> its cells (split on spaces)."""
    rows: dict[int, list[str]] = {}
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("part "))
    for line in lines[start + 2 :]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows[int(cells[0])] = cells
    return rows


@pytest.mark.timeout(60)
async def test_status_after_a_clean_stop_says_the_last_worker_left(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess], shop: None
) -> None:
    never = await streamkit("status", APP, redis_url=redis_url)
    assert "no worker has run it yet" in never.out, never.out
    worker = start_worker(redis_url, tmp_path, app=APP)
    workers.append(worker)
    await all_owned(redis, worker, 8)
    worker.send_signal(signal.SIGINT)
    assert await worker.wait_exit(within=20) == 0, worker.log()
    after = await streamkit("status", APP, redis_url=redis_url)
    assert after.code == 0, after.err
    assert "no worker has run it" not in after.out, after.out
    assert "no worker runs it now (the last one left or was reaped)" in after.out


@pytest.mark.timeout(60)
async def test_jobs_info_fits_80_columns_and_finds_a_queue_of_undeclared_jobs(
    redis_url: str, redis: Redis, shop: None
) -> None:
    async with shopfront.app:
        for n in range(3):
            await shopfront.send_receipt.delay(n)
    lines = await in_terminal("jobs", "info", APP, redis_url=redis_url)
    fits(lines)
    assert "queue shopfront: jobs by name" in lines
    assert any(line.split()[1:4] == ["send_receipt", "│", "3"] for line in lines), lines

    # An app that declares no jobs (tests.apps.failing) still finds the jobs in the
    # queue named after it, which another module enqueued.
    async with open_job_queue(redis, "failing") as queue:

        @queue.job
        async def send_receipt(order_id: int) -> int:
            return order_id

        await send_receipt.delay(7)
        await send_receipt.delay(8)
    found = await streamkit("jobs", "info", "tests.apps.failing:app", redis_url=redis_url)
    assert found.code == 0, found.err
    assert "the app declares no jobs (@app.job)" in found.out
    assert re.search(r"send_receipt\s+│\s+2 queued", found.out), found.out


@pytest.mark.timeout(60)
async def test_the_watch_header_fits_80_columns_with_a_worker(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess], shop: None
) -> None:
    worker = start_worker(redis_url, tmp_path, app=APP)
    workers.append(worker)
    await all_owned(redis, worker, 8)
    await send_orders()
    async with shopfront.app:
        await shopfront.send_receipt.delay(1)
    # Plain snapshots (the view's frames, one after another), until two are out.
    lines = await watch_frames(redis_url)
    fits(lines)
    heads = [line for line in lines if line.startswith("app shopfront, Redis at")]
    assert heads, lines
    for head in heads:
        said = rf"app shopfront, Redis at {re.escape(redis_url)} · \d\d:\d\d:\d\d"
        # The footer goes first when the line would not fit.
        assert re.fullmatch(said + r"( · every 0\.2s · Ctrl-C quits)?", head.rstrip()), head
    titles = [line for line in lines if line.startswith("processor printer")]
    assert titles, lines
    for title in titles:
        assert " · pending " in title, title
        assert title.endswith((" · 1 worker", ")")), title
    assert any(line.split()[:1] == ["send_receipt"] for line in lines), lines


async def watch_frames(redis_url: str) -> list[str]:
    """Two frames of ``status --watch`` in a terminal of 80 columns (it is stopped
    with Ctrl-C, as a person stops it)."""
    command = [sys.executable, "-m", "streamkit", "status", APP, "--watch", "--interval", "0.2"]
    output = b""
    async with in_pty(command, redis_url=redis_url, rows=50, columns=COLUMNS) as (
        process,
        terminal,
    ):
        with trio.fail_after(30):
            while output.count(b"\x1b[1A") < 20:  # a redraw or two
                output += await terminal.receive_some()
        process.send_signal(signal.SIGINT)
        with trio.fail_after(15):
            assert await process.wait() == 0
    # Each redraw goes back up over the previous frame: split the frames there.
    frames = REDRAW.split(output.decode(errors="replace"))
    assert len(frames) >= 3, frames
    return [
        line for frame in frames[1:-1] for line in ANSI.sub("", frame).replace("\r", "").split("\n")
    ]
