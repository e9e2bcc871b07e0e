"""The orders demo's bookkeeping (examples/orders/app.py): true reorders only.

After a ``kill -9`` the new owner of a partition processes the old owner's
unacknowledged orders again, first and in order: those are redeliveries of orders
already seen, not orders out of order, and the demo's summary counts them apart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import trio

from examples.orders.app import STATS, TOTALS, Order, record_batch

if TYPE_CHECKING:
    from streamkit import Redis

WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def order(order_id: int, customer: str, amount: float) -> Order:
    return Order(order_id=order_id, customer=customer, amount=amount, created_at=WHEN)


async def stats(redis: Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await redis.hgetall(STATS)).items()}


async def test_redeliveries_after_a_kill_are_not_out_of_order(redis: Redis) -> None:
    with trio.fail_after(10):
        first = [order(1, "ada", 1.0), order(2, "ada", 2.0), order(3, "ada", 4.0)]
        await record_batch(redis, "w1", first)
        # w1 was killed before acknowledging: w2 gets the batch again, then a new one.
        await record_batch(redis, "w2", [*first, order(4, "ada", 8.0)])

        counted = await stats(redis)
        assert counted["out of order"] == 0
        assert counted["redelivered"] == 3
        assert counted["processed by w1"] == 3
        assert counted["processed by w2"] == 4
        totals = await redis.hgetall(TOTALS)
        assert float(totals[b"ada"]) == 15.0  # each order counted once


async def test_a_lower_order_never_seen_is_out_of_order(redis: Redis) -> None:
    with trio.fail_after(10):
        await record_batch(redis, "w1", [order(6, "bob", 1.0), order(5, "bob", 2.0)])
        await record_batch(redis, "w1", [order(5, "bob", 2.0)])  # and then redelivered

        counted = await stats(redis)
        assert counted["out of order"] == 1
        assert counted["redelivered"] == 1
        totals = await redis.hgetall(TOTALS)
        assert float(totals[b"bob"]) == 3.0
