"""Joins: a stream-stream join against stateless processing and a table count.

One private redis-server, one worker (``run_worker``), the same kind of backlog for
each variant, timed from the first event to the last:

* **stateless**: a ``records()`` processor with a trivial body, over the
  ``2 x --events`` events of both sides sent to one stream;
* **table count**: ``records()`` counting per key in a table, exactly once, over the
  same;
* **join**: ``--events`` orders and as many payments (each order paid once, within
  the window), over ``--partitions`` partitions, joined within 10 minutes of event
  time: the join's two forwarders and the join itself run in the one worker; timed
  from the first event forwarded to the last pair emitted (by their entry ids, so the
  worker's start-up is left out, as the others leave it out), in input events per
  second.

**Target: the join at least 25% of stateless.** Then the memory of the buffers: the
join's hashes and index (``MEMORY USAGE``) divided by the events they hold, in bytes
per buffered event, with records like the bench's (an int id and a time).
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import Any

import trio

from streamkit import App, Events, Record, open_redis, run_worker
from streamkit.testing import RedisServer

T0 = 1_767_225_600.0


class Order(Record):
    order_id: int
    at: float


class Payment(Record):
    order_id: int
    at: float


async def bench_plain(url: str, n: int, partitions: int, *, table: bool) -> float:
    """Events/s of ``records()`` (counting in a table with ``table``) over ``n`` events."""
    app = App(f"p{time.monotonic_ns()}", redis_url=url)
    stream = app.stream("orders", record=Order, partition_by="order_id", partition_count=partitions)
    counts = app.table("counts", value=int, default=0)
    done = 0
    first = last = 0.0
    finished = trio.Event()

    def tick() -> None:
        nonlocal done, first, last
        if not done:
            first = time.perf_counter()
        done += 1
        if done == n:
            last = time.perf_counter()
            finished.set()

    if table:

        @app.processor(stream, tables=[counts])
        async def counting(events: Events[Order]) -> None:
            async for order in events.records():
                counts.set(order.order_id, await counts.get(order.order_id) + 1)
                tick()

    else:

        @app.processor(stream)
        async def stateless(events: Events[Order]) -> None:
            async for _ in events.records():
                tick()

    async with app:
        await stream.send_many([Order(order_id=i, at=T0 + i / 1000) for i in range(n)])
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            await finished.wait()
            await worker.stop()
    return (n - 1) / (last - first)


async def bench_join(url: str, n: int, partitions: int) -> tuple[float, float]:
    """Input events/s of an inner join of ``n`` orders and ``n`` payments, and the
    buffers' bytes per buffered event."""
    app = App(f"j{time.monotonic_ns()}", redis_url=url)
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=partitions)
    payments = app.stream(
        "payments", record=Payment, partition_by="order_id", partition_count=partitions
    )
    paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"], partition_count=8)
    join = app.join(
        "paid_orders",
        orders,
        payments,
        within=timedelta(minutes=10),
        output=paid,
        left_time="at",
        right_time="at",
        idle=False,
    )
    async with app, open_redis(url) as redis:
        await orders.send_many([Order(order_id=i, at=T0 + i / 1000) for i in range(n)])
        await payments.send_many([Payment(order_id=i, at=T0 + i / 1000 + 1) for i in range(n)])
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            while True:
                emitted = 0
                for p in range(paid.partition_count):
                    emitted += await redis.xlen(paid.key(p))
                if emitted >= n:
                    break
                await trio.sleep(0.02)
            await worker.stop()
        # From the first event forwarded to the last pair emitted, by their entry ids
        # (Redis's clock, in ms): the worker's start-up and this loop's polling left out.
        inner = app.streams[f"{join.name}__in"]
        firsts: list[int] = []
        lasts: list[int] = []
        for p in range(partitions):
            head: Any = await redis.xrange(inner.key(p), count=1)
            firsts.extend(int(entry.identifier.split(b"-")[0]) for entry in head)
        for p in range(paid.partition_count):
            tail: Any = await redis.xrevrange(paid.key(p), count=1)
            lasts.extend(int(entry.identifier.split(b"-")[0]) for entry in tail)
        seconds = (max(lasts) - min(firsts)) / 1000
        memory = 0
        for p in range(partitions):
            for key in (join.key(p), join.index_key(p)):
                usage: Any = await redis.memory_usage(key, samples=0)
                memory += int(usage or 0)
    return 2 * n / seconds, memory / (2 * n)


async def run(args: argparse.Namespace) -> None:
    n, partitions = args.events, args.partitions
    print(
        f"\nJoins: {n:,} orders and {n:,} payments over {partitions} partitions, joined "
        f"within 10 minutes; one worker; best of {args.rounds} rounds\n"
    )
    best: dict[str, float] = {}
    per_event = 0.0
    with RedisServer() as server:
        for _ in range(args.rounds):
            for variant in ("stateless", "table", "join"):
                async with open_redis(server.url) as redis:
                    await redis.flushall()
                if variant == "join":
                    rate, per_event = await bench_join(server.url, n, partitions)
                else:
                    rate = await bench_plain(
                        server.url, 2 * n, partitions, table=variant == "table"
                    )
                best[variant] = max(best.get(variant, 0.0), rate)
    stateless = best["stateless"]
    titles = {
        "stateless": "stateless records()",
        "table": "table count (exactly once)",
        "join": "stream-stream join (exactly once)",
    }
    print(f"  {'':<38}{'events/s':>10}{'vs stateless':>14}")
    for variant, title in titles.items():
        print(f"  {title:<38}{best[variant]:>10,.0f}{best[variant] / stateless:>13.0%}")
    join = best["join"]
    print(
        f"\n  Target: the join >= 25% of stateless: "
        f"{'met' if join >= 0.25 * stateless else 'NOT met'} ({join / stateless:.0%})"
    )
    print(f"  Buffers: {per_event:,.0f} bytes per buffered event (records of an int and a time)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    trio.run(run, args)


if __name__ == "__main__":
    main()
