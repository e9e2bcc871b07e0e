"""The app module a web shop shares between its web servers and its workers.

Workers run it (``streamkit worker examples.web_shop:app``; it is the README's and the
quickstart's ``shop.py``); the web apps import it to
send events and enqueue jobs through a client (``examples/web_flask.py``, a blocking
Flask app, and ``examples/web_fastapi.py``, an asyncio FastAPI app). One definition of
the streams and jobs serves both sides: no names or payload formats to keep in step.
"""

from __future__ import annotations

# docs: start app
from datetime import datetime

from streamkit import App, Events, Record

app = App("shop")  # Redis from STREAMKIT_REDIS_URL (default redis://127.0.0.1:6379)


class Order(Record):
    order_id: int
    customer: str
    amount: float
    created_at: datetime


orders = app.stream("orders", record=Order, partition_by="customer", partition_count=8)


@app.processor(orders)
async def printer(events: Events[Order]) -> None:
    async for order in events.records():
        print(order.customer, order.amount)


@app.job(retries=2)
async def send_receipt(order_id: int, email: str) -> str:
    # Hand the receipt to the mail server here.
    return f"receipt {order_id} sent to {email}"


@app.job
def quote(amount: float, country: str = "FR") -> float:
    rates = {"FR": 0.20, "DE": 0.19}
    return round(amount * (1 + rates.get(country, 0.0)), 2)


# docs: end app
