"""The joins example runs: under a real worker, each order is emitted once, with its
payment if the two are within the window, else alone once its window closed, and the
tally's tables count them (the demo's own checks, on a small run)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from examples.joins_shop import app as shop
from examples.joins_shop.app import Order, Payment, Settled, paid_orders, unpaid_orders
from examples.joins_shop.demo import expected, problems
from streamkit import App
from streamkit.lowlevel import read_membership
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 1.0
# The worker forwards the two streams in no set order between them: every event time
# below is within the window and the grace of every other, so none is late.
GRACE = 3.0


@pytest.mark.timeout(90)
async def test_the_shop_settles_each_order_once(redis_url: str, redis: Redis) -> None:
    env = {
        **os.environ,
        "STREAMKIT_REDIS_URL": redis_url,
        "JOINS_SHOP_WINDOW": str(WINDOW),
        "JOINS_SHOP_GRACE": str(GRACE),
        "STREAMKIT_LEASE_TTL": "1.5",
        "STREAMKIT_HEARTBEAT_INTERVAL": "0.1",
    }
    worker = subprocess.Popen(  # noqa: ASYNC220 (a worker, stopped in the finally)
        [sys.executable, "-m", "streamkit", "worker", "examples.joins_shop.app:app"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        async def running() -> bool:
            for processor in shop.app.processors.values():
                snapshot = await read_membership(redis, processor.group)
                if snapshot is None or not snapshot.assignment.members:
                    return False
            return True

        # Sent once the forwarders run, so that neither side's backlog goes first.
        await wait_until(running, what="the worker to start", within=40)
        app = App("joins_shop", redis_url=redis_url)
        orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=8)
        payments = app.stream(
            "payments", record=Payment, partition_by="order_id", partition_count=8
        )
        settled = app.stream(
            "settled", record=Settled, partition_by=lambda s: s.order.customer, partition_count=4
        )
        start = datetime.now(UTC)
        sent_orders = [
            Order(
                order_id=n,
                customer=f"c{n % 5}",
                amount=float(n),
                created_at=start + timedelta(milliseconds=2 * n),
            )
            for n in range(120)
        ]
        # By n % 4: paid in the window, paid too late, never paid, paid before the
        # order was sent (its payment sent first, and within the window).
        delays = {0: 0.3, 1: WINDOW + 0.5, 3: 0.2}
        sent_payments = [
            Payment(
                order_id=o.order_id,
                amount=o.amount,
                paid_at=o.created_at + timedelta(seconds=delays[o.order_id % 4]),
            )
            for o in sent_orders
            if o.order_id % 4 in delays
        ]
        async with app:
            await payments.send_many([p for p in sent_payments if p.order_id % 4 == 3])
            await orders.send_many(sent_orders)
            await payments.send_many([p for p in sent_payments if p.order_id % 4 != 3])
        must = expected([*sent_orders, *sent_payments], timedelta(seconds=WINDOW))
        assert sum(must.values()) == 60  # the demo's rule: half of the orders paid in time
        customers = sorted({o.customer for o in sent_orders})

        async def tallied() -> bool:
            counts = await paid_orders.read_many(customers, redis=redis)
            counts += await unpaid_orders.read_many(customers, redis=redis)
            return sum(counts) >= len(sent_orders)

        # The unpaid close by the wall clock, about the window and the grace after
        # their time.
        await wait_until(tallied, what="every order tallied", within=60)
        results: list[Settled] = []
        for partition in range(4):
            entries: Any = await redis.xrange(settled.key(partition))
            results += [settled.codec.decode(e.field_values, stream="settled") for e in entries]
        assert problems(must, results) == {}
        assert len(results) == len(sent_orders)
        assert sum(await paid_orders.read_many(customers, redis=redis)) == 60
        assert sum(await unpaid_orders.read_many(customers, redis=redis)) == 60
        c1 = [r for r in results if r.order.customer == "c1"]
        assert await paid_orders.read("c1", redis=redis) == sum(r.payment is not None for r in c1)
    finally:
        worker.terminate()
        worker.wait(timeout=20)


def test_the_demo_check_finds_what_is_wrong() -> None:
    """The demo's check fails a run that emitted an order twice, missed one, paired one
    paid too late, or paired one with another order's payment."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    orders = [Order(order_id=n, customer="c", amount=1.0, created_at=at) for n in range(5)]
    pays = [Payment(order_id=n, amount=1.0, paid_at=at + timedelta(seconds=n)) for n in range(5)]
    must = expected([*orders, *pays], timedelta(seconds=2))
    assert must == {0: True, 1: True, 2: True, 3: False, 4: False}
    good = [
        Settled(order=o, payment=p if must[o.order_id] else None)
        for o, p in zip(orders, pays, strict=True)
    ]
    assert problems(must, good) == {}
    bad = [
        good[0],
        good[0],  # twice
        # good[1] missing
        Settled(order=orders[2], payment=pays[1]),  # another order's payment
        Settled(order=orders[3], payment=pays[3]),  # paid too late, yet paired
        good[4],
    ]
    assert problems(must, bad) == {
        0: "emitted 2 times",
        1: "emitted 0 times",
        2: "paired with the payment of order 1",
        3: "paired",
    }
