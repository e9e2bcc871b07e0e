"""Consume a stream in your own Trio service: lock manager + fetcher + events, no App.

The stream is a :class:`StreamSpec`: its name, record and partitioning, no connection.
An ``App`` only sends some orders (the producer side). Consuming is done by hand: for
each partition, hold its lease with the lock manager, register it with the fetcher and
run a processor over its events under an exception policy. Once every order was
processed the partitions are drained: each processor finishes the event at hand,
acknowledges it and returns.

Run it on its own (it starts a private ``redis-server``)::

    python examples/fetch_without_app.py

or against a server of yours::

    python examples/fetch_without_app.py --redis-url redis://localhost:6379 --orders 100
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Any

import trio
import trio_util

from streamkit import (
    App,
    Events,
    ExceptionPolicy,
    Fetcher,
    LockManager,
    Record,
    Redis,
    StreamSpec,
    open_fetcher,
    open_lock_manager,
    open_redis,
    run_processor,
)
from streamkit.lowlevel import redis_errors
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator


class Order(Record):
    order_id: int
    customer: str
    amount: float


# docs: start spec
orders = StreamSpec(
    app="fetch_demo", name="orders", record=Order, partition_by="customer", partition_count=4
)
printer_keys = orders.processor("printer")  # its consumer group, lock names, dead letters
# docs: end spec


# docs: start consume
processed = trio_util.AsyncValue(0)  # orders processed so far, for serve() to wait on


async def printer(events: Events[Order]) -> None:
    """The processor: called for one partition, sees its events in order."""
    async for order in events.records():
        print(f"partition {events.partition}: order {order.order_id} of {order.customer}")
        processed.value += 1


async def consume(
    redis: Redis,
    locks: LockManager,
    fetcher: Fetcher[Order],
    partition: int,
    draining: trio_util.AsyncBool,
) -> None:
    """Own one partition: hold its lease, fetch its events, run the processor on them."""
    policy = ExceptionPolicy(action="retry", retries=3, on_exhausted="dead_letter")
    async with (
        # Every read and acknowledgement is fenced by this lease.
        locks.hold(printer_keys.lock_name(partition), ttl=10) as held,
        fetcher.partition(partition, held) as feed,
    ):
        # Dead letters are written with `redis`; `draining` makes printer() return.
        await run_processor(printer, feed, policy, redis=redis, draining=draining)


async def serve(url: str, until: int) -> None:
    """Consume every partition until ``until`` orders were processed, then drain."""
    draining = trio_util.AsyncBool(False)
    async with (
        open_redis(url) as redis,
        open_lock_manager(redis) as locks,
        open_fetcher(redis, orders, group=printer_keys, batch_size=100) as fetcher,
        trio.open_nursery() as nursery,
    ):
        for partition in range(orders.partition_count):
            nursery.start_soon(consume, redis, locks, fetcher, partition, draining)
        await processed.wait_value(lambda n: n >= until)
        draining.value = True  # each processor returns after the event at hand


# docs: end consume


async def demo(url: str, count: int) -> int:
    # The producer side: an App binds the same stream to a connection.
    app = App(orders.app, redis_url=url)
    producer = app.stream(
        orders.name, record=Order, partition_by="customer", partition_count=orders.partition_count
    )
    async with app:
        await producer.send_many(
            Order(order_id=n, customer=f"customer-{n % 5}", amount=float(n)) for n in range(count)
        )
    with trio.fail_after(30):
        await serve(url, count)
    async with open_redis(url) as redis:
        pending = 0
        for key in orders.partition_keys():
            with redis_errors():
                summary: Any = await redis.xpending(key, printer_keys.group)
            pending += summary.pending
    print(f"processed {processed.value} orders, {pending} pending")
    if processed.value != count or pending:
        print("FAILED")
        return 1
    print("ok: every order was processed and acknowledged")
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
    parser.add_argument("--orders", type=int, default=20, help="orders to send and process")
    args = parser.parse_args()
    with redis_url(args.redis_url) as url:
        return trio.run(demo, url, args.orders)


if __name__ == "__main__":
    sys.exit(main())
