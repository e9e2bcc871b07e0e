"""Jobs in an App: declared with ``@app.job`` and ``@app.cron``, run by ``streamkit worker``.

The module is both sides. Its ``app`` declares the jobs: workers import it to run them
(``streamkit worker examples.jobs_app:app``) and producers to enqueue them. Run as a
program, it is a producer: it enqueues a receipt and an invoice per order (the invoice
waits for its receipt: a dependency) and prints the results as the workers return them.
The cron job ``report`` runs every minute on one of the workers, however many there are,
and stores the queue's counts in Redis.

Start one or more workers (from the repository's root), then the producer::

    export STREAMKIT_REDIS_URL=redis://localhost:6379
    streamkit worker examples.jobs_app:app
    python examples/jobs_app.py --orders 10
"""

from __future__ import annotations

import argparse
import sys

import attrs
import orjson
import trio

from streamkit import App
from streamkit.jobs import JobFailed
from streamkit.lowlevel import redis_errors

REPORT_KEY = "jobs_demo:report"  # where the cron job leaves the latest counts

# docs: start app
app = App("jobs_demo")  # its job queue is named after it; STREAMKIT_REDIS_URL says where


@app.job(retries=3, timeout=10)
async def send_receipt(order_id: int, email: str) -> str:
    await trio.sleep(0.01)  # hand the mail to the mail server
    return f"receipt {order_id} sent to {email}"


@app.job(priority="low")
def render_invoice(order_id: int, amount: float) -> str:
    # A plain def runs in one of the worker's threads (the job_threads setting).
    return f"invoice-{order_id}.pdf ({amount:.2f})"


@app.cron("* * * * *")  # every minute, in UTC: one run per minute across all workers
async def report() -> None:
    counts = await app.job_queue.counts()
    with redis_errors():
        await app.redis.set(REPORT_KEY, orjson.dumps({"succeeded": counts.succeeded}))


# docs: end app


async def produce(orders: int) -> int:
    async with app:
        receipts = await send_receipt.enqueue_many(
            (n, f"customer-{n}@example.com") for n in range(orders)
        )
        invoices = [
            await render_invoice.enqueue(n, 10.0 * n, after=[receipt])
            for n, receipt in enumerate(receipts)
        ]
        failed = 0
        for handle in [*receipts, *invoices]:
            try:
                print(await handle.result(timeout=60), flush=True)
            except JobFailed as exc:
                print(f"FAILED: {exc}", flush=True)
                failed += 1
    if failed:
        return 1
    print(f"ok: {orders} receipts and {orders} invoices")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="Redis to use (default: STREAMKIT_REDIS_URL)")
    parser.add_argument("--orders", type=int, default=5, help="orders to enqueue jobs for")
    args = parser.parse_args()
    if args.redis_url:
        app.settings = attrs.evolve(app.settings, redis_url=args.redis_url)
    return trio.run(produce, args.orders)


if __name__ == "__main__":
    sys.exit(main())
