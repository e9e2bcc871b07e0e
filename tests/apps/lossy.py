"""An app for the data loss scenarios: a processor with a table, and one without.

``count`` keeps the number of orders per customer in the table ``tally``; ``watch``
only looks at them. ``make_app()`` builds it for in-process use; the module-level
``app`` is for ``streamkit worker tests.apps.lossy:app`` subprocesses.
"""

from __future__ import annotations

from typing import Any

from streamkit import App, Events, Record, Stream, Table

PARTITIONS = 4


class Order(Record):
    order_id: int
    customer: str


def make_app(**settings: Any) -> tuple[App, Stream[Order], Table[int]]:
    app = App("lossy", **settings)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=PARTITIONS)
    tally = app.table("tally", value=int, default=0)

    @app.processor(orders, tables=[tally])
    async def count(events: Events[Order]) -> None:
        async for order in events.records():
            tally.set(order.customer, await tally.get(order.customer) + 1)

    @app.processor(orders)
    async def watch(events: Events[Order]) -> None:
        async for _ in events.records():
            pass

    return app, orders, tally


app = make_app()[0]
