"""send_many throughput against the limit of one Python process, side by side in one run.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_send.py`` inside .venv).
Every loop runs in this one process against the same private redis-server, with the
same records over the same partitions:

* **hiredis limit**: the records encoded beforehand by the stream's own codec and
  partitioner (encoding is not timed), then appended with one ``XADD`` each, packed by
  ``hiredis.pack_command`` and written on a ``trio.open_tcp_stream`` socket,
  ``--pipeline`` commands per round trip, replies parsed by ``hiredis.Reader``. About as
  lean as a Python loop gets: the limit for one Python process. Skipped, with a note,
  when ``hiredis`` (a dev dependency) is not installed.
* **bare coredis**: the same pre-encoded appends through a coredis pipeline of
  ``--pipeline`` ``XADD`` commands, for reference.
* **send_many**: ``Stream.send_many`` of the records, encoding, routing, idempotent
  appends (one script call per partition and chunk) and all.

Target: ``send_many`` at least 75% of the hiredis limit loop. **Redis's CPU per event**
(``INFO cpu`` of redis-server, user + system, around each loop): ``send_many``'s at most
1.25x the pipelined ``XADD`` loop's, measured in the same round, and the events per
second one Redis core appends at that cost.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import statistics
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, cast

import trio

from streamkit import App, Record
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from streamkit import Stream

#: send_many's share of the hiredis limit loop.
TARGET = 0.75
#: Redis CPU per event of send_many, at most this multiple of the pipelined XADD's.
REDIS_TARGET = 1.25


class Tick(Record):
    symbol: str
    price: float
    volume: int


def ticks(n: int) -> list[Tick]:
    return [Tick(symbol=f"S{i % 500}", price=i / 100, volume=i) for i in range(n)]


def _stream(app: App, name: str, partitions: int) -> Stream[Tick]:
    return app.stream(
        f"{name}{time.monotonic_ns()}",
        record=Tick,
        partition_by="symbol",
        partition_count=partitions,
    )


def encoded(stream: Stream[Tick], records: list[Tick]) -> list[tuple[bytes, list[bytes]]]:
    """Each record's partition key and flat fields, as the stream would append them."""
    keys = [key.encode() for key in stream.partition_keys()]
    return [
        (
            keys[stream.partition_of(record)],
            list(itertools.chain.from_iterable(stream.codec.encode(record).items())),
        )
        for record in records
    ]


async def bench_send_many(app: App, n: int, partitions: int) -> float:
    stream = _stream(app, "ticks", partitions)
    records = ticks(n)
    await stream.check_metadata()  # connect and check once, as a busy producer has
    began = time.perf_counter()
    await stream.send_many(records)
    return n / (time.perf_counter() - began)


async def bench_bare_xadd(app: App, n: int, partitions: int, pipeline_size: int) -> float:
    """Pre-encoded XADDs through coredis pipelines of ``pipeline_size`` commands."""
    payloads = encoded(_stream(app, "bare", partitions), ticks(n))
    redis = app.redis
    began = time.perf_counter()
    for start in range(0, n, pipeline_size):
        async with redis.pipeline(transaction=False) as pipe:
            for key, flat in payloads[start : start + pipeline_size]:
                pipe.xadd(key, dict(zip(flat[::2], flat[1::2], strict=True)))
    return n / (time.perf_counter() - began)


async def bench_hiredis(app: App, url: str, n: int, partitions: int, pipeline_size: int) -> float:
    """Pre-encoded XADDs packed by hiredis, ``pipeline_size`` per round trip on a socket."""
    import hiredis  # optional: the bench runs without it

    payloads = encoded(_stream(app, "hiredis", partitions), ticks(n))
    pack = hiredis.pack_command
    parts = urllib.parse.urlsplit(url)
    sock = await trio.open_tcp_stream(parts.hostname or "127.0.0.1", parts.port or 6379)
    reader = hiredis.Reader()
    began = time.perf_counter()
    async with sock:
        for start in range(0, n, pipeline_size):
            group = payloads[start : start + pipeline_size]
            packed = [pack(cast("Any", (b"XADD", key, b"*", *flat))) for key, flat in group]
            await sock.send_all(b"".join(packed))
            replies = 0
            while replies < len(group):
                reply = reader.gets()
                if reply is False:
                    data = await sock.receive_some(1 << 20)
                    if not data:
                        raise ConnectionError("redis closed the connection")
                    reader.feed(data)
                elif isinstance(reply, hiredis.ReplyError):
                    raise reply
                else:
                    replies += 1
    return n / (time.perf_counter() - began)


