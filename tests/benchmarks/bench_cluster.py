"""Send and consume throughput on a 3-master Redis Cluster against one redis-server.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_cluster.py`` inside
.venv). Both backends are private and local, started by this script: one
``redis-server``, and a cluster of 3 masters with a replica each (6 ``redis-server``
processes on the same machine). On a machine with 2 cores the cluster cannot be
faster; the point is the shape: that everything works on it, and what the cluster
client costs per operation.

* **send_many**: the records of a window sent per partition and chunk, pipelined.
* **send, one record**: one ``send`` at a time, awaited: the round trip of one append
  (the idempotent append script), median over many.
* **consume, 2 workers**: a backlog processed by two ``streamkit worker`` processes
  (``tests.apps.bench_count``, ``take(500)``, one ``INCRBY`` per batch), timed from
  the first counted batch to the last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from streamkit import App, Record, open_redis
from streamkit.testing import RedisCluster, RedisServer

if TYPE_CHECKING:
    from streamkit import Stream

ROOT = Path(__file__).resolve().parent.parent.parent
# The workers' counter (see tests/apps/bench_count.py).
DONE = "bench:done"


class Tick(Record):
    """The record of tests/apps/bench_count.py (the same name and fields)."""

    symbol: str
    price: float
    volume: int


def records(n: int) -> list[Tick]:
    return [Tick(symbol=f"S{i % 500}", price=i / 100, volume=i) for i in range(n)]


async def flush(url: str, nodes: list[RedisServer]) -> None:
    for node in nodes or []:
        async with open_redis(node.url) as redis:
            if (await redis.role()).role == "master":
                await redis.flushall()
    if not nodes:
        async with open_redis(url) as redis:
            await redis.flushall()


def stream_of(app: App, partitions: int) -> Stream[Tick]:
    return app.stream("ticks", record=Tick, partition_by="symbol", partition_count=partitions)


async def bench_send_many(url: str, n: int, partitions: int) -> float:
    async with App("benchcount", redis_url=url) as app:
        stream = stream_of(app, partitions)
        batch = records(n)
        began = time.perf_counter()
        await stream.send_many(batch)
        return n / (time.perf_counter() - began)


async def bench_send_one(url: str, n: int, partitions: int) -> float:
    """Median seconds of one awaited send of one record."""
    async with App("benchcount", redis_url=url) as app:
        stream = stream_of(app, partitions)
        times = []
        for record in records(n):
            began = time.perf_counter()
            await stream.send(record)
            times.append(time.perf_counter() - began)
        return statistics.median(times)


def start_workers(url: str, partitions: int) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "STREAMKIT_REDIS_URL": url, "BENCH_PARTITIONS": str(partitions)}
    return [
        subprocess.Popen(
            [sys.executable, "-m", "streamkit", "worker", "tests.apps.bench_count:app"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.wait(30)


async def bench_consume(url: str, n: int, partitions: int) -> float:
    async with App("benchcount", redis_url=url) as app:
        await stream_of(app, partitions).send_many(records(n))
        workers = start_workers(url, partitions)
        try:
            first = last = 0.0
            counted = 0
            with trio.fail_after(300):
                while counted < n:
                    counted = int(await app.redis.get(DONE) or 0)
                    now = time.perf_counter()
                    if counted and not first:
                        first, first_count = now, counted
                    last = now
                    await trio.sleep(0.005)
        finally:
            await trio.to_thread.run_sync(stop_workers, workers)
    return (n - first_count) / (last - first) if last > first else float("nan")


async def measure(url: str, nodes: list[RedisServer], args: argparse.Namespace) -> dict[str, float]:
    results: dict[str, list[float]] = {"send_many": [], "send_one": [], "consume": []}
    for _ in range(args.rounds):
        await flush(url, nodes)
        results["send_many"].append(await bench_send_many(url, args.events, args.partitions))
        await flush(url, nodes)
        results["send_one"].append(await bench_send_one(url, args.single, args.partitions))
        await flush(url, nodes)
        results["consume"].append(await bench_consume(url, args.events, args.partitions))
    return {
        "send_many": max(results["send_many"]),
        "send_one": min(results["send_one"]),
        "consume": max(results["consume"]),
    }


async def run(args: argparse.Namespace) -> None:
    async with trio.open_nursery() as nursery:
        server: RedisServer = await nursery.start(RedisServer().run)
        cluster: RedisCluster = await nursery.start(RedisCluster().run)
        one = await measure(server.url, [], args)
        many = await measure(cluster.url, cluster.nodes, args)
        nursery.cancel_scope.cancel()
    print(
        f"cluster against one server, {args.events:,} small records, {args.partitions} "
        f"partitions, best of {args.rounds}"
    )
    print(f"  {'':32} {'one server':>12} {'3-master cluster':>18} {'cluster/server':>15}")
    rows = [
        ("send_many, events/s", one["send_many"], many["send_many"], "{:,.0f}"),
        ("send one record, median ms", one["send_one"] * 1e3, many["send_one"] * 1e3, "{:.3f}"),
        ("consume, 2 workers, events/s", one["consume"], many["consume"], "{:,.0f}"),
    ]
    for name, a, b, form in rows:
        print(f"  {name:32} {form.format(a):>12} {form.format(b):>18} {b / a:>15.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--single", type=int, default=2_000, help="sends of one record")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=12)
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
