"""Orders that enqueue their receipts in the commit, and receipts that announce
themselves on success: one receipt job, and one ``receipts_sent`` record, per order.

The processor ``take_orders`` reads ``orders`` (partitioned by customer), keeps what
each customer spent (a table) and enqueues a ``send_receipt`` job per order with
``events.enqueue``: the table write, the job and the acknowledgement of the order are
one commit. So after a worker is killed with -9 mid-way, or paused past its lease, the
queue holds one receipt job per order, not "at least one". Each job then runs (at
least once, and ends once) on whichever worker is free, and emits a
:class:`ReceiptSent` to ``receipts_sent`` with ``current_job().emit``: written by the
script that records the try's success, so once per order, from the try that succeeded.

Redis is taken from ``STREAMKIT_REDIS_URL``. From the root of a clone of the
repository, run workers with ``streamkit worker examples.receipts.app:app``;
``tests/test_examples_receipts.py`` runs two and kills one with -9 while orders flow.
"""

from __future__ import annotations

import trio

from streamkit import App, Events, Record
from streamkit.jobs import current_job

app = App("receipts")


class Order(Record):
    order_id: int
    customer: str
    amount: float


class ReceiptSent(Record):
    order_id: int
    customer: str


# docs: start declare
orders = app.stream("orders", record=Order, partition_by="customer", partition_count=8)
receipts_sent = app.stream("receipts_sent", record=ReceiptSent, partition_by="customer")
spent = app.table("spent", value=float, default=0.0)


@app.job(retries=3, timeout=30)
async def send_receipt(order_id: int, customer: str, amount: float) -> str:
    await trio.sleep(0.001)  # hand the mail to the mail server
    # Appended with the try's success, only then: once per order.
    current_job().emit(receipts_sent, ReceiptSent(order_id=order_id, customer=customer))
    return f"receipt for order {order_id}: {amount:.2f} to {customer}"


@app.processor(orders, tables=[spent], jobs=[send_receipt])
async def take_orders(events: Events[Order]) -> None:
    async for order in events.records():
        spent.set(order.customer, await spent.get(order.customer) + order.amount)
        # Committed with the order's acknowledgement: one job per order, whatever fails.
        events.enqueue(send_receipt, order.order_id, order.customer, order.amount)


# docs: end declare
