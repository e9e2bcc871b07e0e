"""A join's two sides: a side whose forwarder is down holds the windows open until its
events come; a side that is only quiet is moved on by heartbeats (see
``streamkit._state_join_sides``)."""

from __future__ import annotations

import logging
import math
from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from streamkit import App, ConfigError
from streamkit._joins import pack_forwarded
from streamkit._replay import apply_reset, plan_reset
from streamkit._state_join_sides import HEARTBEAT, Sides, heartbeat, read_heartbeat
from streamkit._worker import run_worker
from streamkit.clients import _ops
from streamkit.testing import wait_until
from tests.test_cli import streamkit
from tests.test_joins import FAST, Order, Payment, results

if TYPE_CHECKING:
    from streamkit import Redis, Stream


def shop(redis_url: str | None, *, idle: bool) -> tuple[App, Stream[Order], Stream[Payment], Any]:
    app = App("sides", redis_url=redis_url, **FAST)
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=1)
    payments = app.stream("payments", record=Payment, partition_by="order_id", partition_count=1)
    paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"], partition_count=1)
    app.join(
        "j",
        orders,
        payments,
        within=timedelta(seconds=1),
        grace=timedelta(seconds=0.5),
        how="left",
        output=paid,
        left_time="at",
        right_time="at",
        idle=idle,
    )
    return app, orders, payments, paid


async def heartbeats(redis: Redis, app: App) -> list[tuple[int, int]]:
    entries: Any = await redis.xrange(app.streams["j__in"].key(0))
    return [
        read_heartbeat(e.field_values[HEARTBEAT]) for e in entries if HEARTBEAT in e.field_values
    ]


