"""A FastAPI endpoint that sends an event and awaits a job's result: asyncio code.

Serve it with uvicorn, and run a worker beside it::

    export STREAMKIT_REDIS_URL=redis://localhost:6379
    uvicorn examples.web_fastapi:web
    streamkit worker examples.web_shop:app

The client lives as long as the app (its lifespan); the requests' tasks share its
connections.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

from examples.web_shop import Order, app, orders, quote
from streamkit.jobs import JobFailed

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit.clients import AsyncioClient


# docs: start fastapi
@contextlib.asynccontextmanager
async def lifespan(web: FastAPI) -> AsyncIterator[None]:
    async with app.asyncio() as client:
        web.state.streamkit = client
        yield


web = FastAPI(lifespan=lifespan)


class OrderIn(BaseModel):
    order_id: int
    customer: str
    amount: float
    country: str = "FR"


@web.post("/orders/quote")
async def quote_order(order: OrderIn, request: Request) -> dict[str, Any]:
    client: AsyncioClient = request.app.state.streamkit
    placed = Order(
        order_id=order.order_id,
        customer=order.customer,
        amount=order.amount,
        created_at=datetime.now(UTC),
    )
    await client.send(orders, placed)
    handle = await client.delay(quote, order.amount, order.country)
    try:
        total = await handle.result(timeout=10)
    except (JobFailed, TimeoutError) as exc:
        raise HTTPException(503, f"no quote: {exc}") from None
    return {"order_id": order.order_id, "total": total}


# docs: end fastapi
