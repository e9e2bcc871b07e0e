"""An app for joins under faults: orders and payments joined within a window.

Orders and payments carry an order id (the key) and an event time ``at`` (ms, made up
by the producer, so that the results depend on nothing but what was sent and the order
it reached the join in). ``paid`` gets each order with each payment within
:data:`WITHIN` ms of it, and each order paid by none once its window closed (a left
join). :func:`model` computes, from the join's inner stream (the order its events
reached the join in), what ``paid`` must hold: compared with it after any fault, each
result is there exactly once.

``make_app()`` builds it for in-process use; the module-level ``app`` is for
``streamkit worker tests.apps.joined:app`` subprocesses.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

from streamkit import App, Events, Record, Stream, StreamJoin, Table
from streamkit._joins import unpack_forwarded
from streamkit._state_join_sides import HEARTBEAT, read_heartbeat

if TYPE_CHECKING:
    from collections.abc import Mapping

PARTITIONS = 4
WITHIN = 500
GRACE = 2000
HOW: Final = "left"


class Order(Record):
    order_id: int
    at: int


class Payment(Record):
    order_id: int
    at: int


def result(key: str, order: Order | None, payment: Payment | None) -> dict[str, Any]:
    return {
        "key": key,
        "order": None if order is None else order.at,
        "payment": None if payment is None else payment.at,
    }


Joined = tuple[
    App, Stream[Order], Stream[Payment], Stream[dict[str, Any]], StreamJoin[Order, Payment]
]
Result = tuple[str, int | None, int | None]


def forwarded_rows(fields: Mapping[Any, Any]) -> list[tuple[bytes, int, int]]:
    """An entry of the join's inner stream (a forwarder's batch) as the model takes
    it: each event's side, order id and event time (ms), as the forwarder wrote them;
    a side's heartbeat as its side, key :data:`BEAT` and time."""
    if HEARTBEAT in fields:
        side, at = read_heartbeat(fields[HEARTBEAT])
        return [(b"LR"[side : side + 1], BEAT, at)]
    return [(side, int(key), at) for side, key, at, _, _ in unpack_forwarded(fields[b"J"])]


#: The key of a heartbeat's row (see :func:`forwarded_rows`).
BEAT = -1


def make_app(**settings: Any) -> Joined:
    app = App("joined", **settings)
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=PARTITIONS)
    payments = app.stream(
        "payments", record=Payment, partition_by="order_id", partition_count=PARTITIONS
    )
    paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"], partition_count=2)
    join = app.join(
        "pay",
        orders,
        payments,
        within=WITHIN / 1000,
        grace=GRACE / 1000,
        how=HOW,
        output=paid,
        left_time=lambda o: o.at / 1000,
        right_time=lambda p: p.at / 1000,
        result=result,
        idle=False,
        batch_size=int(os.environ.get("JOINED_BATCH", "50")),
    )
    add_tables(app, orders, payments)
    return app, orders, payments, paid, join


def add_tables(app: App, orders: Stream[Order], payments: Stream[Payment]) -> None:
    """Beside the join: each side's events counted per order id, the two counts joined
    (``counted``, an outer table join), and the payments' counts in a global table
    (``payments_seen``): after any fault, ``counted`` is both counts of each key and
    ``payments_seen`` the payments' counts."""
    batch = int(os.environ.get("JOINED_BATCH", "50"))
    order_counts: Table[int] = app.table("order_counts", value=int, default=0)
    payment_counts: Table[int] = app.table("payment_counts", value=int, default=0)
    seen: Table[int] = app.global_table("payments_seen", value=int, batch_size=batch)

    @app.processor(orders, tables=[order_counts], batch_size=batch)
    async def count_orders(events: Events[Order]) -> None:
        async for order in events.records():
            order_counts.set(order.order_id, await order_counts.get(order.order_id) + 1)

    @app.processor(payments, tables=[payment_counts, seen], batch_size=batch)
    async def count_payments(events: Events[Payment]) -> None:
        async for payment in events.records():
            count = await payment_counts.get(payment.order_id) + 1
            payment_counts.set(payment.order_id, count)
            seen.set(payment.order_id, count)

    app.join_tables("counted", order_counts, payment_counts, how="outer", batch_size=batch)


app = make_app()[0]


def model(
    forwarded: list[list[tuple[bytes, int, int]]],
    *,
    within: int = WITHIN,
    grace: int = GRACE,
    how: str = HOW,
) -> Counter[Result]:
    """What the join emits for events that reached it in this order, per partition:
    ``(side, key, at)`` each. The join's semantics, one event at a time: an event at
    or behind its own side's newest time by ``within + grace`` is late; two events of
    the two sides meet if they are ``within`` apart and neither's side had passed the
    other's window when it came; the watermark, which closes windows, is the newest
    time both sides have reached, by their events and heartbeats."""
    span = within + grace
    out: Counter[Result] = Counter()
    for entries in forwarded:
        seen = {b"L": float("-inf"), b"R": float("-inf")}
        buffers: dict[tuple[bytes, int], list[list[Any]]] = {}
        for side, key, at in entries:
            reached = seen[side]
            seen[side] = max(reached, at)
            if key == BEAT or at + span <= reached:
                continue  # a heartbeat; or late: it matches nothing, and is dropped
            other = buffers.get((b"R" if side == b"L" else b"L", key), [])
            met = [
                o
                for o in other
                if abs(o[0] - at) <= within and o[0] + span > reached and at + span > o[2]
            ]
            for o in met:
                o[1] = True
                pair = (at, o[0]) if side == b"L" else (o[0], at)
                out[str(key), pair[0], pair[1]] += 1
            buffers.setdefault((side, key), []).append([at, bool(met), reached])
        watermark = min(seen.values())
        for (side, key), events in buffers.items():
            emits = how == "outer" or (how == "left" and side == b"L")
            for at, matched, _ in events:
                if emits and not matched and at + span <= watermark:
                    pair = (at, None) if side == b"L" else (None, at)
                    out[str(key), pair[0], pair[1]] += 1
    return out
