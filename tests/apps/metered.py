"""An app for the metrics tests: every kind of metric a worker exports gets samples.

- ``tally`` takes batches (``take``) and counts what it processed in Redis
  (``INCRBY metered:tallied``), so a test compares the metrics with it; with
  ``METERED_DELAY`` (seconds per batch) it is slow enough to watch a backlog;
- ``audit`` goes through ``records()`` and fails on every order whose ``n`` is a
  multiple of :data:`POISONED_EVERY`; its policy dead-letters them; it counts the
  orders per key in windows of ``n`` ms (the windowed table ``seen``);
- ``double`` is a job.

``make_app()`` builds a fresh app for in-process tests (and for sending); the
module-level ``app`` is for ``streamkit worker tests.apps.metered:app --metrics-port P``.
"""

from __future__ import annotations

import operator
import os
from datetime import timedelta
from typing import Any

import trio

from streamkit import App, Events, ExceptionPolicy, Record, Stream, tumbling

TALLIED = "metered:tallied"
POISONED_EVERY = 50
PARTITIONS = 4


class Order(Record):
    key: str
    n: int


def make_app(
    *, delay: float = float(os.environ.get("METERED_DELAY", "0")), **settings: Any
) -> tuple[App, Stream[Order]]:
    """The metered app and its ``orders`` stream."""
    app = App("metered", **settings)
    orders = app.stream("orders", record=Order, partition_by="key", partition_count=PARTITIONS)

    @app.processor(orders)
    async def tally(events: Events[Order]) -> None:
        async for batch in events.take(50, within=0.01):
            if delay:
                await trio.sleep(delay)
            await app.redis.incrby(TALLIED, len(batch))

    seen = app.window("seen", tumbling(timedelta(seconds=1)), value=int, initial=0)

    @app.processor(orders, policy=ExceptionPolicy(action="dead_letter"), tables=[seen])
    async def audit(events: Events[Order]) -> None:
        async for order in events.records():
            await seen.update(order.key, order.n, operator.add, 1)
            if order.n % POISONED_EVERY == 0:
                raise ValueError(f"order {order.n} does not add up")

    @app.job
    async def double(x: int) -> int:
        return 2 * x

    return app, orders


def order_list(count: int) -> list[Order]:
    """``count`` orders over 16 keys, numbered from 1."""
    return [Order(key=f"k{n % 16}", n=n) for n in range(1, count + 1)]


app, orders = make_app()
