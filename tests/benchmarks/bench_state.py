"""State: a count kept in a table against stateless processing and a hand-kept count.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_state.py`` inside .venv).
One process, one private redis-server, the same backlog for every variant
(``--events`` small records over ``--partitions`` partitions and ``--keys`` distinct
keys), one worker (``run_worker``) each, timed from the first event to the last:

* **stateless**: a ``records()`` processor with a trivial body;
* **HINCRBY by hand**: ``records()``, one ``HINCRBY`` per event, awaited: what users
  write today, at-least-once (a redelivery counts twice);
* **table count**: ``records()``, ``await counts.get(key)`` then ``counts.set(key, n +
  1)``, committed exactly once with the acknowledgements;
* **window sum**: ``records()``, a tumbling one-second window sum per key over event
  time, with each closed window's result emitted to an output stream.

Targets: the table count at least 50% of stateless and faster than HINCRBY by hand;
the window sum at least 40% of stateless.

Then **the update cost against the windows a key has open**: 100,000 values, each
updated twice, as 1,000 open windows of 100 keys against 1 of 100,000 keys (the same
values either way: a window per key does not fold more updates into one write, nor
need a larger cache). Target: 1,000 windows within 1.5x of 1.

Then **latency to committed state**: a producer sends at a fixed rate, each event
stamped with its send time; a table keeps, per key, the newest stamp processed; a
reader polls the committed value and records how old it is (p50/p99), against the
same measurement for a stateless processor that writes the stamp with a plain SET.

Then **recovery**: a worker subprocess owning one partition whose table holds
``--recovery-keys`` keys (1,000,000 by default, written straight into Redis) is
killed with -9 while processing; the time from the kill until the table shows an
event processed by the new owner is measured against the same with an empty table
(the lease TTL dominates both: recovery reads no changelog).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import trio

from streamkit import App, Events, Record, open_redis, run_worker, tumbling
from streamkit.testing import RedisServer

Variant = Literal["stateless", "hincrby", "table", "ttl", "window"]
TITLES: dict[Variant, str] = {
    "stateless": "stateless records()",
    "hincrby": "HINCRBY by hand (at-least-once)",
    "table": "table count (exactly once)",
    "ttl": "table count, keys expiring (ttl)",
    "window": "tumbling window sum + results",
}
ROOT = Path(__file__).resolve().parent.parent.parent


class Sale(Record):
    shop: str
    amount: int
    at: float  # seconds since the epoch


def sales(n: int, keys: int) -> list[Sale]:
    t0 = 1_767_225_600.0
    return [Sale(shop=f"s{i % keys}", amount=i % 7, at=t0 + i / 1000) for i in range(n)]


async def bench_variant(
    redis_url: str, variant: Variant, n: int, partitions: int, keys: int
) -> float:
    """Events/s of one worker running ``variant`` over a backlog of ``n`` sales."""
    app = App(f"st{time.monotonic_ns()}", redis_url=redis_url)
    stream = app.stream("sales", record=Sale, partition_by="shop", partition_count=partitions)
    counts = app.table("counts", value=int, default=0)
    expiring = app.table("expiring", value=int, default=0, ttl=timedelta(seconds=0.5))
    results = app.stream("results", record=dict, partition_by=lambda r: r["key"])
    revenue = app.window(
        "revenue", tumbling(timedelta(seconds=1)), value=int, initial=0, time="at", output=results
    )
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

    if variant == "stateless":

        @app.processor(stream)
        async def stateless(events: Events[Sale]) -> None:
            async for _ in events.records():
                tick()

    elif variant == "hincrby":
        hash_key = f"{app.name}:counts"

        @app.processor(stream)
        async def by_hand(events: Events[Sale]) -> None:
            async for sale in events.records():
                await app.redis.hincrby(hash_key, sale.shop, 1)
                tick()

    elif variant == "table":

        @app.processor(stream, tables=[counts])
        async def counting(events: Events[Sale]) -> None:
            async for sale in events.records():
                counts.set(sale.shop, await counts.get(sale.shop) + 1)
                tick()

    elif variant == "ttl":

        @app.processor(stream, tables=[expiring])
        async def counting_expiring(events: Events[Sale]) -> None:
            async for sale in events.records():
                expiring.set(sale.shop, await expiring.get(sale.shop) + 1)
                tick()

    else:

        @app.processor(stream, tables=[revenue])
        async def summing(events: Events[Sale]) -> None:
            async for sale in events.records():
                await revenue.update(sale.shop, sale.at, _add, sale.amount)
                tick()

    async with app:
        await stream.send_many(sales(n, keys))
        await app.redis.config_resetstat()
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            await finished.wait()
            await worker.stop()
        stats: Any = await app.redis.info("commandstats")
        REDIS_COST[variant] = (
            sum(v["usec"] for v in stats.values()),
            stats.get("cmdstat_evalsha", {}).get("calls", 0),
        )
        if variant == "table":
            total = sum(await counts.read_many([f"s{k}" for k in range(keys)]))
            assert total == n, (total, n)
    return (n - 1) / (last - first)


#: The values of the open-windows bench: as many keys, divided by the windows each has.
OPEN_VALUES = 100_000


async def bench_open_windows(redis_url: str, n: int, windows: int) -> float:
    """Events/s of a tumbling-window sum over :data:`OPEN_VALUES` values, whose keys
    each have ``windows`` windows open (a grace long enough that none closes): each
    event updates one of its key's. The same values and the same events per value
    whatever ``windows`` (1,000 windows of 100 keys, or 1 of 100,000), so that what
    differs is the windows a key has, not how many updates a commit folds into one
    write or how many values the cache must hold."""
    keys = OPEN_VALUES // windows
    app = App(f"ow{time.monotonic_ns()}", redis_url=redis_url)
    stream = app.stream("sales", record=Sale, partition_by="shop", partition_count=8)
    revenue = app.window(
        "revenue",
        tumbling(timedelta(seconds=1)),
        value=int,
        initial=0,
        grace=timedelta(days=1),
        time="at",
        idle=False,
    )
    done = 0
    first = last = 0.0
    finished = trio.Event()

    @app.processor(stream, tables=[revenue])
    async def summing(events: Events[Sale]) -> None:
        nonlocal done, first, last
        async for sale in events.records():
            await revenue.update(sale.shop, sale.at, _add, sale.amount)
            if not done:
                first = time.perf_counter()
            done += 1
            if done == n:
                last = time.perf_counter()
                finished.set()

    t0 = 1_767_225_600.0
    backlog = [Sale(shop=f"s{i % keys}", amount=1, at=t0 + (i // keys) % windows) for i in range(n)]
    async with app:
        await stream.send_many(backlog)
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            await finished.wait()
            await worker.stop()
    return (n - 1) / (last - first)


#: Per variant, the Redis time of its last run (µs, every command) and its script calls.
REDIS_COST: dict[Variant, tuple[int, int]] = {}


def _add(total: int, amount: int) -> int:
    return total + amount


# --- latency -----------------------------------------------------------------------


class Stamped(Record):
    key: str
    sent: float  # time.time() at send


async def bench_latency(redis_url: str, rate: int, seconds: float, *, table: bool) -> list[float]:
    """Ages (s) of the committed newest stamp, polled while a producer sends ``rate``/s."""
    app = App(f"lat{time.monotonic_ns()}", redis_url=redis_url)
    stream = app.stream("stamps", record=Stamped, partition_by="key", partition_count=4)
    newest = app.table("newest", value=float, default=0.0)
    plain = f"{app.name}:newest"

    if table:

        @app.processor(stream, tables=[newest])
        async def keep(events: Events[Stamped]) -> None:
            async for item in events.records():
                newest.set(item.key, item.sent)

    else:

        @app.processor(stream)
        async def keep_plain(events: Events[Stamped]) -> None:
            async for item in events.records():
                await app.redis.set(plain, str(item.sent))

    ages: list[float] = []
    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        stop = trio.Event()

        async def produce() -> None:
            period = 0.001
            per_tick = max(1, round(rate * period))
            start = trio.current_time()
            k = 0
            while not stop.is_set():
                now = time.time()
                await stream.send_many(Stamped(key="k", sent=now) for _ in range(per_tick))
                k += 1
                await trio.sleep_until(start + k * period)

        nursery.start_soon(produce)
        await trio.sleep(1.0)  # warm up
        end = trio.current_time() + seconds
        while trio.current_time() < end:
            if table:
                value = await newest.read("k")
            else:
                raw = await app.redis.get(plain)
                value = float(raw) if raw else 0.0
            if value:
                ages.append(time.time() - value)
            await trio.sleep(0.002)
        stop.set()
        await worker.stop()
    return ages


# --- recovery ----------------------------------------------------------------------

RECOVERY_APP = """
from streamkit import App, Events, Record

