"""A Trio service that runs a streamkit worker and serves its Prometheus metrics.

The service runs the worker of an app with one processor, beside the HTTP endpoint of
``streamkit.metrics.serve_metrics``; a metric of the service's own (a prometheus-client
``Counter``) is served by the same endpoint, since both use prometheus-client's default
registry. The demo sends some orders, waits until the endpoint shows them all
processed and the lag back to zero, prints what it scraped, and stops.

Run it on its own (it starts a private ``redis-server``)::

    python examples/metrics_service.py

or against a server of yours, on a port of your choice (``curl localhost:9100`` shows
the metrics while it runs; ``--linger`` keeps it running that many seconds)::

    python examples/metrics_service.py --redis-url redis://localhost:6379 --port 9100

Needs the ``metrics`` extra: ``pip install 'streamkit[metrics]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import urllib.request
from typing import TYPE_CHECKING

import trio
from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families

import streamkit
from streamkit.metrics import serve_metrics
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator


class Order(streamkit.Record):
    order_id: int
    customer: str
    amount: float


# docs: start service
app = streamkit.App("metrics_demo")
orders = app.stream("orders", record=Order, partition_by="customer", partition_count=4)
# A metric of the service's own, in prometheus-client's default registry.
revenue = Counter("metrics_demo_revenue", "Amount of the orders billed")


@app.processor(orders)
async def bill(events: streamkit.Events[Order]) -> None:
    async for batch in events.take(100, within=0.05):
        revenue.inc(sum(order.amount for order in batch))


async def run_service(
    port: int, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run the worker and its metrics endpoint until cancelled; start with its URL."""
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(streamkit.run_worker, app)
        # Lag and queue depths are read from Redis every second here (5 s by default).
        url = await nursery.start(
            functools.partial(serve_metrics, worker, port=port, refresh_interval=1.0)
        )
        task_status.started(url)


# docs: end service


def scrape(url: str) -> dict[str, float]:
    """The sum of each sample of the endpoint's metrics, over their labels."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


async def demo(url: str, count: int, port: int, linger: float) -> int:
    app.settings = streamkit.Settings.from_env(redis_url=url)
    async with app, trio.open_nursery() as nursery:
        await orders.send_many(
            Order(order_id=n, customer=f"customer-{n % 7}", amount=1.0) for n in range(count)
        )
        endpoint = await nursery.start(run_service, port)
        print(f"serving metrics on {endpoint}")
        with trio.move_on_after(30):
            while True:
                sums = await trio.to_thread.run_sync(scrape, endpoint)
                done = sums.get("streamkit_events_processed_total", 0) == count
                lag = sums.get("streamkit_partition_lag", -1) + sums.get(
                    "streamkit_partition_pending", -1
                )
                if done and lag == 0:
                    break
                await trio.sleep(0.2)
        for name in (
            "streamkit_events_processed_total",
            "streamkit_partition_lag",
            "streamkit_partition_pending",
            "streamkit_partitions_owned",
            "streamkit_batch_duration_seconds_count",
            "metrics_demo_revenue_total",
        ):
            print(f"{name} {sums.get(name, float('nan')):g}")
        await trio.sleep(linger)
        nursery.cancel_scope.cancel()
    if not (done and lag == 0 and sums.get("metrics_demo_revenue_total") == count):
        print("FAILED")
        return 1
    print("ok: every order processed, lag and pending back to zero")
    return 0


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    if given:
        yield given
    else:
        with RedisServer() as server:
            yield server.url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="Redis to use (default: start a private one)")
    parser.add_argument("--orders", type=int, default=200, help="orders to send and bill")
    parser.add_argument("--port", type=int, default=0, help="metrics port (default: any free)")
    parser.add_argument("--linger", type=float, default=0, help="seconds to keep serving")
    args = parser.parse_args()
    with redis_url(args.redis_url) as url:
        return trio.run(demo, url, args.orders, args.port, args.linger)


if __name__ == "__main__":
    sys.exit(main())
