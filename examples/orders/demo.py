"""The README demo: the orders example end to end, on a private throwaway Redis.

A producer sends orders while one worker processes them; a second worker joins midway
and the partitions rebalance; at the end both workers stop gracefully and a summary
shows who processed what, and that no customer's orders were ever out of order.

Run it with ``./dev demo`` (or ``python -m examples.orders.demo`` inside .venv).
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trio
from rich.console import Console
from rich.table import Table

from streamkit.lowlevel import read_membership
from streamkit.testing import RedisServer, wait_until

console = Console()

ORDERS = 20_000
BATCHES = 40
CUSTOMERS = [f"customer-{n:03d}" for n in range(100)]
ROOT = Path(__file__).resolve().parents[2]
WORKER_ENV = {
    # Short timings so the demo is quick; the defaults suit production.
    "STREAMKIT_HEARTBEAT_INTERVAL": "0.2",
    "STREAMKIT_SESSION_TIMEOUT": "3",
    "STREAMKIT_LEASE_TTL": "3",
}


def start_worker(redis_url: str, log_dir: Path, number: int) -> subprocess.Popen[bytes]:
    log = (log_dir / f"worker-{number}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "streamkit", "worker", "examples.orders.app:app"],
        cwd=ROOT,
        env={**os.environ, **WORKER_ENV, "STREAMKIT_REDIS_URL": redis_url},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def label(worker: str, pids: dict[int, str]) -> str:
    pid = int(worker.rsplit(":", 1)[1])
    return pids.get(pid, worker)


async def run_demo(redis_url: str, log_dir: Path) -> None:
    # Imported here: the app reads STREAMKIT_REDIS_URL when it is created.
    from examples.orders.app import STATS, TOTALS, Order, app, orders

    group = app.processors["totals"].group
    rng = random.Random(7)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    batch = [
        Order(
            order_id=i,
            customer=rng.choice(CUSTOMERS),
            amount=round(rng.uniform(1, 500), 2),
            created_at=start + timedelta(seconds=i),
        )
        for i in range(ORDERS)
    ]
    pids: dict[int, str] = {}
    workers: list[subprocess.Popen[bytes]] = []
    async with app:
        redis = app.redis

        async def members() -> int:
            snapshot = await read_membership(redis, group)
            return 0 if snapshot is None else len(snapshot.members)

        async def joined(count: int) -> bool:
            return await members() >= count

        async def holds_its_partitions(pid: int) -> bool:
            """Whether worker ``pid`` holds the lease of every partition assigned to it."""
            snapshot = await read_membership(redis, group)
            assert snapshot is not None
            [member] = [m for m in snapshot.members if m.pid == pid]
            for partition in snapshot.assignment.of(member.id):
                holder = await redis.get(f"__lock:{{orders_demo.orders.{partition}}}.totals")
                if holder is None or f":{pid}:" not in holder.decode():
                    return False
            return True

        try:
            first = start_worker(redis_url, log_dir, 1)
            workers.append(first)
            pids[first.pid] = "worker 1"
            # Another process's state: polled (there is nothing to watch).
            await wait_until(functools.partial(joined, 1), what="worker 1 to join", within=30)
            console.print(f"worker 1 (pid {first.pid}) joined and owns all 8 partitions")

            chunk = ORDERS // BATCHES
            began = time.perf_counter()
            resumed = 0.0
            for number in range(BATCHES):
                await orders.send_many(batch[number * chunk : (number + 1) * chunk])
                if number == BATCHES // 4:
                    second = start_worker(redis_url, log_dir, 2)
                    workers.append(second)
                    pids[second.pid] = "worker 2"
                    sent = (number + 1) * chunk
                    console.print(f"sent {sent:,} orders; starting worker 2 (pid {second.pid})")
                if number == BATCHES // 2:
                    # Keep half of the orders for after the join, however slowly
                    # worker 2 starts, so that the rebalance is visible.
                    # Checked every 5 ms: that is the precision of the time measured.
                    await wait_until(
                        functools.partial(joined, 2),
                        what="worker 2 to join",
                        within=60,
                        interval=0.005,
                    )
                    joined_at = time.perf_counter()
                    await wait_until(
                        functools.partial(holds_its_partitions, second.pid),
                        what="worker 2 to hold its partitions",
                        within=60,
                        interval=0.005,
                    )
                    resumed = time.perf_counter() - joined_at
                await trio.sleep(0.05)
            console.print(f"sent all {ORDERS:,} orders in {time.perf_counter() - began:.1f}s")

            snapshot = await read_membership(redis, group)
            assert snapshot is not None
            table = Table(title="after the rebalance", title_justify="left")
            table.add_column("worker")
            table.add_column("partitions")
            for member in snapshot.members:
                owner = label(f"{member.host}:{member.pid}", pids)
                table.add_row(owner, ", ".join(map(str, snapshot.assignment.of(member.id))))
            console.print(table)
            console.print(
                f"worker 2 held its partitions [bold]{resumed * 1000:.0f} ms[/] after it joined; "
                f"worker 1 processed its own partitions without a pause"
            )

            stats: dict[str, int] = {}

            async def all_processed() -> bool:
                stats.update({k.decode(): int(v) for k, v in (await redis.hgetall(STATS)).items()})
                return sum(v for k, v in stats.items() if k.startswith("processed by")) >= ORDERS

            await wait_until(all_processed, what=f"all {ORDERS:,} orders processed", within=60)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    worker.kill()
        codes = [worker.returncode for worker in workers]
        console.print(f"\nboth workers stopped on SIGTERM (exit codes {codes})\n")

        summary = Table(title="summary", title_justify="left")
        summary.add_column("")
        summary.add_column("orders", justify="right")
        summary.add_row("sent", f"{ORDERS:,}")
        for key, value in sorted(stats.items()):
            if key.startswith("processed by "):
                summary.add_row(f"processed by {label(key[13:], pids)}", f"{value:,}")
        summary.add_row("out of order", f"{stats.get('out of order', 0):,}")
        # Redeliveries are not reorders: a worker killed (-9) before acknowledging
        # leaves orders that its successor processes again, first and in order.
        summary.add_row("redelivered (processed again)", f"{stats.get('redelivered', 0):,}")
        console.print(summary)
        totals = {k.decode(): float(v) for k, v in (await redis.hgetall(TOTALS)).items()}
        expected = sum(order.amount for order in batch)
        console.print(
            f"total amount over {len(totals)} customers: {sum(totals.values()):,.2f} "
            f"(sent: {expected:,.2f})"
        )


def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="streamkit-demo-"))
    with RedisServer() as server:
        console.print(f"private Redis at [bold]{server.url}[/] (deleted when the demo ends)")
        console.print(f"worker logs in {logs}\n")
        os.environ["STREAMKIT_REDIS_URL"] = server.url
        trio.run(run_demo, server.url, logs)


if __name__ == "__main__":
    main()
