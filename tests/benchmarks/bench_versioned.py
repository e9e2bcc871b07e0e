"""Versioned tables: a processor's ``await table.put(key, value, at=...)`` against a
plain table's ``table.set(key, value)``, side by side in one run.

``python tests/benchmarks/bench_versioned.py [--events N] [--keys K] [--rounds R]``
(inside .venv): one private redis-server, one worker (``run_worker``), a backlog of
``N`` updates of ``K`` keys over 8 partitions (each key's updates an hour apart by
event time, a day of retention: about 24 versions a key kept), timed from the worker's
start until every update is acknowledged; rounds alternate plain and versioned.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import trio

from streamkit import App, Events, Record, open_redis, run_worker
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from streamkit import Table
    from streamkit.lowlevel import VersionedTable

PARTITIONS = 8


class Rate(Record):
    currency: str
    rate: float
    at: float


async def one(url: str, n: int, keys: int, *, versioned: bool) -> float:
    """Updates per second of one worker writing them to a table."""
    app = App(f"v{time.monotonic_ns()}", redis_url=url)
    rates = app.stream("rates", record=Rate, partition_by="currency", partition_count=PARTITIONS)
    if versioned:
        history: VersionedTable[float] = app.versioned_table(
            "history", value=float, retention=timedelta(days=1)
        )

        @app.processor(rates, tables=[history])
        async def keep(events: Events[Rate]) -> None:
            async for update in events.records():
                await history.put(update.currency, update.rate, at=update.at)

    else:
        latest: Table[float] = app.table("latest", value=float)

        @app.processor(rates, tables=[latest])
        async def keep(events: Events[Rate]) -> None:
            async for update in events.records():
                latest.set(update.currency, update.rate)

    async with app, open_redis(url) as redis:
        per_key = max(1, n // keys)
        await rates.send_many(
            [
                Rate(currency=f"c{i % keys}", rate=i / 7, at=1.7e9 + (i // keys) * 3600)
                for i in range(per_key * keys)
            ]
        )
        began = time.perf_counter()
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            while True:
                left = 0
                for p in range(PARTITIONS):
                    groups: Any = await redis.xinfo_groups(rates.key(p))
                    left += sum(int(g[b"pending"]) + int(g.get(b"lag") or 0) for g in groups)
                    left += 0 if groups else 1
                if left == 0:
                    break
                await trio.sleep(0.02)
            seconds = time.perf_counter() - began
            await worker.stop()
    return per_key * keys / seconds


async def run(args: argparse.Namespace) -> None:
    print(
        f"\nVersioned tables: {args.events:,} updates of {args.keys:,} keys over "
        f"{PARTITIONS} partitions, one worker, {args.rounds} rounds each, alternating\n"
    )
    rates: dict[str, list[float]] = {"plain": [], "versioned": []}
    with RedisServer() as server:
        for _ in range(args.rounds):
            for kind in rates:
                rates[kind].append(
                    await one(server.url, args.events, args.keys, versioned=kind == "versioned")
                )
    for kind, figures in rates.items():
        shown = ", ".join(f"{f:,.0f}" for f in figures)
        print(f"  {kind:<10} updates/s: {shown}")
    ratio = max(rates["versioned"]) / max(rates["plain"])
    print(f"\n  versioned / plain (best rounds): {ratio:.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=2)
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
