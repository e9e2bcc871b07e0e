"""Consuming throughput: records(), take(500) and a bare XREADGROUP + XACK loop.

Run with ``python tests/benchmarks/bench_consume.py`` inside .venv. All three loops
run in one process against the same private redis-server, on the same backlog shape
(``--events`` small records over ``--partitions`` partitions, one worker), and the
figures are printed side by side with their ratios. The bare loop neither decodes nor
fences: it is the transport's ceiling.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

import trio

from streamkit import App, Record
from streamkit._worker import run_worker
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from streamkit._events import Events
    from streamkit._streams import Stream


class Tick(Record):
    symbol: str
    price: float
    volume: int


async def fill(stream: Stream[Tick], n: int) -> None:
    await stream.send_many(Tick(symbol=f"S{i % 500}", price=i / 100, volume=i) for i in range(n))


async def bench_worker(redis_url: str, n: int, partitions: int, mode: str) -> float:
    """One worker (``run_worker``) with one processor with a trivial body."""
    app = App(f"bench{time.monotonic_ns()}", redis_url=redis_url)
    stream = app.stream("ticks", record=Tick, partition_by="symbol", partition_count=partitions)
    done = 0
    finished = trio.Event()

    @app.processor(stream)
    async def process(events: Events[Tick]) -> None:
        nonlocal done
        if mode == "records":
            async for _ in events.records():
                done += 1
                if done == n:
                    finished.set()
        else:
            async for batch in events.take(500, within=0.01):
                done += len(batch)
                if done == n:
                    finished.set()

    async with app:
        await fill(stream, n)
        async with trio.open_nursery() as nursery:
            began = time.perf_counter()
            worker = await nursery.start(run_worker, app)
            await finished.wait()
            elapsed = time.perf_counter() - began
            await worker.stop()
    return n / elapsed


async def bench_bare(app: App, n: int, partitions: int) -> float:
    stream = app.stream(
        f"bare{time.monotonic_ns()}", record=Tick, partition_by="symbol", partition_count=partitions
    )
    await fill(stream, n)
    redis = app.redis
    keys = stream.partition_keys()
    for key in keys:
        await redis.xgroup_create(key, "g", "0", mkstream=True)
    began = time.perf_counter()
    done = 0
    for key in keys:
        while True:
            reply = await redis.xreadgroup("g", "c", streams={key: ">"}, count=500)
            if not reply:
                break
            entries = next(iter(reply.values()))
            await redis.xack(key, "g", [e.identifier for e in entries])
            done += len(entries)
    assert done == n, done
    return n / (time.perf_counter() - began)


async def run(n: int, partitions: int, rounds: int) -> None:
    results: dict[str, list[float]] = {"bare": [], "records": [], "take": []}
    with RedisServer() as server:
        async with App("bench", redis_url=server.url) as app:
            for round_ in range(1, rounds + 1):
                await app.redis.flushall()
                bare = await bench_bare(app, n, partitions)
                await app.redis.flushall()
                records = await bench_worker(server.url, n, partitions, "records")
                await app.redis.flushall()
                take = await bench_worker(server.url, n, partitions, "take")
                for name, value in (("bare", bare), ("records", records), ("take", take)):
                    results[name].append(value)
                print(
                    f"  round {round_}: bare {bare:,.0f}/s | records() {records:,.0f}/s "
                    f"({records / bare:.0%}) | take(500) {take:,.0f}/s ({take / bare:.0%})"
                )
    best = {name: max(values) for name, values in results.items()}
    print(f"consume throughput, {n:,} queued small events, {partitions} partitions, 1 worker")
    print(f"  bare XREADGROUP COUNT 500 + XACK (coredis)  {best['bare']:>9,.0f} events/s")
    print(
        f"  worker, records()                           {best['records']:>9,.0f} events/s "
        f"({best['records'] / best['bare']:.0%} of bare)"
    )
    print(
        f"  worker, take(500)                           {best['take']:>9,.0f} events/s "
        f"({best['take'] / best['bare']:.0%} of bare)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trio.run(run, args.events, args.partitions, args.rounds)


if __name__ == "__main__":
    main()