async def test_a_side_whose_forwarder_is_down_holds_the_windows_open(
    redis_url: str, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # The trial's case: the worker of the right side's forwarder is gone, the payment
    # sent 0.3 s after its order waits in its stream. The idle rule must not close the
    # order's window (emitting it unmatched) while the payment has not reached the join.
    app, orders, payments, paid = shop(redis_url, idle=True)
    # Beside it, a join of the same window whose both sides run: its order, emitted
    # alone by the idle rule, shows that the first's window would have closed by then.
    others = app.stream("others", record=Order, partition_by="order_id", partition_count=1)
    nobody = app.stream("nobody", record=Payment, partition_by="order_id", partition_count=1)
    alone = app.stream("alone", record=dict, partition_by=lambda r: r["key"], partition_count=1)
    app.join(
        "k", others, nobody, within=1, grace=0.5, how="left", output=alone,
        left_time="at", right_time="at",
    )  # fmt: skip
    now = datetime.now(UTC)
    running = ["j", "j__left", "k", "k__left", "k__right"]
    async with trio.open_nursery() as nursery:
        first = await nursery.start(partial(run_worker, app, processors=running))
        await orders.send(Order(order_id=1, amount=10.0, at=now))
        # (its window closes 0.3 s after the first's)
        await others.send(Order(order_id=1, amount=10.0, at=now + timedelta(seconds=0.3)))
        await payments.send(Payment(order_id=1, paid=10.0, at=now + timedelta(seconds=0.3)))

        async def closed_beside() -> bool:
            return bool(await results(redis, alone))

        await wait_until(closed_beside, what="the other join's order alone", within=30)
        assert await results(redis, paid) == []
        caplog.set_level(logging.INFO, logger="streamkit.state")

        async def warned() -> bool:  # held for longer than a failover (2 s here)
            return any("holds the join's windows open" in r.getMessage() for r in caplog.records)

        await wait_until(warned, what="the stalled side said", within=30)
        (said,) = [r.getMessage() for r in caplog.records if "holds the join's" in r.getMessage()]
        assert said.startswith("join j, partition 0: the payments side holds the join's")
        assert "is a worker running j__right?" in said
        second = await nursery.start(partial(run_worker, app, processors=["j__right"]))

        async def emitted() -> bool:
            return bool(await results(redis, paid))

        await wait_until(emitted, what="the pair", within=30)

        async def moving() -> bool:
            return any("moves on again" in r.getMessage() for r in caplog.records)

        await wait_until(moving, what="the side said moving again", within=30)
        await second.stop()
        await first.stop()
    got = [(r["key"], r["left"]["order_id"], r["right"]) for r in await results(redis, paid)]
    assert got == [
        ("1", 1, {"order_id": 1, "paid": 10.0, "at": (now + timedelta(seconds=0.3)).isoformat()})
    ]


async def test_a_quiet_side_does_not_hold_the_other_back(redis_url: str, redis: Redis) -> None:
    # No payment at all, no idle rule: the orders' own times close their windows, the
    # payments' side moved on by a heartbeat once Redis says its forwarder has nothing.
    app, orders, _, paid = shop(redis_url, idle=False)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await orders.send(Order(order_id=1, amount=10.0, at=t0))
        await orders.send(Order(order_id=2, amount=20.0, at=t0 + timedelta(seconds=5)))

        async def emitted() -> bool:
            return bool(await results(redis, paid))

        await wait_until(emitted, what="order 1 unmatched", within=30)
        await worker.stop()
    assert [(r["key"], r["right"]) for r in await results(redis, paid)] == [("1", None)]
    # What moved the right side on is in the inner stream: a replay sees it too.
    assert (1, int((t0 + timedelta(seconds=5)).timestamp() * 1000)) in await heartbeats(redis, app)


def test_the_sides_state_survives_its_stored_form() -> None:
    sides = Sides(("a", "g"), ("b", "h"), None)  # type: ignore[arg-type]
    assert sides.stored() is None  # nothing yet: nothing to write
    sides.seen[0] = 1767225600000
    sides.promote()
    stored = sides.stored()
    assert stored == "1767225600000 -"
    assert sides.stored() is None  # written once
    again = Sides(("a", "g"), ("b", "h"), None)  # type: ignore[arg-type]
    again.load(stored.encode())
    assert again.seen == [1767225600000, -math.inf]
    assert again.limit() == -math.inf
    again.seen[1] = 5
    again.discard()  # an event in flight failed: forgotten
    assert again.seen == [1767225600000, -math.inf]
    assert read_heartbeat(heartbeat(1, 42)) == (1, 42)


def test_an_event_time_field_is_checked_where_the_join_is_declared() -> None:
    app = App("times")
    orders = app.stream("orders", record=Order, partition_by="order_id")
    payments = app.stream("payments", record=Payment, partition_by="order_id")
    paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"])
    with pytest.raises(ConfigError, match=r"Order .* has no field 'nope'"):
        app.join("j", orders, payments, within=1, output=paid, left_time="nope")
    with pytest.raises(ConfigError, match="expected a field name, a function or None"):
        app.join("j", orders, payments, within=1, output=paid, right_time=5)  # type: ignore[arg-type]
    app.join("j", orders, payments, within=1, output=paid, left_time="at", right_time="at")


async def test_a_dict_record_s_time_field_is_its_key_and_a_bad_time_is_named(
    redis_url: str, redis: Redis
) -> None:
    app = App("dicts", redis_url=redis_url, **FAST)
    orders = app.stream("orders", record=dict, partition_by=lambda r: r["id"], partition_count=1)
    pays = app.stream("pays", record=dict, partition_by=lambda r: r["id"], partition_count=1)
    out = app.stream("out", record=dict, partition_by=lambda r: r["key"], partition_count=1)
    join = app.join(
        "j", orders, pays, within=5, how="left", output=out, left_time="t", right_time="t"
    )
    forwarded = join.forwarder(b"L")
    assert forwarded([b"1-0"], [[b"d", b"{}"]], [{"id": 1, "t": 1767225600.5}])[0][0] == (
        1767225600500
    )
    with pytest.raises(ConfigError, match=r"join 'j', left_time.*entry 2-0 of orders.*'garbage'"):
        forwarded([b"2-0"], [[b"d", b"{}"]], [{"id": 1, "t": "garbage"}])
    with pytest.raises(ConfigError, match=r"join 'j', left_time.*entry 3-0 of orders.*'t'"):
        forwarded([b"3-0"], [[b"d", b"{}"]], [{"id": 1}])


def test_the_clients_refuse_a_stream_join_as_a_table() -> None:
    app, _, _, _ = shop("redis://127.0.0.1:1", idle=False)
    join: Any = app.processors["j"].tables[0]
    # (What the blocking and asyncio clients run: refused before any call to Redis.)
    for op in (
        lambda: next(_ops.table_read(join, 1, None)),
        lambda: next(_ops.table_page(join, 0, 0)),
        lambda: _ops.table_partitions(join, None),
        lambda: next(_ops.table_sizes(join)),
    ):
        with pytest.raises(ConfigError, match="is a stream-stream join, not a table"):
            op()


#: For the CLI (``tests.test_joins_sides:j__in``).
CLI_APP = shop(None, idle=False)[0]  # (its Redis: the --redis-url the CLI is given)


async def test_streamkit_read_shows_a_join_s_inner_entries(redis_url: str, redis: Redis) -> None:
    key = CLI_APP.streams["j__in"].key(0)
    forwarded = [
        (1767225600000, b"7", 0, b'{"order_id":7}'),
        (1767225600500, b"8", 1, b'["x","y"]'),
    ]
    (packed,) = pack_forwarded(b"L", forwarded)
    await redis.xadd(key, {b"J": packed})
    await redis.xadd(key, {HEARTBEAT: heartbeat(1, 1767225601000)})
    shown = await streamkit("read", "tests.test_joins_sides:j__in", "--json", redis_url=redis_url)
    assert shown.code == 0, shown.err
    rows = [orjson.loads(line) for line in shown.out.splitlines()]
    assert [{k: v for k, v in r.items() if k not in ("id", "partition")} for r in rows] == [
        {
            "side": "left",
            "key": "7",
            "time": "2026-01-01T00:00:00.000+00:00",
            "record": {"order_id": 7},
        },
        {
            "side": "left",
            "key": "8",
            "time": "2026-01-01T00:00:00.500+00:00",
            "record": {"fields": ["x", "y"]},
        },
        {"heartbeat": "right", "time": "2026-01-01T00:00:01.000+00:00"},
    ]
    one = await streamkit("read", "tests.test_joins_sides:j__in", "--key", "8", redis_url=redis_url)
    assert one.code == 0, one.err
    assert one.out.splitlines()[0].endswith(
        'left 8 at 2026-01-01T00:00:00.500+00:00: {"fields":["x","y"]}'
    )
    assert len(one.out.splitlines()) == 1


async def test_a_join_s_reset_counts_its_inner_entries_as_entries(
    redis_url: str, redis: Redis
) -> None:
    key = CLI_APP.streams["j__in"].key(0)
    (packed,) = pack_forwarded(b"L", [(1767225600000, b"7", 0, b'{"order_id":7}')] * 3)
    await redis.xadd(key, {b"J": packed})
    await redis.xadd(key, {HEARTBEAT: heartbeat(1, 1767225601000)})
    asked = await streamkit(
        "reset", "tests.test_joins_sides:CLI_APP", "j", "--to", "start", "--state", "clear",
        redis_url=redis_url, stdin=b"n\n",
    )  # fmt: skip
    assert "2 entries (each a forwarder's batch of events, or a side's heartbeat)" in asked.err, (
        asked.err
    )


async def test_a_replay_of_the_join_emits_what_the_first_run_did(
    redis_url: str, redis: Redis
) -> None:
    # Orders first, the payments' side quiet (heartbeats move it on, some orders close
    # alone), then payments, some late by then: what the replay emits depends on where
    # the watermark was at each entry, which the heartbeats in the inner stream say.
    app, orders, payments, paid = shop(redis_url, idle=False)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    processor: Any = app.processors["j"]

    def seen(rows: list[dict[str, Any]]) -> Counter[tuple[str, Any, Any]]:
        return Counter(
            (r["key"], r["left"] and r["left"]["at"], r["right"] and r["right"]["at"]) for r in rows
        )

    async def run_until(count: int) -> list[dict[str, Any]]:
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)

            async def closed() -> bool:  # the closing pair, the last result
                return sum(1 for r in await results(redis, paid) if r["key"] == "99") >= count

            await wait_until(closed, what="the closing pair", within=30)
            await worker.stop()
        return await results(redis, paid)

    async with app:
        for n in range(1, 21):
            await orders.send(Order(order_id=n, amount=1.0, at=t0 + timedelta(seconds=n)))
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)

        async def alone() -> bool:
            return len(await results(redis, paid)) >= 5

        await wait_until(alone, what="orders closed alone", within=30)
        await worker.stop()
    async with app:
        for n in range(5, 25):
            await payments.send(Payment(order_id=n, paid=1.0, at=t0 + timedelta(seconds=n + 0.2)))
        await orders.send(Order(order_id=99, amount=1.0, at=t0 + timedelta(hours=1)))
        await payments.send(Payment(order_id=99, paid=1.0, at=t0 + timedelta(hours=1)))
    first = seen(await run_until(1))
    assert await heartbeats(redis, app)  # (what the replay must read to be exact)
    assert ("3", (t0 + timedelta(seconds=3)).isoformat(), None) in first
    assert any(left and right for _, left, right in first)
    async with app:
        plan = await plan_reset(app, processor, to="start", state="clear")
        await apply_reset(app, processor, plan)
    before = len(await results(redis, paid))
    again = seen((await run_until(2))[before:])
    assert again == first
