"""The README's shop, for ``streamkit status`` tests: a processor under the default
policy (halt) that keeps a table, and a job.

``printer`` halts on an order of a customer listed in the Redis set
``shopfront:broken``, and adds every other order's amount to the table ``totals``
(by customer). ``send_receipt`` is a job that returns at once.
"""

from __future__ import annotations

from datetime import datetime

from streamkit import App, Events, Record

BROKEN = "shopfront:broken"

app = App("shopfront")


class Order(Record):
    order_id: int
    customer: str
    amount: float
    created_at: datetime


orders = app.stream("orders", record=Order, partition_by="customer", partition_count=8)
totals = app.table("totals", value=float, default=0.0)


@app.processor(orders, tables=[totals])
async def printer(events: Events[Order]) -> None:
    async for order in events.records():
        if await app.redis.sismember(BROKEN, order.customer):
            raise ValueError(f"cannot print the order of {order.customer}")
        totals.set(order.customer, await totals.get(order.customer) + order.amount)


@app.job
async def send_receipt(order_id: int) -> int:
    return order_id
