"""Two versions of streamkit side by side in one run: the working tree against a git ref.

Run with ``python tests/benchmarks/bench_versions.py --baseline REF`` inside .venv, or
``./dev bench --baseline REF``. REF's code is checked out into a temporary detached
git worktree (removed afterwards); the working tree's code is "current". A process can
import only one streamkit, so each version runs in its own subprocess: this same
script, run as ``--driver --what send|consume`` with ``PYTHONPATH`` and the working
directory set to that version's root, starts its own private redis-server (that
version's ``streamkit.testing.RedisServer``), measures, and prints one JSON line,
including the ``streamkit.__file__`` it imported (checked by the parent).

Figures, per version:

* **send_many**: ``--events`` small records over ``--partitions`` partitions, one call.
* **send()**: ``--events`` / 50 small records, one ``Stream.send`` each, one after the
  other (the latency path of one record).
* **enqueue_many** and **enqueue**: ``--events`` / 5 no-op jobs of an
  ``open_job_queue`` queue in one ``Job.enqueue_many`` call, then ``--events`` / 50 jobs
  with one ``Job.enqueue`` each.

These three are given per second of the benchmark process's CPU
(``time.process_time``, what the changed code costs; the machine's other load and the
server's own time left out), ``send_many`` and the consumers per second of wall time.
* **records()** and **take(500)**: one worker (``run_worker``), one processor with a
  trivial body, on a backlog of ``--events`` queued small records, timed from the
  first event the processor sees to the last (the worker's start-up is not counted).
* **bare coredis** ``XREADGROUP COUNT 500`` + ``XACK``, the loop streamkit is built on,
  run in both versions' processes: it does not depend on streamkit (both use the same
  coredis from .venv), so its current/baseline ratio shows how much of a difference is
  noise from the machine.

The versions alternate round by round (baseline, current, baseline, current, ...), so
load from other work on the machine hits both alike. The table gives each version's
best of the rounds and the median of the per-round ratios current/baseline.

Only API present in both versions is used: ``App(name, redis_url=...)``,
``app.stream(...)``, ``Record``, ``async with app:``, ``Stream.send_many``,
``run_worker``, ``@app.processor``, ``Events.records()`` / ``Events.take()``,
``Stream.partition_keys()``, ``App.redis``, ``Stream.send``, ``open_job_queue``,
``JobQueue.job``, ``Job.enqueue`` / ``Job.enqueue_many`` and
``streamkit.testing.RedisServer``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import trio

if TYPE_CHECKING:
    from streamkit import App, Record, Stream

What = Literal["send", "consume"]
BATCH = 500
# One driver run must not hang the whole benchmark (a baseline that never finishes).
DRIVER_TIMEOUT = 600.0
SCRIPT = Path(__file__).resolve()

# --- driver: runs inside one version's process -----------------------------------
#
# streamkit is imported inside the functions, never at the top: the parent process
# must not import any streamkit (.venv's editable install may point at another tree).


class _Ticks:
    """The small record type, and n of its records (defined at run time: see above)."""

    def __init__(self) -> None:
        from streamkit import Record

        class Tick(Record):
            symbol: str
            price: float
            volume: int

        def make(n: int) -> list[Record]:
            return [Tick(symbol=f"S{i % 500}", price=i / 100, volume=i) for i in range(n)]

        self.type: type[Record] = Tick
        self.make = make


def _stream(app: App, name: str, ticks: _Ticks, partitions: int) -> Stream[Record]:
    return app.stream(name, record=ticks.type, partition_by="symbol", partition_count=partitions)


async def drive_send(url: str, n: int, partitions: int) -> dict[str, float]:
    from streamkit import App

    ticks = _Ticks()
    async with App("bench-send", redis_url=url) as app:
        stream = _stream(app, "ticks", ticks, partitions)
        records = ticks.make(n)
        began = time.perf_counter()
        await stream.send_many(records)
        elapsed = time.perf_counter() - began
        singles = records[: max(1, n // 50)]
        cpu = time.process_time()
        for record in singles:
            await stream.send(record)
        send_cpu = time.process_time() - cpu
    return {"send_many": n / elapsed, "send": len(singles) / send_cpu}


async def drive_enqueue(url: str, n: int) -> dict[str, float]:
    """No-op jobs: ``n // 5`` in one ``enqueue_many``, ``n // 50`` one ``enqueue`` each;
    jobs per CPU second of this process."""
    from streamkit import open_redis
    from streamkit.jobs import open_job_queue

    async def noop() -> None:
        pass

    async with open_redis(url) as redis, open_job_queue(redis, "bench-enqueue") as queue:
        job = queue.job(noop)
        many = max(1, n // 5)
        cpu = time.process_time()
        await job.enqueue_many([() for _ in range(many)])
        many_cpu = time.process_time() - cpu
        ones = max(1, n // 50)
        cpu = time.process_time()
        for _ in range(ones):
            await job.enqueue()
        one_cpu = time.process_time() - cpu
        await redis.flushall()
    return {"enqueue_many": many / many_cpu, "enqueue": ones / one_cpu}


async def drive_coredis(url: str, n: int, partitions: int) -> float:
    """XREADGROUP COUNT 500 + XACK per partition on a coredis client (via App.redis)."""
    from streamkit import App

    ticks = _Ticks()
    async with App("bench-bare", redis_url=url) as app:
        await app.redis.flushall()
        stream = _stream(app, "bare", ticks, partitions)
        await stream.send_many(ticks.make(n))
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
        elapsed = time.perf_counter() - began
        await redis.flushall()
    assert done == n, done
    return n / elapsed


async def drive_worker(
    url: str, n: int, partitions: int, mode: Literal["records", "take"]
) -> tuple[float, float]:
    """One worker with one trivial processor: events/s from the first event to the last,
    and the seconds from starting the worker to its first event."""
    from streamkit import App, Events, run_worker

    ticks = _Ticks()
    app = App(f"bench-{mode}", redis_url=url)
    stream = _stream(app, "ticks", ticks, partitions)
    done = 0
    first = last = 0.0
    finished = trio.Event()

    @app.processor(stream)
    async def process(events: Events[Record]) -> None:
        nonlocal done, first, last
        if mode == "records":
            async for _ in events.records():
                if not done:
                    first = time.perf_counter()
                done += 1
                if done == n:
                    last = time.perf_counter()
                    finished.set()
        else:
            async for batch in events.take(BATCH, within=0.01):
                if not done:
                    first = time.perf_counter()
                done += len(batch)
                if done == n:
                    last = time.perf_counter()
                    finished.set()

    async with app:
        await app.redis.flushall()
        await stream.send_many(ticks.make(n))
        async with trio.open_nursery() as nursery:
            began = time.perf_counter()
            worker = await nursery.start(run_worker, app)
            await finished.wait()
            await worker.stop()
        await app.redis.flushall()
    # The first event's own batch is not timed: count the events after the first.
    return (n - 1) / (last - first), first - began


async def drive_consume(url: str, n: int, partitions: int) -> dict[str, float]:
    coredis = await drive_coredis(url, n, partitions)
    records, records_startup = await drive_worker(url, n, partitions, "records")
    take, take_startup = await drive_worker(url, n, partitions, "take")
    return {
        "coredis": coredis,
        "records": records,
        "take": take,
        "records_startup": records_startup,
        "take_startup": take_startup,
    }


async def drive(what: What, n: int, partitions: int) -> dict[str, float]:
    from streamkit.testing import RedisServer

    with RedisServer() as server, trio.fail_after(DRIVER_TIMEOUT):
        if what == "send":
            return {
                **await drive_send(server.url, n, partitions),
                **await drive_enqueue(server.url, n),
            }
        return await drive_consume(server.url, n, partitions)


def driver(what: What, n: int, partitions: int) -> None:
    import streamkit

    figures = trio.run(drive, what, n, partitions)
    print(json.dumps({"streamkit": streamkit.__file__, "what": what, **figures}))


# --- parent: worktree, alternating rounds, table ---------------------------------

FIGURES = [
    ("send_many", "send_many"),
    ("send", "send(), one record (per CPU s)"),
    ("enqueue_many", "enqueue_many, no-op jobs (per CPU s)"),
    ("enqueue", "enqueue, one job (per CPU s)"),
    ("records", "consume, worker, records()"),
    ("take", f"consume, worker, take({BATCH})"),
    ("coredis", f"bare coredis XREADGROUP COUNT {BATCH} + XACK"),
]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def run_driver(root: Path, what: What, n: int, partitions: int) -> dict[str, Any]:
    """Run this script as a driver with ``root``'s streamkit; its JSON line, checked."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    command = [sys.executable, str(SCRIPT), "--driver", "--what", what]
    command += ["--events", str(n), "--partitions", str(partitions)]
    done = subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, timeout=DRIVER_TIMEOUT + 60
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"driver ({what}, {root}) exited with code {done.returncode}:\n"
            f"{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
    line = next(ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{"))
    figures: dict[str, Any] = json.loads(line)
    imported = Path(figures["streamkit"]).resolve()
    if not imported.is_relative_to(root.resolve()):
        raise RuntimeError(f"driver for {root} imported streamkit from {imported}")
    return figures


def _version_label(repo: Path, ref: str) -> tuple[str, str]:
    commit = git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
    return commit, git(repo, "log", "-1", "--format=%h %s", commit)


def compare(baseline_ref: str, n: int, partitions: int, rounds: int) -> None:
    repo = Path(git(SCRIPT.parent, "rev-parse", "--show-toplevel"))
    commit, baseline_label = _version_label(repo, baseline_ref)
    head = git(repo, "log", "-1", "--format=%h")
    dirty = git(repo, "status", "--porcelain", "--", "streamkit")
    current_label = f"working tree at {head}" + (
        " with uncommitted changes in streamkit/" if dirty else ""
    )
    tmp = Path(tempfile.mkdtemp(prefix="streamkit-bench-versions-"))
    worktree = tmp / "baseline"
    git(repo, "worktree", "add", "--detach", str(worktree), commit)
    roots = {"baseline": worktree, "current": repo}
    results: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
    files: dict[str, str] = {}
    try:
        for round_ in range(1, rounds + 1):
            for version in ("baseline", "current"):
                figures: dict[str, Any] = {}
                for what in ("send", "consume"):
                    got = run_driver(roots[version], what, n, partitions)
                    files[version] = got.pop("streamkit")
                    got.pop("what")
                    figures.update(got)
                results[version].append(figures)
                print(
                    f"  round {round_} {version:<8}: send_many {figures['send_many']:,.0f}/s | "
                    f"send() {figures['send']:,.0f} | enqueue_many {figures['enqueue_many']:,.0f}"
                    f" | enqueue {figures['enqueue']:,.0f} | "
                    f"records() {figures['records']:,.0f}/s | take({BATCH}) "
                    f"{figures['take']:,.0f}/s | coredis {figures['coredis']:,.0f}/s",
                    flush=True,
                )
    finally:
        removed = subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", str(worktree)],
            capture_output=True,
            text=True,
        )
        if removed.returncode != 0:
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    report(results, files, baseline_label, current_label, n, partitions, rounds)


def report(
    results: dict[str, list[dict[str, Any]]],
    files: dict[str, str],
    baseline_label: str,
    current_label: str,
    n: int,
    partitions: int,
    rounds: int,
) -> None:
    print(
        f"streamkit before/after, measured in one run: {n:,} small events, {partitions} "
        f"partitions, 1 worker, {rounds} round{'s' if rounds != 1 else ''} alternating "
        "baseline/current"
    )
    print(f"  baseline: {baseline_label}")
    print(f"  current:  {current_label}")
    header = f"  {'per second, best of rounds':<44}{'baseline':>10}{'current':>10}"
    print(f"{header}{'median ratio':>14}  per-round ratios")
    for key, label in FIGURES:
        base = [r[key] for r in results["baseline"]]
        cur = [r[key] for r in results["current"]]
        ratios = [c / b for c, b in zip(cur, base, strict=True)]
        note = " (yardstick: no streamkit)" if key == "coredis" else ""
        print(
            f"  {label:<44}{max(base):>10,.0f}{max(cur):>10,.0f}"
            f"{statistics.median(ratios):>13.2f}x  "
            f"{' '.join(f'{r:.2f}' for r in ratios)}{note}"
        )
    startups = {
        version: {
            mode: statistics.median(r[f"{mode}_startup"] for r in results[version]) * 1000
            for mode in ("records", "take")
        }
        for version in results
    }
    print(
        "  worker start to first event, not timed (median): baseline "
        f"{startups['baseline']['records']:.0f} / {startups['baseline']['take']:.0f} ms, "
        f"current {startups['current']['records']:.0f} / {startups['current']['take']:.0f} ms "
        f"(records() / take({BATCH}))"
    )
    print(
        "  ratio = current / baseline; streamkit imported from: baseline "
        f"{_short(files['baseline'])}, current {_short(files['current'])}"
    )


def _short(path: str) -> str:
    # The baseline's temporary worktree path changes every run: keep its tail only.
    parts = Path(path).parts
    return str(Path("...", *parts[-3:])) if "streamkit-bench-versions-" in path else path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", metavar="REF", help="git ref to compare against")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--what", choices=["send", "consume"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        if args.what is None:
            parser.error("--driver needs --what send|consume")
        driver(args.what, args.events, args.partitions)
    elif args.baseline is None:
        parser.error("--baseline REF is required")
    else:
        try:
            compare(args.baseline, args.events, args.partitions, args.rounds)
        except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            detail = getattr(e, "stderr", None) or ""
            sys.exit(f"bench_versions: {e}\n{detail}".rstrip())


if __name__ == "__main__":
    main()