async def redis_cpu(app: App) -> float:
    """CPU seconds redis-server has used so far (user and system)."""
    info = await app.redis.info("cpu")
    return sum(float(str(info[name])) for name in ("used_cpu_user", "used_cpu_sys"))


async def server_cost(app: App, n: int, loop: Any) -> tuple[float, float]:
    """Run ``loop`` (an awaitable returning events/s); return that rate and Redis's CPU
    seconds per event while it ran."""
    before = await redis_cpu(app)
    rate = await loop
    return rate, (await redis_cpu(app) - before) / n


def hiredis_available() -> bool:
    return importlib.util.find_spec("hiredis") is not None


async def run(n: int, rounds: int, partitions: int, pipeline_size: int) -> None:
    with_hiredis = hiredis_available()
    results: dict[str, list[float]] = {"hiredis": [], "coredis": [], "send_many": []}
    busy: dict[str, list[float]] = {"hiredis": [], "send_many": []}
    with RedisServer() as server:
        async with App("bench", redis_url=server.url) as app:
            for round_ in range(1, rounds + 1):
                if with_hiredis:
                    await app.redis.flushall()
                    rate, cost = await server_cost(
                        app, n, bench_hiredis(app, server.url, n, partitions, pipeline_size)
                    )
                    results["hiredis"].append(rate)
                    busy["hiredis"].append(cost)
                await app.redis.flushall()
                results["coredis"].append(await bench_bare_xadd(app, n, partitions, pipeline_size))
                await app.redis.flushall()
                rate, cost = await server_cost(app, n, bench_send_many(app, n, partitions))
                results["send_many"].append(rate)
                busy["send_many"].append(cost)
                line = " | ".join(
                    f"{name} {values[-1]:,.0f}/s" for name, values in results.items() if values
                )
                print(f"  round {round_}: {line}", flush=True)
    best = {name: max(values) for name, values in results.items() if values}
    limit = best.get("hiredis")
    print(f"send throughput, {n:,} small records, {partitions} partitions, best of {rounds} rounds")
    print(f"  {'':<46}{'events/s':>10}{'vs limit':>11}")

    def row(label: str, value: float, note: str = "") -> None:
        ratio = f"{value / limit:>11.0%}" if limit else f"{'-':>11}"
        print(f"  {label:<46}{value:>10,.0f}{ratio}  {note}".rstrip())

    if limit:
        row(f"hiredis limit: XADD, {pipeline_size} per round trip", limit)
    row(f"bare coredis pipelined XADD, {pipeline_size} per pipeline", best["coredis"])
    row("streamkit send_many", best["send_many"], f"target >= {TARGET:.0%} of the limit")
    if limit:
        median = statistics.median(
            ours / bare for ours, bare in zip(results["send_many"], results["hiredis"], strict=True)
        )
        print(f"  median of per-round ratios send_many / limit: {median:.0%}")
        ratio = statistics.median(
            ours / bare for ours, bare in zip(busy["send_many"], busy["hiredis"], strict=True)
        )
        bare_us = statistics.median(busy["hiredis"]) * 1e6
        ours_us = statistics.median(busy["send_many"]) * 1e6
        verdict = "met" if ratio <= REDIS_TARGET else "NOT met"
        print(
            f"  redis-server CPU per event (median of {rounds} rounds; INFO cpu, user + sys):"
            f" pipelined XADD {bare_us:.2f} us ({1e6 / bare_us:,.0f} events/s per Redis core),"
            f" send_many {ours_us:.2f} us ({1e6 / ours_us:,.0f} events/s per Redis core):"
            f" {ratio:.2f}x, target <= {REDIS_TARGET:.2f}x: {verdict}"
        )
    else:
        print("  (hiredis is not installed: no limit loop; it is in the dev extra)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--pipeline", type=int, default=1000, help="XADDs per round trip")
    args = parser.parse_args()
    trio.run(run, args.events, args.rounds, args.partitions, args.pipeline)


if __name__ == "__main__":
    main()
