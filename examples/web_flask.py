"""A Flask view that records an order and enqueues a job: blocking code, no event loop.

Serve it with any WSGI server, e.g. gunicorn, and run a worker beside it::

    export STREAMKIT_REDIS_URL=redis://localhost:6379
    gunicorn --preload --workers 4 --threads 8 examples.web_flask:web
    streamkit worker examples.web_shop:app

The client is made once per process, at import. With ``--preload`` gunicorn imports the
module once and forks its workers from that process: each worker's first command
opens its own connections (a client is fork-safe), and its threads share them.
"""

from __future__ import annotations

# docs: start flask
import atexit
from datetime import UTC, datetime
from typing import Any

from flask import Flask, abort, request

from examples.web_shop import Order, app, orders, send_receipt
from streamkit import EncodeError
from streamkit.jobs import JobNotFound, JobStatus

web = Flask(__name__)
client = app.blocking()  # one per process; no I/O until the first command
atexit.register(client.close)


@web.post("/orders")
def place_order() -> tuple[dict[str, Any], int]:
    try:
        order = Order(**request.get_json(), created_at=datetime.now(UTC))
        # Checked as the workers will decode it: a field of the wrong type is refused
        # here, naming it, and nothing is sent.
        client.send(orders, order)  # the event, for the stream's processors
    except (EncodeError, TypeError) as exc:
        return {"error": str(exc)}, 400
    receipt = client.enqueue(send_receipt, order.order_id, f"{order.customer}@example.com")
    return {"order_id": order.order_id, "receipt_job": receipt.id}, 202


@web.get("/jobs/<job_id>")
def job_status(job_id: str) -> dict[str, Any]:
    handle = client.handle(job_id)
    try:
        status = handle.status()
    except JobNotFound:
        abort(404)
    body: dict[str, Any] = {"status": status.value}
    if status is JobStatus.SUCCESS:
        body["result"] = handle.result()
    return body


# docs: end flask
