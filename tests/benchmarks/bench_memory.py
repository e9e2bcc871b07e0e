"""Memory: the resident size of a worker owning 64 partitions with full prefetch buffers.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_memory.py`` inside .venv).
A worker (``run_worker``) runs in a process of its own, so that its resident size is
its own, with one processor over ``--partitions`` (64) partitions whose body holds on
to the first record it gets: behind it, the fetcher fills every partition's buffer to
the settings' bound, ``prefetch`` batches of ``batch_size`` entries (the batch in the
processor's hands included), and stops reading (backpressure), however large the
backlog (each partition holds more than that).

The resident size (``VmRSS``) is taken three times, after ``gc.collect()``: once the
app is connected, before the worker starts; once the worker owns every partition with
empty streams (its own cost per partition: locks, scopes, tasks); and once every
buffer is full. The difference of the last two, per partition and per buffered entry,
is what the buffers cost; it is bounded by the settings: ``partitions x prefetch x
batch_size`` entries, whatever the backlog. Two record sizes: small (about 60 bytes of
JSON) and 1 KiB, to show what an entry costs besides its payload.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import trio

from streamkit import App, Events, Record, Settings, run_worker
from streamkit.testing import RedisServer, wait_until

SCRIPT = Path(__file__).resolve()


class Blob(Record):
    key: str
    n: int
    text: str


def resident() -> int:
    """This process's resident size in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measured() -> int:
    gc.collect()
    return resident()


def _app(url: str, partitions: int) -> tuple[App, object]:
    app = App("memory", redis_url=url, settings=Settings())
    stream = app.stream("blobs", record=Blob, partition_by="key", partition_count=partitions)
    return app, stream


async def fill(url: str, partitions: int, per_partition: int, text_size: int) -> None:
    app, stream = _app(url, partitions)
    text = "x" * text_size
    async with app:
        # Keys chosen per partition, so that each partition gets its share.
        keys: dict[int, str] = {}
        i = 0
        while len(keys) < partitions:
            key = f"k{i}"
            keys.setdefault(stream.partition_of(Blob(key=key, n=0, text="")), key)  # type: ignore[attr-defined]
            i += 1
        records = [
            Blob(key=keys[p], n=n, text=text)
            for p in range(partitions)
            for n in range(per_partition)
        ]
        await stream.send_many(records)  # type: ignore[attr-defined]


async def child(url: str, partitions: int, filled: bool) -> dict[str, float]:
    """The worker process: its resident sizes, before and with every partition owned."""
    app, stream = _app(url, partitions)
    settings = app.settings
    hold = trio.Event()
    first_seen = 0

    @app.processor(stream)  # type: ignore[arg-type]
    async def process(events: Events[Blob]) -> None:
        nonlocal first_seen
        async for _ in events.records():
            first_seen += 1
            await hold.wait()

    async with app:
        connected = measured()
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            executor = worker.executors[0]
            full = settings.prefetch * settings.batch_size

            def ready() -> bool:
                fetcher = executor.fetcher
                if fetcher is None:
                    return False
                stats = fetcher.statistics()
                if len(stats.partitions) != partitions:
                    return False
                if not filled:
                    return True
                buffered = stats.buffered_entries
                return first_seen == partitions and all(
                    buffered.get(p, 0) == full for p in range(partitions)
                )

            await wait_until(ready, what="every partition owned and buffered", within=120)
            # Nothing more comes in: the fetcher stopped reading (backpressure).
            await trio.sleep(0.5)
            assert executor.fetcher is not None
            entries = sum(executor.fetcher.statistics().buffered_entries.values())
            running = measured()
            nursery.cancel_scope.cancel()
    return {"connected": connected, "running": running, "entries": entries}


def run_child(url: str, partitions: int, filled: bool) -> dict[str, float]:
    env = dict(os.environ)
    root = str(SCRIPT.parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", url, str(partitions), "1" if filled else "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the worker process failed:\n{done.stdout}{done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


async def flushed(url: str) -> None:
    async with App("flush", redis_url=url) as app:
        await app.redis.flushall()


def mib(size: float) -> str:
    return f"{size / 2**20:,.1f} MiB"


def run(partitions: int, rounds: int) -> None:
    settings = Settings()
    full = settings.prefetch * settings.batch_size
    print(
        f"worker memory, {partitions} partitions owned, prefetch {settings.prefetch} x "
        f"batch_size {settings.batch_size} = {full:,} entries buffered per partition at "
        f"most (the settings' bound), resident size (VmRSS) after gc.collect(), best of "
        f"{rounds}"
    )
    header = f"  {'record':<22}{'connected':>12}{'owned, empty':>14}{'buffers full':>14}"
    print(f"{header}{'per partition':>15}{'per entry':>11}")
    with RedisServer() as server:
        for label, text_size in (("small (~60 B JSON)", 10), ("1 KiB", 1024 - 40)):
            empty: list[dict[str, float]] = []
            full_runs: list[dict[str, float]] = []
            for _ in range(rounds):
                trio.run(flushed, server.url)
                empty.append(run_child(server.url, partitions, filled=False))
                trio.run(flushed, server.url)
                # More than the buffers take: the backlog is larger than the bound.
                trio.run(fill, server.url, partitions, full + 200, text_size)
                full_runs.append(run_child(server.url, partitions, filled=True))
            connected = min(r["connected"] for r in empty + full_runs)
            owned = min(r["running"] for r in empty)
            buffered = min(r["running"] for r in full_runs)
            entries = full_runs[0]["entries"]
            assert entries == partitions * full, entries
            per_partition = (buffered - owned) / partitions
            print(
                f"  {label:<22}{mib(connected):>12}{mib(owned):>14}{mib(buffered):>14}"
                f"{per_partition / 2**10:>12,.0f} KiB{(buffered - owned) / entries:>9,.0f} B"
            )
            time.sleep(0.1)
    print(
        "  per partition, per entry: what the full buffers add to the worker that owns the "
        "partitions with nothing to read; the worker's own cost per partition is "
        "(owned, empty - connected) / partitions"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, partitions, filled = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
        print(json.dumps(trio.run(child, url, partitions, filled)))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    run(args.partitions, args.rounds)


if __name__ == "__main__":
    main()
