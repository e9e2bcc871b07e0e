"""The joins demo: orders joined with their payments, each result once, through a kill -9.

A producer sends orders and payments as they happen, stamped with their event times:
most orders are paid within the window, some payments arrive before their orders
(the order's event is held up on its way), some come too late (after the window),
some orders are never paid. Two workers run the join; midway one is killed with -9
(what it had forwarded or joined and not committed is delivered again to the other)
and a third joins. At the end every order paid within the window was emitted once
with its payment, and every other order once with none, when its window closed; the
tally's tables count them. So that windows close within the demo, the window is 2
seconds (``JOINS_SHOP_WINDOW``) with an 8-second grace (``JOINS_SHOP_GRACE``), longer
than a dead worker's partitions take to move: the example app itself uses minutes.

Run it with ``./dev demo joins`` (or ``python -m examples.joins_shop.demo`` in .venv).
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from rich.console import Console
from rich.table import Table

from streamkit.lowlevel import read_membership
from streamkit.testing import RedisServer, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from examples.joins_shop.app import Order, Payment, Settled

console = Console()

ORDERS = 3_000
DURATION = 12.0  # seconds of orders
PACE = 0.1  # seconds between the producer's rounds
CUSTOMERS = [f"customer-{n:02d}" for n in range(50)]
WINDOW = 2.0
GRACE = 8.0
ROOT = Path(__file__).resolve().parents[2]
WORKER_ENV = {
    # Short timings so the demo is quick; the defaults suit production.
    "STREAMKIT_HEARTBEAT_INTERVAL": "0.2",
    "STREAMKIT_SESSION_TIMEOUT": "2",
    "STREAMKIT_LEASE_TTL": "2",
    "JOINS_SHOP_WINDOW": str(WINDOW),
    "JOINS_SHOP_GRACE": str(GRACE),
}
#: The kinds of orders, and their shares (:func:`plan` draws each one's timings).
KINDS = {
    "paid in the window": 0.60,
    "paid before it arrived": 0.15,
    "paid too late": 0.10,
    "never paid": 0.15,
}


def plan(rng: random.Random, start: datetime) -> list[tuple[float, Order | Payment, str]]:
    """The producer's script: ``(seconds from start, record, kind)``, by time sent.
    Event times are when things happen; an order held up reaches its stream late."""
    # Imported here: the app reads STREAMKIT_REDIS_URL when it is created.
    from examples.joins_shop.app import Order, Payment

    sends: list[tuple[float, Order | Payment, str]] = []
    for order_id in range(ORDERS):
        at = DURATION * order_id / ORDERS
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        delay = {
            "paid in the window": rng.uniform(0.1, 0.7 * WINDOW),
            "paid before it arrived": rng.uniform(0.1, 0.4),
            "paid too late": WINDOW + rng.uniform(0.5, 2.0),
            "never paid": None,
        }[kind]
        held_up = rng.uniform(0.8, 1.5) if kind == "paid before it arrived" else 0.0
        created = start + timedelta(seconds=at)
        amount = round(rng.uniform(5, 200), 2)
        customer = rng.choice(CUSTOMERS)
        order = Order(order_id=order_id, customer=customer, amount=amount, created_at=created)
        sends.append((at + held_up, order, kind))
        if delay is not None:
            paid_at = created + timedelta(seconds=delay)
            sends.append(
                (at + delay, Payment(order_id=order_id, amount=amount, paid_at=paid_at), kind)
            )
    sends.sort(key=lambda send: send[0])
    return sends


def expected(sent: Iterable[Order | Payment], within: timedelta) -> dict[int, bool]:
    """Whether each order sent must be emitted with its payment (the two at most
    ``within`` apart in event time) or alone, when its window closed (one payment per
    order at most)."""
    from examples.joins_shop.app import Order

    created = {r.order_id: r.created_at for r in sent if isinstance(r, Order)}
    paid = {r.order_id: r.paid_at for r in sent if not isinstance(r, Order)}
    return {
        order_id: order_id in paid and abs(paid[order_id] - at) <= within
        for order_id, at in created.items()
    }


def problems(paid: Mapping[int, bool], results: Iterable[Settled]) -> dict[int, str]:
    """What is wrong with the join's results, by order id: each order must be emitted
    exactly once, with its own payment if ``paid`` says so, else with ``None``."""
    got: dict[int, list[Settled]] = defaultdict(list)
    for result in results:
        got[result.order.order_id].append(result)
    wrong: dict[int, str] = {}
    for order_id in paid.keys() | got.keys():
        emitted = got.get(order_id, [])
        if order_id not in paid:
            wrong[order_id] = "emitted, never sent"
        elif len(emitted) != 1:
            wrong[order_id] = f"emitted {len(emitted)} times"
        elif paid[order_id] != (emitted[0].payment is not None):
            wrong[order_id] = "paired" if emitted[0].payment is not None else "unpaid"
        elif (payment := emitted[0].payment) is not None and payment.order_id != order_id:
            wrong[order_id] = f"paired with the payment of order {payment.order_id}"
    return wrong


def start_worker(redis_url: str, log_dir: Path, number: int) -> subprocess.Popen[bytes]:
    log = (log_dir / f"worker-{number}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "streamkit", "worker", "examples.joins_shop.app:app"],
        cwd=ROOT,
        env={**os.environ, **WORKER_ENV, "STREAMKIT_REDIS_URL": redis_url},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def read_results(app: Any, stream: Any) -> list[Settled]:
    results: list[Settled] = []
    for partition in range(stream.partition_count):
        entries: Any = await app.redis.xrange(stream.key(partition))
        results += [stream.codec.decode(e.field_values, stream=stream.name) for e in entries]
    return results


async def run_demo(redis_url: str, log_dir: Path) -> bool:
    from examples.joins_shop.app import (
        Order,
        app,
        orders,
        paid_orders,
        payments,
        settled,
        unpaid_orders,
    )

    sent: list[Order | Payment] = []
    kinds: dict[int, str] = {}  # each order's kind (see KINDS)
    workers: list[subprocess.Popen[bytes]] = []
    async with app:

        async def owned(pid: int, processor: str) -> tuple[int, ...]:
            """The partitions of ``processor`` worker ``pid`` owns."""
            snapshot = await read_membership(app.redis, app.processors[processor].group)
            if snapshot is None:
                return ()
            ids = [m.id for m in snapshot.members if m.pid == pid]
            return snapshot.assignment.of(ids[0]) if ids else ()

        async def running(pid: int) -> bool:
            """Whether worker ``pid`` owns partitions of every processor: the join's
            two forwarders (``paid__left``, ``paid__right``), the join, the tally."""
            return all([await owned(pid, name) for name in app.processors])

        try:
            workers += [start_worker(redis_url, log_dir, 1), start_worker(redis_url, log_dir, 2)]
            for worker in workers:
                ready = functools.partial(running, worker.pid)
                await wait_until(ready, what="workers 1 and 2 to start", within=60)
            mine = await owned(workers[0].pid, "paid")
            console.print(
                f"workers 1 and 2 running (pids {workers[0].pid}, {workers[1].pid}); "
                f"worker 1 joins {len(mine)} of 8 partitions"
            )
            start = datetime.now(UTC)
            sends = plan(random.Random(7), start)
            kinds.update((r.order_id, kind) for _, r, kind in sends if isinstance(r, Order))
            began = trio.current_time()
            killed = joined = False
            while len(sent) < len(sends):
                elapsed = trio.current_time() - began
                due = [r for at, r, _ in sends[len(sent) :] if at <= elapsed]
                await orders.send_many([r for r in due if isinstance(r, Order)])
                await payments.send_many([r for r in due if not isinstance(r, Order)])
                sent += due
                if not killed and elapsed >= DURATION / 3:
                    killed = True
                    workers[0].send_signal(signal.SIGKILL)
                    console.print(
                        f"sent {len(sent):,} orders and payments; [bold]kill -9[/] worker 1 "
                        "mid-join"
                    )
                if not joined and elapsed >= DURATION / 2:
                    joined = True
                    workers.append(start_worker(redis_url, log_dir, 3))
                    console.print(f"worker 3 joins (pid {workers[-1].pid})")
                await trio.sleep(PACE)
            console.print(
                f"sent all {ORDERS:,} orders and {len(sent) - ORDERS:,} payments; waiting for "
                "the last windows to close"
            )

            async def all_settled() -> bool:
                results = sum([await app.redis.xlen(settled.key(p)) for p in range(4)])
                return results >= ORDERS

            # A quiet partition's event time moves on with the wall clock: the last
            # orders are emitted unpaid about the window and the grace after their time.
            await wait_until(all_settled, what="every order settled", within=WINDOW + GRACE + 40)

            async def all_tallied() -> bool:
                counts = await paid_orders.read_many(CUSTOMERS)
                counts += await unpaid_orders.read_many(CUSTOMERS)
                return sum(counts) >= ORDERS

            await wait_until(all_tallied, what="every result tallied", within=30)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    worker.kill()

        must = expected(sent, timedelta(seconds=WINDOW))
        results = await read_results(app, settled)
        wrong = problems(must, results)
        table = Table(
            title=f"orders joined with payments within {WINDOW:g} s (grace {GRACE:g} s)",
            title_justify="left",
        )
        for column in ("orders", "sent", "emitted paid", "emitted unpaid", "wrong"):
            table.add_column(column, justify="left" if column == "orders" else "right")
        for kind in KINDS:
            ids = [i for i, k in kinds.items() if k == kind]
            pairs = sum(
                1 for r in results if kinds.get(r.order.order_id) == kind and r.payment is not None
            )
            alone = sum(
                1 for r in results if kinds.get(r.order.order_id) == kind and r.payment is None
            )
            bad = sum(1 for i in ids if i in wrong)
            table.add_row(
                kind, f"{len(ids):,}", f"{pairs:,}", f"{alone:,}", f"[red]{bad}[/]" if bad else "0"
            )
        console.print()
        console.print(table)
        paid_total = sum(await paid_orders.read_many(CUSTOMERS))
        unpaid_total = sum(await unpaid_orders.read_many(CUSTOMERS))
        paid_must = sum(must.values())
        tallied = paid_total == paid_must and unpaid_total == len(must) - paid_must
        console.print(
            f"tally: paid_orders {paid_total:,}, unpaid_orders {unpaid_total:,} "
            f"(expected {paid_must:,} and {len(must) - paid_must:,})"
            + ("" if tallied else " [red]✗[/]")
        )
        for order_id in sorted(wrong)[:10]:
            console.print(f"[red]order {order_id} ({kinds.get(order_id)}): {wrong[order_id]}[/]")
        ok = not wrong and tallied
        console.print(
            "each order emitted once: with its payment if paid in the window, else alone"
            if ok
            else f"[red]{len(wrong)} orders settled wrongly[/]"
        )
        return ok


def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="streamkit-joins-demo-"))
    with RedisServer() as server:
        console.print(f"private Redis at [bold]{server.url}[/] (deleted when the demo ends)")
        console.print(f"worker logs in {logs}\n")
        os.environ["STREAMKIT_REDIS_URL"] = server.url
        ok = trio.run(run_demo, server.url, logs)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
