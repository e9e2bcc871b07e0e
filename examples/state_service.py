"""Exactly-once state in your own Trio service: tables and outputs without App.

The stream, the table and the output stream are values (a :class:`StreamSpec` and a
:class:`Table` bound to it); consuming is done by hand as in
``examples/fetch_without_app.py``, and ``run_processor`` is given the table and the
output: the processor's table writes and emitted records are committed with the
acknowledgement of the orders behind them, by one fenced script, exactly once.

Run it on its own (it starts a private ``redis-server``)::

    python examples/state_service.py

or against a server of yours::

    python examples/state_service.py --redis-url redis://localhost:6379 --orders 100
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

import trio
import trio_util

from streamkit import (
    App,
    Events,
    Fetcher,
    LockManager,
    Record,
    Redis,
    StreamSpec,
    Table,
    open_fetcher,
    open_lock_manager,
    open_redis,
    run_processor,
)
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator


class Order(Record):
    order_id: int
    customer: str
    amount: float


class Receipt(Record):
    customer: str
    order_id: int
    total: float


# docs: start values
orders = StreamSpec(
    app="state_demo", name="orders", record=Order, partition_by="customer", partition_count=4
)
receipts = StreamSpec(
    app="state_demo", name="receipts", record=Receipt, partition_by="customer", partition_count=2
)
keys = orders.processor("totals")
# The table lives beside the stream it is written from, partition by partition.
totals: Table[float] = Table("totals", float, 0.0, stream=orders, processor=keys.processor)
# docs: end values

processed = trio_util.AsyncValue(0)


# docs: start processor
async def keep_totals(events: Events[Order]) -> None:
    async for order in events.records():
        total = await totals.get(order.customer) + order.amount
        totals.set(order.customer, total)
        events.emit(
            receipts, Receipt(customer=order.customer, order_id=order.order_id, total=total)
        )
        processed.value += 1


async def consume(
    redis: Redis,
    locks: LockManager,
    fetcher: Fetcher[Order],
    partition: int,
    draining: trio_util.AsyncBool,
) -> None:
    async with (
        locks.hold(keys.lock_name(partition), ttl=10) as held,
        fetcher.partition(partition, held) as feed,
    ):
        await run_processor(
            keep_totals,
            feed,
            redis=redis,
            draining=draining,
            tables=[totals],
            outputs=[receipts],
        )


# docs: end processor


async def serve(url: str, until: int) -> None:
    draining = trio_util.AsyncBool(False)
    async with (
        open_redis(url) as redis,
        open_lock_manager(redis) as locks,
        open_fetcher(redis, orders, group=keys) as fetcher,
        trio.open_nursery() as nursery,
    ):
        for partition in range(orders.partition_count):
            nursery.start_soon(consume, redis, locks, fetcher, partition, draining)
        await processed.wait_value(lambda n: n >= until)
        draining.value = True


async def demo(url: str, count: int) -> int:
    app = App(orders.app, redis_url=url)
    producer = app.stream(
        orders.name, record=Order, partition_by="customer", partition_count=orders.partition_count
    )
    sent = [Order(order_id=n, customer=f"customer-{n % 5}", amount=float(n)) for n in range(count)]
    async with app:
        await producer.send_many(sent)
    with trio.fail_after(30):
        await serve(url, count)
    expected: dict[str, float] = {}
    for order in sent:
        expected[order.customer] = expected.get(order.customer, 0.0) + order.amount
    async with open_redis(url) as redis:
        # docs: start read
        committed = {key: value async for key, value in totals.items(redis=redis)}
        # docs: end read
        emitted = sum([await redis.xlen(receipts.key(p)) for p in range(2)])
    print(f"totals: {dict(sorted(committed.items()))}")
    print(f"receipts emitted: {emitted}")
    if committed != expected or emitted != count:
        print("FAILED")
        return 1
    print("ok: every order counted once, one receipt each")
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
