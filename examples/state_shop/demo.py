"""The state demo: exactly-once counts and windowed revenue through a kill -9.

A producer sends orders, stamped with the time they are sent, while two workers
process them; midway one worker is killed with -9 (the orders it had processed and not
committed are delivered again to the other) and a third joins. At the end the counts
per customer equal the orders sent, and each closed window's revenue was emitted
once, with the sum of its orders. So that windows close within the demo, they are 3
seconds long (``STATE_SHOP_WINDOW``) with a 10-second grace (``STATE_SHOP_GRACE``):
the example app itself uses minutes.

Run it with ``./dev demo state`` (or ``python -m examples.state_shop.demo`` in .venv).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio
from rich.console import Console
from rich.table import Table

from streamkit.testing import RedisServer, wait_until

console = Console()

ORDERS = 12_000
BATCHES = 60
PACE = 0.25  # seconds between batches: 15 s of orders
CUSTOMERS = [f"customer-{n:03d}" for n in range(200)]
SHOPS = ["berlin", "lisbon", "oslo", "rome"]
WINDOW = 3.0
GRACE = 10.0
ROOT = Path(__file__).resolve().parents[2]
WORKER_ENV = {
    # Short timings so the demo is quick; the defaults suit production.
    "STREAMKIT_HEARTBEAT_INTERVAL": "0.2",
    "STREAMKIT_SESSION_TIMEOUT": "2",
    "STREAMKIT_LEASE_TTL": "2",
    "STATE_SHOP_WINDOW": str(WINDOW),
    "STATE_SHOP_GRACE": str(GRACE),
}


def window_of(moment: datetime) -> datetime:
    """The start of the window ``moment`` falls in."""
    seconds = moment.timestamp()
    return datetime.fromtimestamp(seconds - seconds % WINDOW, UTC)


def start_worker(redis_url: str, log_dir: Path, number: int) -> subprocess.Popen[bytes]:
    log = (log_dir / f"worker-{number}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "streamkit", "worker", "examples.state_shop.app:app"],
        cwd=ROOT,
        env={**os.environ, **WORKER_ENV, "STREAMKIT_REDIS_URL": redis_url},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def run_demo(redis_url: str, log_dir: Path) -> None:
    from examples.state_shop.app import Order, app, order_counts, orders, per_minute

    rng = random.Random(7)
    chunk = ORDERS // BATCHES
    sent: list[Order] = []
    workers: list[subprocess.Popen[bytes]] = []
    async with app:
        try:
            workers += [start_worker(redis_url, log_dir, 1), start_worker(redis_url, log_dir, 2)]
            console.print(f"workers 1 and 2 started (pids {workers[0].pid}, {workers[1].pid})")
            for number in range(BATCHES):
                now = datetime.now(UTC)
                batch = [
                    Order(
                        order_id=len(sent) + i,
                        customer=rng.choice(CUSTOMERS),
                        shop=rng.choice(SHOPS),
                        amount=round(rng.uniform(1, 100), 2),
                        created_at=now,
                    )
                    for i in range(chunk)
                ]
                await orders.send_many(batch)
                sent.extend(batch)
                if number == BATCHES // 3:
                    workers[0].send_signal(signal.SIGKILL)
                    console.print(
                        f"sent {len(sent):,} orders; [bold]kill -9[/] worker 1 mid-processing"
                    )
                if number == BATCHES // 2:
                    workers.append(start_worker(redis_url, log_dir, 3))
                    console.print(f"worker 3 joins (pid {workers[-1].pid})")
                await trio.sleep(PACE)
            console.print(f"sent all {len(sent):,} orders; waiting for the last windows to close")
            windows = {window_of(o.created_at) for o in sent}

            customers = sorted({o.customer for o in sent})

            async def all_counted() -> bool:
                return sum(await order_counts.read_many(customers)) == len(sent)

            await wait_until(all_counted, what="every order counted", within=90)

            async def all_windows() -> bool:
                emitted = sum([await app.redis.xlen(per_minute.key(p)) for p in range(4)])
                return emitted >= len(windows) * len(SHOPS)

            # A quiet partition's event time moves on with the wall clock: the last
            # windows close about their grace after they end.
            await wait_until(all_windows, what="every window emitted", within=GRACE + 30)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    worker.kill()

        counted = await order_counts.read_many(sorted({o.customer for o in sent}))
        console.print(
            f"\norders sent: {len(sent):,}; counted over all customers: "
            f"[bold]{sum(counted):,}[/] (exactly once, through the kill -9)\n"
        )
        expected: dict[tuple[str, datetime], float] = defaultdict(float)
        for order in sent:
            expected[order.shop, window_of(order.created_at)] += order.amount
        emitted: dict[tuple[str, datetime], list[float]] = defaultdict(list)
        for partition in range(per_minute.partition_count):
            entries: Any = await app.redis.xrange(per_minute.key(partition))
            for entry in entries:
                result = per_minute.codec.decode(entry.field_values, stream="per_minute")
                emitted[result.shop, result.start].append(result.revenue)
        table = Table(
            title=f"revenue per shop and {WINDOW:g}-second window (each emitted once)",
            title_justify="left",
        )
        for column in ("window", *SHOPS):
            table.add_column(column, justify="right")
        wrong = 0
        for window in sorted(windows):
            cells = []
            for shop in SHOPS:
                got = emitted.get((shop, window), [])
                ok = len(got) == 1 and abs(got[0] - expected[shop, window]) < 1e-6
                wrong += not ok
                cells.append((f"{got[0]:,.2f}" if got else "-") + ("" if ok else " [red]✗[/]"))
            table.add_row(f"{window:%H:%M:%S}", *cells)
        console.print(table)
        console.print(
            "every window's revenue equals the sum of its orders, emitted once"
            if not wrong
            else f"[red]{wrong} windows differ from the orders sent[/]"
        )


def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="streamkit-state-demo-"))
    with RedisServer() as server:
        console.print(f"private Redis at [bold]{server.url}[/] (deleted when the demo ends)")
        console.print(f"worker logs in {logs}\n")
        os.environ["STREAMKIT_REDIS_URL"] = server.url
        trio.run(run_demo, server.url, logs)


if __name__ == "__main__":
    main()