class Tick(Record):
    key: str
    n: int

app = App("recovery")
ticks = app.stream("ticks", record=Tick, partition_by="key", partition_count=1)
totals = app.table("totals", value=int, default=0)

@app.processor(ticks, tables=[totals])
async def count(events: Events[Tick]) -> None:
    async for tick in events.records():
        totals.set(tick.key, tick.n)
"""


async def bench_recovery(redis_url: str, table_keys: int, workdir: Path) -> float:
    """Seconds from kill -9 of the table's owner until the new owner's first commit."""
    module = workdir / "recovery_app.py"
    module.write_text(RECOVERY_APP)
    env = {
        **os.environ,
        "STREAMKIT_REDIS_URL": redis_url,
        "STREAMKIT_LEASE_TTL": "2",
        "STREAMKIT_HEARTBEAT_INTERVAL": "0.2",
        "STREAMKIT_SESSION_TIMEOUT": "2",
        "PYTHONPATH": f"{workdir}:{ROOT}",
    }
    async with open_redis(redis_url) as redis:
        await redis.flushall()
        key = "__tabl:{recovery.ticks.0}.totals"
        chunk = 10_000
        for start in range(0, table_keys, chunk):
            mapping = {f"filler{i}": b"1" for i in range(start, min(start + chunk, table_keys))}
            await redis.hset(key, mapping)

        def start_worker() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [sys.executable, "-m", "streamkit", "worker", "recovery_app:app"],
                cwd=workdir,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        app = App("recovery", redis_url=redis_url)
        ticks = app.stream("ticks", record=_Tick, partition_by="key", partition_count=1)
        async with app:
            first = start_worker()
            n = 0

            async def seen(value: int) -> None:
                while True:
                    raw = await redis.hget(key, b"probe")
                    if raw is not None and int(raw) >= value:
                        return
                    await trio.sleep(0.005)

            n += 1
            await ticks.send(_Tick(key="probe", n=n))
            with trio.fail_after(60):
                await seen(n)
            first.send_signal(signal.SIGKILL)
            first.wait()
            killed = time.perf_counter()
            second = start_worker()
            n += 1
            await ticks.send(_Tick(key="probe", n=n))
            with trio.fail_after(60):
                await seen(n)
            recovered = time.perf_counter() - killed
            second.send_signal(signal.SIGTERM)
            second.wait()
    return recovered


class _Tick(Record):
    key: str
    n: int


# --- the run -----------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace) -> None:
    print(
        f"\nState: {args.events:,} events, {args.partitions} partitions, {args.keys:,} keys; "
        f"one worker; best of {args.rounds} rounds\n"
    )
    best: dict[Variant, float] = {}
    with RedisServer() as server:
        for _ in range(args.rounds):
            for variant in TITLES:
                async with open_redis(server.url) as redis:
                    await redis.flushall()
                rate = await bench_variant(
                    server.url, variant, args.events, args.partitions, args.keys
                )
                best[variant] = max(best.get(variant, 0.0), rate)
        stateless = best["stateless"]
        print(
            f"  {'':<38}{'events/s':>10}{'vs stateless':>14}{'vs HINCRBY':>12}"
            f"{'Redis µs/event':>16}"
        )
        for variant, title in TITLES.items():
            rate = best[variant]
            usec = REDIS_COST[variant][0] / args.events
            print(
                f"  {title:<38}{rate:>10,.0f}{rate / stateless:>13.0%}"
                f"{rate / best['hincrby']:>11.2f}x{usec:>16.2f}"
            )
        (ttl_usec, ttl_calls), (table_usec, _) = REDIS_COST["ttl"], REDIS_COST["table"]
        commits = max(1, ttl_calls)
        print(
            f"\n  Expiry's cost: {(ttl_usec - table_usec) / commits:+.1f} µs of Redis time per "
            f"commit (about {args.events / commits:,.0f} events a commit, every key "
            f"written again or expired), {best['table'] / best['ttl'] - 1:+.0%} worker time "
            f"per event against the table count without a ttl"
        )
        print(
            f"\n  Update cost against the windows a key has open ({OPEN_VALUES:,} values, "
            "each updated twice, none closing, one worker):"
        )
        open_rates = {}
        for open_windows in (1, 1000):
            async with open_redis(server.url) as redis:
                await redis.flushall()
            open_rates[open_windows] = max(
                [
                    await bench_open_windows(server.url, args.events, open_windows)
                    for _ in range(args.rounds)
                ]
            )
            keys = OPEN_VALUES // open_windows
            label = f"{open_windows:,} open window(s) per key, {keys:,} keys"
            print(f"  {label:<38}{open_rates[open_windows]:>10,.0f}")
        slower = open_rates[1] / open_rates[1000]
        print(
            f"  Target: 1,000 open windows per key within 1.5x of 1 per update: "
            f"{'met' if slower <= 1.5 else 'NOT met'} ({slower:.2f}x)"
        )
        window = best["window"]
        print(
            f"  Target: window sum >= 40% of stateless: "
            f"{'met' if window >= 0.4 * stateless else 'NOT met'} ({window / stateless:.0%})"
        )
        table = best["table"]
        print(
            f"\n  Targets: table count >= 50% of stateless: "
            f"{'met' if table >= 0.5 * stateless else 'NOT met'} ({table / stateless:.0%}); "
            f"faster than HINCRBY by hand: "
            f"{'met' if table > best['hincrby'] else 'NOT met'} "
            f"({table / best['hincrby']:.2f}x)"
        )

        print(
            f"\n  Latency from send to committed state, {args.rate:,} events/s for "
            f"{args.seconds:.0f}s (age of the newest value when read):"
        )
        print(f"  {'':<38}{'p50 ms':>10}{'p99 ms':>10}")
        for label, table_mode in (("table (committed with the ack)", True), ("plain SET", False)):
            async with open_redis(server.url) as redis:
                await redis.flushall()
            ages = await bench_latency(server.url, args.rate, args.seconds, table=table_mode)
            print(f"  {label:<38}{_pct(ages, 0.5) * 1000:>10.1f}{_pct(ages, 0.99) * 1000:>10.1f}")

        if args.recovery_keys:
            print("\n  Recovery after kill -9 of the owner (lease_ttl 2 s):")
            with tempfile.TemporaryDirectory() as tmp:
                for size in (0, args.recovery_keys):
                    seconds = await bench_recovery(server.url, size, Path(tmp))
                    print(f"  {f'table of {size:,} keys':<38}{seconds:>9.2f}s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--recovery-keys", type=int, default=1_000_000)
    args = parser.parse_args()
    trio.run(run, args)


if __name__ == "__main__":
    main()
