"""examples/spark_stream_orders.py runs on its own: the second run reads only new orders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

pytest.importorskip("pyspark")

ROOT = Path(__file__).resolve().parent.parent
ORDERS = 1000

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


async def test_spark_stream_example_resumes_from_its_checkpoint(redis_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with trio.fail_after(280):
        result = await trio.run_process(
            [sys.executable, "-m", "examples.spark_stream_orders",
             "--url", redis_url, "--orders", str(ORDERS)],
            cwd=ROOT,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )  # fmt: skip
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()[-5000:]
    assert f"round 1: {ORDERS:,} orders in Parquet" in out
    assert f"round 2: {2 * ORDERS:,} orders in Parquet" in out
