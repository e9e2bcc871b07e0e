"""runnel's README example on streamkit: orders, partitioned by customer.

Redis is taken from ``STREAMKIT_REDIS_URL`` (default ``redis://127.0.0.1:6379``).
Run workers with ``streamkit worker examples.orders.app:app``.

The processor keeps a running total per customer and counts what each worker
processed, in Redis, so the demo can show where every order went; it also checks
that each customer's orders arrive in order.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime

from streamkit import App, Events, Record

app = App("orders_demo")


class Order(Record):
    order_id: int
    customer: str
    amount: float
    created_at: datetime


orders = app.stream("orders", record=Order, partition_by="customer", partition_count=8)

WORKER = f"{socket.gethostname()}:{os.getpid()}"


@app.processor(orders)
async def totals(events: Events[Order]) -> None:
    redis = app.redis
    async for batch in events.take(100, within=0.1):
        async with redis.pipeline(transaction=False) as pipe:
            for order in batch:
                pipe.hincrbyfloat("orders_demo:totals", order.customer, order.amount)
                pipe.hset("orders_demo:last", {order.customer: order.order_id})
            pipe.hincrby("orders_demo:processed_by", WORKER, len(batch))
            pipe.hincrby("orders_demo:partitions", str(events.partition), len(batch))
