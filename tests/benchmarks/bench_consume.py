"""Consuming throughput: records() and take(500) against the limit of one Python process.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_consume.py`` inside .venv).
Every loop runs in this one process against the same private redis-server, on the same
backlog shape (``--events`` small records over ``--partitions`` partitions), and the
figures are printed side by side with their ratios:

* **hiredis limit**: ``XREADGROUP COUNT 500`` + ``XACK`` per partition written by hand in
  RESP on a ``trio.open_tcp_stream`` socket, replies parsed by ``hiredis.Reader``, one
  round trip for all partitions (each partition's ``XACK`` of its previous batch
  pipelined with its next ``XREADGROUP``). About as lean as a Python loop gets: the
  limit for one Python process. It neither decodes nor fences.
* **hiredis limit, decoding**: the same loop, also turning every entry into the same
  typed record ``records()`` hands out, as fast as it can be written by hand: ``orjson``
  and a constructor call generated for the record's fields, no checks. The yardstick
  of the targets below. Both are skipped, with a note, when ``hiredis`` (a dev
  dependency) is not installed.
* **bare coredis**: the same reads and acknowledgements on the coredis client
  streamkit's Trio side is built on, one command at a time, for reference.
* **records()** and **take(500)**: one worker (``run_worker``), one processor with a
  trivial body. Timed from the first event the processor sees to the last, so the
  worker's start-up (joining, locking) is not counted as consuming.

Targets: ``records()`` at least 60% and ``take(500)`` at least 75% of the decoding
limit loop. **Redis's CPU per event** (``INFO cpu`` of redis-server, user + system,
around each loop): each worker's at most 1.25x the bare hiredis loop's, measured in
the same round (the fence must not cost a shard its capacity), and the events per
second one Redis core consumes at that cost.

**Metrics on and off**: each round also runs ``records()`` and ``take(500)`` with the
worker serving its Prometheus metrics (the ``metrics_port`` setting, as
``streamkit worker --metrics-port`` does) and a scraper reading the endpoint every
second. Target: metrics on at least 95% of metrics off. Skipped, with a note, when the
``metrics`` extra is not installed.

``--profile`` instead runs the ``records()`` and ``take(500)`` loops once each under
cProfile and prints the top functions by own time (``--profile-top``), and writes the
raw profiles for snakeviz & co. with ``--profile-dir``. cProfile's own cost per call
distorts a path of many small calls; ``--only records`` (or ``take``) runs one worker
and nothing else, for a sampling profiler: ``py-spy record -r 2000 -f raw -o
records.txt -- python tests/benchmarks/bench_consume.py --only records --events
400000``, then ``python tests/benchmarks/where_time_goes.py records.txt 2.3`` (the
worker's CPU per event that the run printed) splits it into the table of
docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import importlib.util
import pstats
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import attrs
import orjson
import trio

from streamkit import App, Events, Record, Redis, Stream, run_worker
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

Mode = Literal["records", "take"]
BATCH = 500
#: Shares of the decoding hiredis limit loop (the limit of one Python process).
TARGETS: dict[str, float] = {"records": 0.60, "take": 0.75}
#: Redis CPU per event of a worker, at most this multiple of the bare hiredis loop's
#: (``XREADGROUP COUNT 500`` + ``XACK``, no fencing): the price of fencing, bounded.
REDIS_TARGET = 1.25
#: Metrics on must keep at least this share of the throughput with metrics off.
METRICS_TARGET = 0.95
#: Seconds between two scrapes of the metrics endpoint while metrics are on.
SCRAPE_EVERY = 1.0


class Tick(Record):
    symbol: str
    price: float
    volume: int


async def fill(stream: Stream[Tick], n: int) -> None:
    await stream.send_many(Tick(symbol=f"S{i % 500}", price=i / 100, volume=i) for i in range(n))


# --- streamkit -------------------------------------------------------------------


async def bench_worker(
    redis_url: str,
    n: int,
    partitions: int,
    mode: Mode,
    profiler: cProfile.Profile | None = None,
    *,
    metrics: bool = False,
) -> WorkerRun:
    """One worker (``run_worker``) with one processor with a trivial body; with
    ``metrics``, serving its metrics to a scraper that reads them every second.

    Returns events/s and this process's CPU time per event, both from the first event
    to the last, and the seconds from starting the worker to its first event
    (start-up, not counted).
    """
    app = App(
        f"bench{time.monotonic_ns()}", redis_url=redis_url, metrics_port=0 if metrics else None
    )
    stream = app.stream("ticks", record=Tick, partition_by="symbol", partition_count=partitions)
    done = 0
    first = last = first_cpu = last_cpu = 0.0
    finished = trio.Event()
    # Redis's CPU once a twentieth of the events are done (the start-up well over),
    # and how many were done then: the steady state's cost per event is what Redis
    # did from there on.
    mark = max(1, n // 20)
    steady_from: tuple[float, int] | None = None

    async def note_steady() -> None:
        nonlocal steady_from
        if steady_from is None and done >= mark:
            steady_from = (await redis_cpu(app.redis), done)

    @app.processor(stream)
    async def process(events: Events[Tick]) -> None:
        nonlocal done, first, last, first_cpu, last_cpu
        if mode == "records":
            async for _ in events.records():
                if not done:
                    first, first_cpu = time.perf_counter(), time.process_time()
                done += 1
                if done == mark:
                    await note_steady()
                if done == n:
                    last, last_cpu = time.perf_counter(), time.process_time()
                    finished.set()
        else:
            async for batch in events.take(BATCH, within=0.01):
                if not done:
                    first, first_cpu = time.perf_counter(), time.process_time()
                done += len(batch)
                await note_steady()
                if done == n:
                    last, last_cpu = time.perf_counter(), time.process_time()
                    finished.set()

    async with app:
        await fill(stream, n)
        server_before = await redis_cpu(app.redis)
        async with trio.open_nursery() as nursery:
            if profiler is not None:
                profiler.enable()
            try:
                began = time.perf_counter()
                worker = await nursery.start(run_worker, app)
                with _scraping(worker.metrics_url):
                    await finished.wait()
            finally:
                if profiler is not None:
                    profiler.disable()
            server_after = await redis_cpu(app.redis)
            server = (server_after - server_before) / n
            await worker.stop()
    assert steady_from is not None
    steady = (server_after - steady_from[0]) / (n - steady_from[1])
    # The first event's own batch is not timed: count the events after the first.
    return WorkerRun(
        (n - 1) / (last - first), (last_cpu - first_cpu) / (n - 1), first - began, server, steady
    )


async def redis_cpu(redis: Redis) -> float:
    """CPU seconds redis-server has used so far (user and system)."""
    info = await redis.info("cpu")
    return sum(float(str(info[name])) for name in ("used_cpu_user", "used_cpu_sys"))


class WorkerRun(NamedTuple):
    """What :func:`bench_worker` measured."""

    rate: float  # events/s
    cpu: float  # seconds of this process's CPU time per event
    startup: float  # seconds from the worker's start to its first event
    server: float  # seconds of redis-server's CPU time per event (start-up included)
    # The same from a twentieth of the events done on (the start-up over); the events
    # read ahead then (at most prefetch x batch per partition) make it up to a few
    # percent low.
    steady: float


@contextlib.contextmanager
def _scraping(url: str | None) -> Iterator[None]:
    """Scrape ``url`` every :data:`SCRAPE_EVERY` seconds from a thread, as Prometheus
    would, while the block runs (nothing without a URL)."""
    if url is None:
        yield
        return
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(SCRAPE_EVERY):
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()

    thread = threading.Thread(target=scrape, name="scraper", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def metrics_available() -> bool:
    return importlib.util.find_spec("prometheus_client") is not None


# --- bare coredis ----------------------------------------------------------------


async def bench_coredis(app: App, n: int, partitions: int) -> float:
    """XREADGROUP COUNT 500 + XACK per partition on streamkit's own coredis client."""
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
            reply = await redis.xreadgroup("g", "c", streams={key: ">"}, count=BATCH)
            if not reply:
                break
            entries = next(iter(reply.values()))
            await redis.xack(key, "g", [e.identifier for e in entries])
            done += len(entries)
    assert done == n, done
    return n / (time.perf_counter() - began)


