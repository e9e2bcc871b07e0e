"""examples/metrics_service.py runs on its own: its endpoint shows every order processed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

EXAMPLE = Path(__file__).parent.parent / "examples" / "metrics_service.py"
ORDERS = 120


@pytest.mark.timeout(60)
async def test_metrics_example_serves_the_worker_and_its_own_metrics(redis_url: str) -> None:
    with trio.fail_after(50):
        result = await trio.run_process(
            [sys.executable, str(EXAMPLE), "--redis-url", redis_url, "--orders", str(ORDERS)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert "serving metrics on http://127.0.0.1:" in out
    assert f"streamkit_events_processed_total {ORDERS}\n" in out
    assert "streamkit_partition_lag 0\n" in out
    assert "streamkit_partitions_owned 4\n" in out
    assert f"metrics_demo_revenue_total {ORDERS}\n" in out
    assert "ok: every order processed, lag and pending back to zero" in out


def test_example_help() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"], capture_output=True, check=True
    )
    assert b"--port" in result.stdout
