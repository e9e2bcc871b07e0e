"""The blocking and asyncio clients against the Trio producer and bare redis-py loops, in one run.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_clients.py`` inside .venv).
On one private redis-server, best of a few rounds each:

* ``send_many`` of 20,000 small records, 8 partitions: the Trio producer, the blocking
  client, the asyncio client, and a bare pipelined redis-py ``XADD`` loop of
  pre-encoded payloads (1,000 per pipeline);
* enqueueing 20,000 jobs (``enqueue_many``): the Trio queue, both clients, and a bare
  pipelined redis-py loop doing the least Redis work a job needs (``HSET`` its record,
  ``XADD`` its id to a ready stream);
* one blocking ``send`` of one record at a time: its latency (p50, p99) against a bare
  redis-py ``XADD`` of a pre-encoded record, on the same kind of client, the two
  alternating send by send.

Targets: the clients' bulk figures within 80% of the Trio producer's and queue's; a
single blocking send within 1.5x of the bare ``XADD``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import redis
import trio

from streamkit import App, Record
from streamkit.testing import RedisServer


class Tick(Record):
    symbol: str
    price: float
    volume: int


def ticks(n: int) -> list[Tick]:
    return [Tick(symbol=f"S{i % 500}", price=i / 100, volume=i) for i in range(n)]


def make_app(url: str, partitions: int) -> tuple[App, Any, Any]:
    app = App("bench", redis_url=url)
    stream = app.stream("ticks", record=Tick, partition_by="symbol", partition_count=partitions)

    @app.job
    async def noop(n: int) -> None: ...

    return app, stream, noop


def flush(url: str) -> None:
    with redis.Redis.from_url(url) as client:
        client.flushall()


# ------------------------------------------------------------------------ send_many


def send_trio(url: str, n: int, partitions: int) -> float:
    app, stream, _ = make_app(url, partitions)
    records = ticks(n)

    async def run() -> float:
        async with app:
            await stream.check_metadata()
            began = time.perf_counter()
            await stream.send_many(records)
            return n / (time.perf_counter() - began)

    return trio.run(run)


def send_blocking(url: str, n: int, partitions: int) -> float:
    app, stream, _ = make_app(url, partitions)
    records = ticks(n)
    with app.blocking() as client:
        client.send(stream, records[0])  # connected, metadata checked
        began = time.perf_counter()
        client.send_many(stream, records)
        return n / (time.perf_counter() - began)


def send_asyncio(url: str, n: int, partitions: int) -> float:
    app, stream, _ = make_app(url, partitions)
    records = ticks(n)

    async def run() -> float:
        async with app.asyncio() as client:
            await client.send(stream, records[0])
            began = time.perf_counter()
            await client.send_many(stream, records)
            return n / (time.perf_counter() - began)

    return asyncio.run(run())


def send_bare(url: str, n: int, partitions: int) -> float:
    payloads = [
        (
            f"bare.{i % partitions}",
            {b"data": b'{"symbol":"S%d","price":%f,"volume":%d}' % (i % 500, i / 100, i)},
        )
        for i in range(n)
    ]
    with redis.Redis.from_url(url) as client:
        client.ping()
        began = time.perf_counter()
        for start in range(0, n, 1000):
            pipe = client.pipeline(transaction=False)
            for key, fields in payloads[start : start + 1000]:
                pipe.xadd(key, fields)
            pipe.execute()
        return n / (time.perf_counter() - began)


# ---------------------------------------------------------------------------- jobs


def enqueue_trio(url: str, n: int, partitions: int) -> float:
    app, _, noop = make_app(url, partitions)

    async def run() -> float:
        async with app:
            await noop.enqueue_many([(0,)])
            began = time.perf_counter()
            await noop.enqueue_many((i,) for i in range(n))
            return n / (time.perf_counter() - began)

    return trio.run(run)


def enqueue_blocking(url: str, n: int, partitions: int) -> float:
    app, _, noop = make_app(url, partitions)
    with app.blocking() as client:
        client.delay(noop, 0)
        began = time.perf_counter()
        client.enqueue_many(noop, ((i,) for i in range(n)))
        return n / (time.perf_counter() - began)


def enqueue_asyncio(url: str, n: int, partitions: int) -> float:
    app, _, noop = make_app(url, partitions)

    async def run() -> float:
        async with app.asyncio() as client:
            await client.delay(noop, 0)
            began = time.perf_counter()
            await client.enqueue_many(noop, ((i,) for i in range(n)))
            return n / (time.perf_counter() - began)

    return asyncio.run(run())


def enqueue_bare(url: str, n: int, partitions: int) -> float:
    with redis.Redis.from_url(url) as client:
        client.ping()
        began = time.perf_counter()
        for start in range(0, n, 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(start + 1000, n)):
                job = f"bare{i:x}"
                pipe.hset(f"bare:job:{job}", mapping={"name": "noop", "args": f"[[{i}],{{}}]"})
                pipe.xadd("bare:q1", {"id": job})
            pipe.execute()
        return n / (time.perf_counter() - began)


# ------------------------------------------------------------------------- latency


def latencies(url: str, n: int, partitions: int) -> tuple[list[float], list[float]]:
    """One blocking send, then one bare ``XADD``, and again: both see the same load."""
    app, stream, _ = make_app(url, partitions)
    records = ticks(n)
    payloads = [
        (
            f"bare.{i % partitions}",
            {b"data": b'{"symbol":"S%d","price":%f,"volume":%d}' % (i % 500, i / 100, i)},
        )
        for i in range(n)
    ]
    ours, bare = [], []
    with app.blocking() as client, redis.Redis.from_url(url) as plain:
        client.send(stream, records[0])  # connected, metadata checked, script loaded
        plain.ping()
        for record, (key, fields) in zip(records, payloads, strict=True):
            began = time.perf_counter()
            client.send(stream, record)
            ours.append(time.perf_counter() - began)
            began = time.perf_counter()
            plain.xadd(key, fields)
            bare.append(time.perf_counter() - began)
    return ours, bare


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--sends", type=int, default=3_000, help="single sends timed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    n, jobs, partitions = args.events, args.jobs, args.partitions
    bulk: dict[str, list[float]] = {}
    enqueue: dict[str, list[float]] = {}
    single: dict[str, list[float]] = {"blocking": [], "bare": []}
    with RedisServer() as server:
        url = server.url
        # Round by round, each contender in turn: load from other work hits all alike.
        for _ in range(args.rounds):
            for name, fn in (
                ("trio", send_trio),
                ("blocking", send_blocking),
                ("asyncio", send_asyncio),
                ("bare", send_bare),
            ):
                flush(url)
                bulk.setdefault(name, []).append(fn(url, n, partitions))
            for name, fn in (
                ("trio", enqueue_trio),
                ("blocking", enqueue_blocking),
                ("asyncio", enqueue_asyncio),
                ("bare", enqueue_bare),
            ):
                flush(url)
                enqueue.setdefault(name, []).append(fn(url, jobs, partitions))
            flush(url)
            ours, bare = latencies(url, args.sends, partitions)
            single["blocking"] += ours
            single["bare"] += bare
    best = {name: max(values) for name, values in bulk.items()}
    best_jobs = {name: max(values) for name, values in enqueue.items()}
    rounds = args.rounds
    print(f"send_many, {n:,} small records, {partitions} partitions, best of {rounds}")
    print(f"  Trio producer (coredis)           {best['trio']:>10,.0f} events/s")
    print(f"  blocking client (redis-py)        {best['blocking']:>10,.0f} events/s")
    print(f"  asyncio client (redis-py)         {best['asyncio']:>10,.0f} events/s")
    print(f"  bare pipelined XADD (redis-py)    {best['bare']:>10,.0f} events/s")
    print(f"  ratio blocking / Trio             {best['blocking'] / best['trio']:>10.2f}")
    print(f"  ratio asyncio / Trio              {best['asyncio'] / best['trio']:>10.2f}")
    print()
    print(f"enqueue_many, {jobs:,} jobs, best of {rounds}")
    print(f"  Trio queue (coredis)              {best_jobs['trio']:>10,.0f} jobs/s")
    print(f"  blocking client (redis-py)        {best_jobs['blocking']:>10,.0f} jobs/s")
    print(f"  asyncio client (redis-py)         {best_jobs['asyncio']:>10,.0f} jobs/s")
    print(f"  bare pipelined HSET+XADD          {best_jobs['bare']:>10,.0f} jobs/s")
    print(f"  ratio blocking / Trio             {best_jobs['blocking'] / best_jobs['trio']:>10.2f}")
    print(f"  ratio asyncio / Trio              {best_jobs['asyncio'] / best_jobs['trio']:>10.2f}")
    print()
    ours, bare = single["blocking"], single["bare"]
    print(f"one blocking send at a time, {len(ours):,} sends, latency in ms")
    print("                                       p50        p99")
    for label, values in (("blocking client send", ours), ("bare redis-py XADD", bare)):
        p50, p99 = percentile(values, 50) * 1000, percentile(values, 99) * 1000
        print(f"  {label:<32} {p50:>8.3f}   {p99:>8.3f}")
    print(
        f"  ratio send / bare XADD           {percentile(ours, 50) / percentile(bare, 50):>8.2f}"
        f"   {percentile(ours, 99) / percentile(bare, 99):>8.2f}"
    )


if __name__ == "__main__":
    main()