# --- bare hiredis over a trio socket --------------------------------------------


def _command(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def _xack(key: bytes, ids: Sequence[bytes]) -> bytes:
    head = b"*%d\r\n$4\r\nXACK\r\n$%d\r\n%s\r\n$1\r\ng\r\n" % (len(ids) + 3, len(key), key)
    return head + b"".join([b"$%d\r\n%s\r\n" % (len(i), i) for i in ids])


def hand_decoder(record: type[Record]) -> Callable[[bytes], Record]:
    """The fastest decoding of a JSON payload into ``record`` one can write by hand:
    ``orjson.loads`` and a constructor call generated for the record's fields, with no
    checks at all (streamkit's own decoding checks every field's type)."""
    names = [field.name for field in attrs.fields(record)]
    arguments = ", ".join(f"{name}=o[{name!r}]" for name in names)
    source = f"def decode(payload):\n    o = loads(payload)\n    return record({arguments})\n"
    namespace: dict[str, Any] = {"loads": orjson.loads, "record": record}
    exec(source, namespace)
    decode: Callable[[bytes], Record] = namespace["decode"]
    return decode


async def bench_hiredis(
    app: App, url: str, n: int, partitions: int, *, decode: bool
) -> tuple[float, float]:
    """The same reads and acknowledgements as bench_coredis, in hand-written RESP on a
    trio socket, parsed by hiredis, all partitions in one round trip; with ``decode``,
    every entry also decoded into a Tick by :func:`hand_decoder`. Returns events/s and
    redis-server's CPU time per event."""
    import hiredis  # optional: the bench runs without it

    stream = app.stream(
        f"hiredis{time.monotonic_ns()}",
        record=Tick,
        partition_by="symbol",
        partition_count=partitions,
    )
    await fill(stream, n)
    keys = [key.encode() for key in stream.partition_keys()]
    for key in keys:
        await app.redis.xgroup_create(key, "g", "0", mkstream=True)
    reads = {
        key: _command(
            b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", b"%d" % BATCH, b"STREAMS", key, b">"
        )
        for key in keys
    }
    to_record = hand_decoder(Tick)
    last: Record | None = None
    parts = urllib.parse.urlsplit(url)
    sock = await trio.open_tcp_stream(parts.hostname or "127.0.0.1", parts.port or 6379)
    reader = hiredis.Reader()
    server_before = await redis_cpu(app.redis)
    began = time.perf_counter()
    done = 0
    async with sock:
        active = list(keys)
        pending: dict[bytes, list[bytes]] = {}
        while active:
            out = bytearray()
            expected = 0
            for key in active:
                ids = pending.get(key)
                if ids:
                    out += _xack(key, ids)
                    expected += 1
                out += reads[key]
                expected += 1
            await sock.send_all(out)
            replies: list[object] = []
            while len(replies) < expected:
                reply = reader.gets()
                if reply is False:
                    data = await sock.receive_some(1 << 20)
                    if not data:
                        raise ConnectionError("redis closed the connection")
                    reader.feed(data)
                    continue
                if isinstance(reply, hiredis.ReplyError):
                    raise reply
                replies.append(reply)
            still: list[bytes] = []
            at = 0
            for key in active:
                if pending.pop(key, None):
                    at += 1  # the XACK's count
                reply = replies[at]
                at += 1
                if reply:
                    assert isinstance(reply, list)
                    entries = reply[0][1]
                    if decode:
                        for entry in entries:
                            last = to_record(entry[1][1])
                    pending[key] = [entry[0] for entry in entries]
                    done += len(entries)
                    still.append(key)
            active = still
    rate = n / (time.perf_counter() - began)
    assert done == n, done
    assert last is not None or not decode
    return rate, (await redis_cpu(app.redis) - server_before) / n


def hiredis_available() -> bool:
    return importlib.util.find_spec("hiredis") is not None


# --- runs ------------------------------------------------------------------------


def _ratio(value: float, yardstick: float | None) -> str:
    return f"{value / yardstick:>13.0%}" if yardstick else f"{'-':>13}"


def _row(label: str, value: float, yardsticks: Sequence[float | None], note: str = "") -> str:
    ratios = "".join(_ratio(value, yardstick) for yardstick in yardsticks)
    return f"  {label:<46}{value:>10,.0f}{ratios}  {note}".rstrip()


async def run(n: int, partitions: int, rounds: int, *, with_metrics: bool) -> None:
    with_hiredis = hiredis_available()
    with_metrics = with_metrics and metrics_available()
    results: dict[str, list[float]] = {
        "coredis": [],
        "hiredis": [],
        "decoding": [],
        "records": [],
        "take": [],
        "records+metrics": [],
        "take+metrics": [],
    }
    startups: dict[str, list[float]] = {"records": [], "take": []}
    cpu: dict[str, list[float]] = {name: [] for name in results}
    server: dict[str, list[float]] = {name: [] for name in results}
    server.update({"records-steady": [], "take-steady": [], "after": []})
    with RedisServer() as redis_server:
        async with App("bench", redis_url=redis_server.url) as app:
            for round_ in range(1, rounds + 1):
                await app.redis.flushall()
                coredis = await bench_coredis(app, n, partitions)
                results["coredis"].append(coredis)
                limits = ""
                if with_hiredis:
                    for name, decode in (("hiredis", False), ("decoding", True)):
                        await app.redis.flushall()
                        rate, busy = await bench_hiredis(
                            app, redis_server.url, n, partitions, decode=decode
                        )
                        results[name].append(rate)
                        server[name].append(busy)
                    limits = (
                        f" | hiredis {results['hiredis'][-1]:,.0f}/s, decoding "
                        f"{results['decoding'][-1]:,.0f}/s"
                    )
                # Each mode without metrics, then at once with them (if installed): the
                # two runs of a pair see the same machine.
                for mode in ("records", "take"):
                    await app.redis.flushall()
                    off = await bench_worker(redis_server.url, n, partitions, mode)
                    startups[mode].append(off.startup)
                    results[mode].append(off.rate)
                    cpu[mode].append(off.cpu)
                    server[mode].append(off.server)
                    server[f"{mode}-steady"].append(off.steady)
                    if with_metrics:
                        await app.redis.flushall()
                        on = await bench_worker(redis_server.url, n, partitions, mode, metrics=True)
                        results[f"{mode}+metrics"].append(on.rate)
                        cpu[f"{mode}+metrics"].append(on.cpu)
                if with_hiredis:
                    # The bare loop again after the workers: Redis's own speed drifts
                    # from minute to minute on a shared machine, and the workers' cost
                    # is read against the mean of the loops before and after them.
                    await app.redis.flushall()
                    _, busy = await bench_hiredis(
                        app, redis_server.url, n, partitions, decode=False
                    )
                    server["after"].append(busy)
                yardstick = results["decoding"][-1] if with_hiredis else coredis
                records, take = results["records"][-1], results["take"][-1]
                metrics_part = ""
                if with_metrics:
                    metrics_part = (
                        f" | metrics on: records() {results['records+metrics'][-1]:,.0f}/s, "
                        f"take(500) {results['take+metrics'][-1]:,.0f}/s"
                    )
                print(
                    f"  round {round_}: coredis {coredis:,.0f}/s{limits} | records() "
                    f"{records:,.0f}/s ({records / yardstick:.0%}) | take(500) {take:,.0f}/s "
                    f"({take / yardstick:.0%}){metrics_part}",
                    flush=True,
                )
    best = {name: max(values) for name, values in results.items() if values}
    coredis = best["coredis"]
    limit, decoding = best.get("hiredis"), best.get("decoding")
    print(
        f"consume throughput, {n:,} queued small events, {partitions} partitions, 1 worker, "
        f"best of {rounds} rounds"
    )
    yardsticks = (decoding, limit, coredis)
    print(f"  {'':<46}{'events/s':>10}{'vs decoding':>13}{'vs limit':>13}{'vs coredis':>13}")
    if limit and decoding:
        print(_row("hiredis limit loop, decoding (the yardstick)", decoding, yardsticks))
        print(_row("hiredis limit loop (no decoding)", limit, yardsticks))
    print(_row(f"bare coredis XREADGROUP COUNT {BATCH} + XACK", coredis, yardsticks))
    for mode, label in (("records", "worker, records()"), ("take", f"worker, take({BATCH})")):
        if decoding:
            target = f"target >= {TARGETS[mode]:.0%} of decoding"
        else:
            target = "(no hiredis: no target)"
        print(_row(label, best[mode], yardsticks, target))
    base = "decoding" if decoding else "coredis"
    medians = {
        mode: statistics.median(
            ours / bare for ours, bare in zip(results[mode], results[base], strict=True)
        )
        for mode in ("records", "take")
    }
    print(
        f"  median of per-round ratios to {'the decoding limit' if decoding else 'coredis'}: "
        f"records() {medians['records']:.0%}, take({BATCH}) {medians['take']:.0%}"
    )
    print(
        "  worker start to first event, not timed (median): "
        f"records() {statistics.median(startups['records']) * 1000:.0f} ms, "
        f"take({BATCH}) {statistics.median(startups['take']) * 1000:.0f} ms"
    )
    per_event = {name: statistics.median(values) * 1e6 for name, values in cpu.items() if values}
    if with_metrics:
        print(
            f"  metrics on vs off (served, scraped every {SCRAPE_EVERY:g} s), best of "
            f"{rounds} rounds:"
        )
        print(f"  {'':<46}{'off /s':>10}{'on /s':>10}{'on/off':>8}")
        for mode, label in (("records", "worker, records()"), ("take", f"worker, take({BATCH})")):
            best_off, best_on = best[mode], best[f"{mode}+metrics"]
            print(
                f"  {label:<46}{best_off:>10,.0f}{best_on:>10,.0f}{best_on / best_off:>8.1%}  "
                f"target >= {METRICS_TARGET:.0%}"
            )
        cost = {
            mode: statistics.median(
                with_ / without
                for with_, without in zip(results[f"{mode}+metrics"], results[mode], strict=True)
            )
            for mode in ("records", "take")
        }
        print(
            f"  median of per-round ratios on/off: records() {cost['records']:.1%}, "
            f"take({BATCH}) {cost['take']:.1%}"
        )
        # CPU time per event varies far less than wall-clock rates on a shared machine.
        print(
            "  worker process CPU per event (median): "
            + ", ".join(
                f"{label} {per_event[mode]:.2f} us off, {per_event[mode + '+metrics']:.2f} us on "
                f"({per_event[mode + '+metrics'] / per_event[mode] - 1:+.1%})"
                for mode, label in (("records", "records()"), ("take", f"take({BATCH})"))
            )
        )
    else:
        print(
            "  worker process CPU per event (median): "
            f"records() {per_event['records']:.2f} us, take({BATCH}) {per_event['take']:.2f} us"
        )
        if not metrics_available():
            print("  (prometheus-client is not installed: no metrics run; it is the metrics extra)")
    if with_hiredis:
        print_redis_cpu(server)
    if not with_hiredis:
        print("  (hiredis is not installed: no limit loops)")


def print_redis_cpu(server: dict[str, list[float]]) -> None:
    """Redis's CPU per event of the workers against the bare loop's, measured in the
    same rounds: the median of the per-round ratios, and what one Redis core consumes
    at that cost."""
    median = {name: statistics.median(v) * 1e6 for name, v in server.items() if v}
    # Both hiredis loops send Redis the same commands (decoding is the client's work);
    # each round's yardstick is the mean of the loops before the workers and after.
    before = [min(pair) for pair in zip(server["hiredis"], server["decoding"], strict=True)]
    bare = [(b + a) / 2 for b, a in zip(before, server["after"], strict=True)]
    print(
        f"  redis-server CPU per event (median of {len(bare)} rounds; INFO cpu, user + sys, "
        "the worker's start-up included; the bare loop run before the workers and after):"
    )
    print(f"  {'':<46}{'us/event':>10}{'vs bare':>10}{'per Redis core':>16}")
    bare_us = statistics.median(bare) * 1e6
    print(
        f"  {'bare XREADGROUP COUNT 500 + XACK (hiredis)':<46}{bare_us:>10.2f}{'1.00x':>10}"
        f"{1e6 / bare_us:>12,.0f} ev/s"
    )
    for mode, label in (("records", "worker, records()"), ("take", f"worker, take({BATCH})")):
        ratio = statistics.median(
            ours / theirs for ours, theirs in zip(server[mode], bare, strict=True)
        )
        verdict = "met" if ratio <= REDIS_TARGET else "NOT met"
        print(
            f"  {label:<46}{median[mode]:>10.2f}{ratio:>9.2f}x{1e6 / median[mode]:>12,.0f} ev/s"
            f"  target <= {REDIS_TARGET:.2f}x: {verdict}"
        )
    # The bare loops' figures leave out their own set-up (the groups made first): the
    # workers' from a twentieth of the events on leave out theirs.
    for mode, label in (("records", "records()"), ("take", f"take({BATCH})")):
        values = server.get(f"{mode}-steady") or []
        if not values:
            continue
        steady = f"{mode}-steady"
        ratio = statistics.median(
            ours / theirs for ours, theirs in zip(server[steady], bare, strict=True)
        )
        print(
            f"  {'worker, ' + label + ', start-up left out':<46}{median[steady]:>10.2f}"
            f"{ratio:>9.2f}x{1e6 / median[steady]:>12,.0f} ev/s"
        )


async def profile(n: int, partitions: int, top: int) -> dict[str, cProfile.Profile]:
    profiles = {}
    with RedisServer() as server:
        for mode, label in (("records", "records()"), ("take", f"take({BATCH})")):
            profiler = cProfile.Profile()
            rate = (await bench_worker(server.url, n, partitions, mode, profiler)).rate  # type: ignore[arg-type]
            print(
                f"=== cProfile: worker, {label}, {n:,} events, {partitions} partitions "
                f"({rate:,.0f} events/s under the profiler), top {top} by tottime"
            )
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.strip_dirs().sort_stats("tottime").print_stats(top)
            profiles[mode] = profiler
    return profiles


async def only(mode: Mode, n: int, partitions: int) -> None:
    with RedisServer() as server:
        run = await bench_worker(server.url, n, partitions, mode)
    print(
        f"worker, {mode}: {run.rate:,.0f} events/s, {run.cpu * 1e6:.2f} us of CPU per event "
        f"({n:,} events, {partitions} partitions)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-metrics", action="store_true", help="skip the runs with metrics on (quicker)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile records() and take(500) instead"
    )
    parser.add_argument("--profile-top", type=int, default=25, metavar="N")
    parser.add_argument("--profile-dir", type=Path, default=None, metavar="DIR")
    parser.add_argument(
        "--only",
        choices=["records", "take"],
        help="run that worker once, nothing else (for a sampling profiler, e.g. py-spy)",
    )
    args = parser.parse_args()
    if args.only:
        trio.run(only, args.only, args.events, args.partitions)
    elif args.profile:
        profiles = trio.run(profile, args.events, args.partitions, args.profile_top)
        if args.profile_dir is not None:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            for mode, profiler in profiles.items():
                profiler.dump_stats(args.profile_dir / f"consume-{mode}.prof")
    else:
        trio.run(
            functools.partial(
                run, args.events, args.partitions, args.rounds, with_metrics=not args.no_metrics
            )
        )


if __name__ == "__main__":
    main()
