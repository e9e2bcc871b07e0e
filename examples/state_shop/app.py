"""Orders per customer and revenue per shop and minute, exactly once: the state example.

Two processors, chained by a stream:

* ``bookkeeping`` reads ``orders`` (partitioned by customer) and keeps, per customer,
  the number of orders and what they spent (two tables); it also re-keys each order by
  its shop, emitting a :class:`Sale` to ``sales`` (partitioned by shop);
* ``minutes`` reads ``sales`` and sums the revenue per shop and minute of the orders'
  own time (a tumbling-window table); each closed minute goes to ``per_minute``.

A processor writes only the keys of the partition it processes (the co-partitioning
rule), so revenue per *shop* needs the sales re-keyed by shop: the emitted ``sales``
do that, exactly once. Every table write and every emitted record is committed with
the acknowledgement of the events behind it, so after a worker is killed, or paused
past its lease, or Redis restarts, the counts equal the orders sent: not "at least".

The minute and the grace can be changed with ``STATE_SHOP_WINDOW`` and
``STATE_SHOP_GRACE`` (seconds; the demo uses short ones). Redis is taken from
``STREAMKIT_REDIS_URL``. From the root of a clone of the
repository, run workers with ``streamkit worker examples.state_shop.app:app``;
``./dev demo state`` runs the whole story on a private Redis
(``examples/state_shop/demo.py``).
"""

from __future__ import annotations

import operator
import os
from datetime import datetime, timedelta

from streamkit import App, Events, Record, tumbling

app = App("state_shop")
WINDOW = timedelta(seconds=float(os.environ.get("STATE_SHOP_WINDOW", "60")))
GRACE = timedelta(seconds=float(os.environ.get("STATE_SHOP_GRACE", "10")))


class Order(Record):
    order_id: int
    customer: str
    shop: str
    amount: float
    created_at: datetime


class Sale(Record):
    shop: str
    amount: float
    created_at: datetime


class Minute(Record):
    shop: str
    start: datetime
    revenue: float


# docs: start declare
orders = app.stream("orders", record=Order, partition_by="customer", partition_count=8)
sales = app.stream("sales", record=Sale, partition_by="shop", partition_count=4)
per_minute = app.stream("per_minute", record=Minute, partition_by="shop", partition_count=4)

order_counts = app.table("order_counts", value=int, default=0)
spent = app.table("spent", value=float, default=0.0)
revenue = app.window(
    "revenue",
    tumbling(WINDOW),  # a minute
    value=float,
    initial=0.0,
    grace=GRACE,  # sales up to 10 s late still count
    time="created_at",  # the order's own time, not when it is processed
    output=per_minute,
    result=lambda shop, window, total: Minute(shop=shop, start=window.start, revenue=total),
)
# docs: end declare


# docs: start processors
@app.processor(orders, tables=[order_counts, spent], outputs=[sales])
async def bookkeeping(events: Events[Order]) -> None:
    async for order in events.records():
        order_counts.set(order.customer, await order_counts.get(order.customer) + 1)
        spent.set(order.customer, await spent.get(order.customer) + order.amount)
        events.emit(sales, Sale(shop=order.shop, amount=order.amount, created_at=order.created_at))


@app.processor(sales, tables=[revenue])
async def minutes(events: Events[Sale]) -> None:
    async for sale in events.records():
        await revenue.update(sale.shop, sale, operator.add, sale.amount)


# docs: end processors
