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
from typing import TYPE_CHECKING, Any

import trio

from streamkit import App, Record, open_lock_manager
from streamkit._fetcher import open_fetcher
from streamkit._keys import partition_lock_name, processor_group
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


async def bench_streamkit(app: App, n: int, partitions: int, mode: str) -> float:
    stream = app.stream(
        f"ticks{time.monotonic_ns()}",
        record=Tick,
        partition_by="symbol",
        partition_count=partitions,
    )
    await fill(stream, n)
    group = processor_group(app.name, stream.name, "bench")
    done = 0
    finished = trio.Event()

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

    async with (
        open_lock_manager(app.redis) as locks,
        open_fetcher(app.redis, stream, group=group) as fetcher,
    ):

        async def run_partition(partition: int, task_status: Any) -> None:
            name = partition_lock_name(app.name, stream.name, "bench", partition)
            async with (
                locks.hold(name, ttl=30) as held,
                fetcher.partition(partition, held) as events,
            ):
                task_status.started()
                await process(events)

        async with trio.open_nursery() as nursery:
            for partition in range(partitions):
                await nursery.start(run_partition, partition)
            began = time.perf_counter()
            await finished.wait()
            elapsed = time.perf_counter() - began
            nursery.cancel_scope.cancel()
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
    with RedisServer() as server:
        async with App("bench", redis_url=server.url) as app:
            for round_ in range(1, rounds + 1):
                bare = await bench_bare(app, n, partitions)
                records = await bench_streamkit(app, n, partitions, "records")
                take = await bench_streamkit(app, n, partitions, "take")
                print(
                    f"round {round_}: bare XREADGROUP+XACK {bare:,.0f}/s | "
                    f"records() {records:,.0f}/s ({records / bare:.0%}) | "
                    f"take(500) {take:,.0f}/s ({take / bare:.0%})"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trio.run(run, args.events, args.partitions, args.rounds)


if __name__ == "__main__":
    main()
