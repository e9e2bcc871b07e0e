"""Orders and their payments, joined within a window, exactly once: the joins example.

Orders and payments are two streams keyed alike (by order id, 8 partitions each).
The join ``paid`` pairs each order with its payment when the two are at most
:data:`WINDOW` apart in event time (the order's ``created_at``, the payment's
``paid_at``), whichever arrives first; as a left join it also emits each order paid by
nothing once its window is over (the window and the grace after it), with ``None``
for the payment. Each result is a :class:`Settled` sent to ``settled`` exactly once:
through a kill -9 of a worker, an order is never reported both paid and unpaid, or
twice.

A processor of ``settled``, ``tally``, counts paid and unpaid orders per customer in
two tables (``settled`` is keyed by customer, so that it may write their keys):
``streamkit table list examples.joins_shop.app:app unpaid_orders`` shows them.

The window and the grace can be changed with ``JOINS_SHOP_WINDOW`` and
``JOINS_SHOP_GRACE`` (seconds; the demo uses short ones). Redis is taken from
``STREAMKIT_REDIS_URL``. From the root of a clone of the repository, run workers with
``streamkit worker examples.joins_shop.app:app``; ``./dev demo joins`` runs the whole
story on a private Redis (``examples/joins_shop/demo.py``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from streamkit import App, Events, Record

app = App("joins_shop")
WINDOW = timedelta(seconds=float(os.environ.get("JOINS_SHOP_WINDOW", "600")))
GRACE = timedelta(seconds=float(os.environ.get("JOINS_SHOP_GRACE", "60")))


class Order(Record):
    order_id: int
    customer: str
    amount: float
    created_at: datetime


class Payment(Record):
    order_id: int
    amount: float
    paid_at: datetime


class Settled(Record):
    order: Order
    payment: Payment | None  # None: not paid within the window


def settle(order_id: str, order: Order | None, payment: Payment | None) -> Settled:
    assert order is not None  # a left join: every result has its order
    return Settled(order=order, payment=payment)


# docs: start declare
orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=8)
payments = app.stream("payments", record=Payment, partition_by="order_id", partition_count=8)
settled = app.stream(
    "settled", record=Settled, partition_by=lambda s: s.order.customer, partition_count=4
)

paid = app.join(
    "paid",
    orders,
    payments,
    within=WINDOW,  # ten minutes to pay
    grace=GRACE,  # events up to a minute late still meet
    how="left",  # and the orders never paid, once their window is over
    output=settled,
    left_time="created_at",
    right_time="paid_at",
    result=settle,
)

paid_orders = app.table("paid_orders", value=int, default=0)
unpaid_orders = app.table("unpaid_orders", value=int, default=0)
# docs: end declare


# docs: start processors
@app.processor(settled, tables=[paid_orders, unpaid_orders])
async def tally(events: Events[Settled]) -> None:
    async for result in events.records():
        table = unpaid_orders if result.payment is None else paid_orders
        customer = result.order.customer
        table.set(customer, await table.get(customer) + 1)


# docs: end processors
