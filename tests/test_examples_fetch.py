"""examples/fetch_without_app.py runs on its own: every order processed once, in order."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

EXAMPLE = Path(__file__).parent.parent / "examples" / "fetch_without_app.py"
ORDERS = 40


@pytest.mark.timeout(60)
async def test_fetch_example_processes_every_order_in_order(redis_url: str) -> None:
    with trio.fail_after(50):
        result = await trio.run_process(
            [sys.executable, str(EXAMPLE), "--redis-url", redis_url, "--orders", str(ORDERS)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    seen = [
        (int(p), int(order), customer)
        for p, order, customer in re.findall(r"partition (\d+): order (\d+) of (\S+)", out)
    ]
    assert sorted(order for _, order, _ in seen) == list(range(ORDERS))
    by_customer: dict[str, list[int]] = {}
    partition_of: dict[str, set[int]] = {}
    for partition, order, customer in seen:
        by_customer.setdefault(customer, []).append(order)
        partition_of.setdefault(customer, set()).add(partition)
    for customer, ids in by_customer.items():
        assert ids == sorted(ids), f"{customer}'s orders out of order: {ids}"
        assert len(partition_of[customer]) == 1
    assert f"processed {ORDERS} orders, 0 pending" in out
    assert "ok: every order was processed and acknowledged" in out


def test_example_help() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"], capture_output=True, check=True
    )
    assert b"--redis-url" in result.stdout
