"""The receipts demo: one receipt job, and one ``receipts_sent`` record, per order
through a kill -9.

A producer sends orders while two workers run ``examples.receipts.app:app``; midway
one worker is killed with -9 (the orders it had processed and not committed are
delivered again to the other, and the receipt jobs it was running are taken over). At
the end the queue holds one receipt job per order, each sent, and ``receipts_sent``
one record per order: the jobs were enqueued in the commit of their orders, and each
job emitted its record in the script that recorded its success.

Run it with ``./dev demo receipts`` (or ``python -m examples.receipts.demo`` in .venv).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import trio
from rich.console import Console

from streamkit.testing import RedisServer, wait_until

console = Console()

ORDERS = 3_000
BATCHES = 30
PACE = 0.1  # seconds between batches: 3 s of orders
ROOT = Path(__file__).resolve().parents[2]
WORKER_ENV = {
    # Short timings so the demo is quick; the defaults suit production.
    "STREAMKIT_HEARTBEAT_INTERVAL": "0.2",
    "STREAMKIT_SESSION_TIMEOUT": "2",
    "STREAMKIT_LEASE_TTL": "2",
    "STREAMKIT_JOB_LEASE_TTL": "2",
}


def start_worker(redis_url: str, log_dir: Path, number: int) -> subprocess.Popen[bytes]:
    log = (log_dir / f"worker-{number}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "streamkit", "worker", "examples.receipts.app:app"],
        cwd=ROOT,
        env={**os.environ, **WORKER_ENV, "STREAMKIT_REDIS_URL": redis_url},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def run_demo(redis_url: str, log_dir: Path) -> None:
    from examples.receipts.app import Order, app, orders, receipts_sent, send_receipt

    rng = random.Random(7)
    chunk = ORDERS // BATCHES
    sent: list[Order] = []
    workers: list[subprocess.Popen[bytes]] = []
    async with app:
        counts_key = app.job_queue.shard_keys[0].counts
        try:
            workers += [start_worker(redis_url, log_dir, 1), start_worker(redis_url, log_dir, 2)]
            console.print(f"workers 1 and 2 started (pids {workers[0].pid}, {workers[1].pid})")
            for number in range(BATCHES):
                batch = [
                    Order(
                        order_id=len(sent) + i,
                        customer=f"customer-{rng.randrange(200):03d}",
                        amount=round(rng.uniform(1, 100), 2),
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
                await trio.sleep(PACE)
            console.print(f"sent all {len(sent):,} orders; waiting for every receipt")

            async def all_sent() -> bool:
                counters: Any = await app.redis.hgetall(counts_key)
                return int(counters.get(f"success|{send_receipt.name}".encode(), 0)) >= len(sent)

            await wait_until(all_sent, what="every receipt sent", within=90)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    worker.kill()
        counters: Any = await app.redis.hgetall(counts_key)
        jobs = {k.decode(): int(v) for k, v in counters.items() if int(v)}
        announced: Counter[int] = Counter()
        for partition in range(receipts_sent.partition_count):
            entries: Any = await app.redis.xrange(receipts_sent.key(partition))
            for entry in entries:
                record = receipts_sent.codec.decode(entry.field_values, stream="receipts_sent")
                announced[record.order_id] += 1
    once = sum(1 for o in sent if announced[o.order_id] == 1)
    console.print(
        f"\norders sent: {len(sent):,}; receipt jobs in the queue: [bold]{jobs}[/]; "
        f"orders with exactly one receipts_sent record: [bold]{once:,}[/]"
    )
    ok = jobs == {f"success|{send_receipt.name}": len(sent)} and once == len(sent)
    console.print(
        "one receipt job per order, each sent once to receipts_sent, through the kill -9"
        if ok
        else "[red]receipts differ from the orders sent[/]"
    )
    if not ok:
        raise SystemExit(1)


def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="streamkit-receipts-demo-"))
    with RedisServer() as server:
        console.print(f"private Redis at [bold]{server.url}[/] (deleted when the demo ends)")
        console.print(f"worker logs in {logs}\n")
        os.environ["STREAMKIT_REDIS_URL"] = server.url
        trio.run(run_demo, server.url, logs)


if __name__ == "__main__":
    main()
