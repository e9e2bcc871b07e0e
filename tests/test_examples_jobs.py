"""The job queue examples run: examples/jobs_standalone.py on its own, and
examples/jobs_app.py against a real ``streamkit worker`` subprocess."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest
import trio

from streamkit.testing import wait_until
from tests.workers import WorkerProcess, start_worker

if TYPE_CHECKING:
    from streamkit import Redis

EXAMPLES = Path(__file__).parent.parent / "examples"
STANDALONE = EXAMPLES / "jobs_standalone.py"
APP = EXAMPLES / "jobs_app.py"
ITEMS = 6
ORDERS = 4


@pytest.mark.timeout(60)
async def test_standalone_example_quotes_every_item_after_a_retry(redis_url: str) -> None:
    with trio.fail_after(50):
        result = await trio.run_process(
            [sys.executable, str(STANDALONE), "--redis-url", redis_url, "--items", str(ITEMS)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, out + err
    quoted = re.findall(r"^(item-\d+): [\d.]+ \([\d.]+ with tax\), quoted in 2 tries$", out, re.M)
    assert sorted(quoted) == sorted(f"item-{n}" for n in range(ITEMS))
    assert f"{2 * ITEMS} jobs succeeded, 0 pending" in out
    assert "ok: every item was quoted and taxed" in out
    # Each first quote failed once, and the worker said so.
    assert len(re.findall(r"\(quote\) failed on try 1 of 3 \(ConnectionError", err)) == ITEMS


@pytest.mark.timeout(90)
async def test_app_example_runs_on_a_streamkit_worker(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(redis_url, tmp_path, app="examples.jobs_app:app")
    workers.append(worker)

    # The cron job's tick of this minute runs as the worker starts (it is less than
    # misfire_grace late), and leaves a report.
    async def reported() -> bool:
        return bool(await redis.exists(["jobs_demo:report"]))

    await wait_until(reported, what="the cron job's first report", within=30)

    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, str(APP), "--redis-url", redis_url, "--orders", str(ORDERS)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode() + worker.log()
    lines = out.splitlines()
    receipts = [f"receipt {n} sent to customer-{n}@example.com" for n in range(ORDERS)]
    invoices = [f"invoice-{n}.pdf ({10.0 * n:.2f})" for n in range(ORDERS)]
    assert lines == [*receipts, *invoices, f"ok: {ORDERS} receipts and {ORDERS} invoices"]

    report = orjson.loads(await redis.get("jobs_demo:report") or b"{}")
    assert isinstance(report["succeeded"], int)

    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log()
    log = worker.log()
    assert "worker of jobs_demo running 3 jobs" in log
    assert "render_invoice, report, send_receipt" in log


@pytest.mark.parametrize("example", [STANDALONE, APP], ids=lambda p: p.stem)
def test_example_help(example: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(example), "--help"], capture_output=True, check=True
    )
    assert b"--redis-url" in result.stdout
