"""send_many throughput against a bare pipelined XADD loop, side by side in one run.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_send.py`` inside .venv).
Both loops use the same coredis client on the same private redis-server; the bare
loop gets its payloads pre-encoded, so it measures only the transport.
"""

from __future__ import annotations

import argparse
import time

import trio

from streamkit import App, Record
from streamkit.testing import RedisServer


class Tick(Record):
    symbol: str
    price: float
    volume: int


def ticks(n: int) -> list[Tick]:
    return [Tick(symbol=f"S{i % 500}", price=i / 100, volume=i) for i in range(n)]


async def bench_send_many(app: App, n: int, partitions: int) -> float:
    stream = app.stream(
        f"ticks{time.monotonic_ns()}",
        record=Tick,
        partition_by="symbol",
        partition_count=partitions,
    )
    records = ticks(n)
    began = time.perf_counter()
    await stream.send_many(records)
    return n / (time.perf_counter() - began)


async def bench_bare_xadd(app: App, n: int, partitions: int, pipeline_size: int) -> float:
    payloads = [
        (
            f"bare.{i % partitions}",
            {b"data": b'{"symbol":"S%d","price":%f,"volume":%d}' % (i % 500, i / 100, i)},
        )
        for i in range(n)
    ]
    redis = app.redis
    began = time.perf_counter()
    for start in range(0, n, pipeline_size):
        async with redis.pipeline(transaction=False) as pipe:
            for key, fields in payloads[start : start + pipeline_size]:
                pipe.xadd(key, fields)
    return n / (time.perf_counter() - began)


async def run(n: int, rounds: int, partitions: int) -> None:
    with RedisServer() as server:
        async with App("bench", redis_url=server.url) as app:
            ours: list[float] = []
            bare: list[float] = []
            for _ in range(rounds):
                await app.redis.flushall()
                ours.append(await bench_send_many(app, n, partitions))
                await app.redis.flushall()
                bare.append(await bench_bare_xadd(app, n, partitions, 1000))
    best_ours, best_bare = max(ours), max(bare)
    print(f"send throughput, {n:,} small records, {partitions} partitions, best of {rounds}")
    print(f"  streamkit send_many          {best_ours:>10,.0f} events/s")
    print(f"  bare pipelined XADD (coredis) {best_bare:>9,.0f} events/s")
    print(f"  ratio send_many / bare        {best_ours / best_bare:>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    trio.run(run, args.events, args.rounds, args.partitions)


if __name__ == "__main__":
    main()
