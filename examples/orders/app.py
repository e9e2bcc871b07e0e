"""An app with one stream of orders, partitioned by customer.

Redis is taken from ``STREAMKIT_REDIS_URL`` (default ``redis://127.0.0.1:6379``).
"""

from __future__ import annotations

from datetime import datetime

from streamkit import App, Record

app = App("orders_demo")


class Order(Record):
    order_id: int
    customer: str
    amount: float
    created_at: datetime


orders = app.stream("orders", record=Order, partition_by="customer", partition_count=8)
