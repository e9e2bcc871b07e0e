"""The state examples run: the composed service on its own, the shop app under real
workers (counts exact, each closed window emitted once with the sum of its sales)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from examples.state_shop.app import Minute, Order, order_counts, spent
from streamkit import App
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis

ROOT = Path(__file__).resolve().parent.parent
SERVICE = ROOT / "examples" / "state_service.py"


@pytest.mark.timeout(60)
async def test_the_composed_service_counts_every_order_once(redis_url: str) -> None:
    with trio.fail_after(50):
        result = await trio.run_process(
            [sys.executable, str(SERVICE), "--redis-url", redis_url, "--orders", "60"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert "ok: every order counted once, one receipt each" in out


@pytest.mark.timeout(90)
async def test_the_shop_counts_and_windows(redis_url: str, redis: Redis) -> None:
    env = {
        **os.environ,
        "STREAMKIT_REDIS_URL": redis_url,
        "STATE_SHOP_WINDOW": "1",
        # Sales come from 8 partitions of orders, interleaved: their times may go back
        # by up to the span of the orders sent (0.3 s), well inside the grace.
        "STATE_SHOP_GRACE": "2",
        "STREAMKIT_LEASE_TTL": "1.5",
        "STREAMKIT_HEARTBEAT_INTERVAL": "0.1",
    }
    worker = subprocess.Popen(  # noqa: ASYNC220 (a worker, stopped in the finally)
        [sys.executable, "-m", "streamkit", "worker", "examples.state_shop.app:app"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        app = App("state_shop", redis_url=redis_url)
        orders = app.stream("orders", record=Order, partition_by="customer", partition_count=8)
        per_minute = app.stream("per_minute", record=Minute, partition_by="shop", partition_count=4)
        start = datetime.now(UTC) - timedelta(seconds=5)
        sent = [
            Order(
                order_id=n,
                customer=f"c{n % 7}",
                shop=f"s{n % 3}",
                amount=float(n % 10),
                created_at=start + timedelta(milliseconds=n),
            )
            for n in range(300)
        ]
        async with app:
            await orders.send_many(sent)
        customers = sorted({o.customer for o in sent})

        async def counted() -> bool:
            return sum(await order_counts.read_many(customers, redis=redis)) == len(sent)

        await wait_until(counted, what="every order counted", within=40)
        expected: dict[tuple[str, float], float] = defaultdict(float)
        for order in sent:
            second = order.created_at.timestamp()
            expected[order.shop, second - second % 1] += order.amount

        async def closed() -> bool:
            return sum([await redis.xlen(per_minute.key(p)) for p in range(4)]) >= len(expected)

        # The last windows close by the wall clock, about the grace after their end.
        await wait_until(closed, what="every window emitted", within=30)
        got: dict[tuple[str, float], list[float]] = defaultdict(list)
        for partition in range(4):
            entries: Any = await redis.xrange(per_minute.key(partition))
            for entry in entries:
                minute = per_minute.codec.decode(entry.field_values, stream="per_minute")
                got[minute.shop, minute.start.timestamp()].append(minute.revenue)
        assert {k: v for k, v in got.items() if v != [expected[k]]} == {}
        assert set(got) == set(expected)
        assert await spent.read("c1", redis=redis) == sum(
            o.amount for o in sent if o.customer == "c1"
        )
    finally:
        worker.terminate()
        worker.wait(timeout=20)
