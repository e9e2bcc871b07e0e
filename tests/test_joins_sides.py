"""A join's two sides: a side whose forwarder is down holds the windows open until its
events come; a side that is only quiet is moved on by heartbeats with the idle rule,
by its events alone without it; what meets does not depend on how the sides
interleave (see ``streamkit._state_join_sides`` and ``streamkit._state_joins``)."""

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
from hypothesis import given, settings, strategies as st

from streamkit import App, ConfigError
from streamkit._cli._fleet import take_snapshot
from streamkit._joins import pack_forwarded
from streamkit._replay import apply_reset, plan_reset
from streamkit._state_join_sides import (
    _CAUGHT_UP,
    HEARTBEAT,
    Sides,
    heartbeat,
    read_heartbeat,
)
from streamkit._worker import run_worker
from streamkit.clients import _ops
from streamkit.testing import wait_until
from tests.apps.joined import model
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
    # No payment at all: the orders' own times close their windows, the payments' side
    # moved on by a heartbeat once Redis says its forwarder has nothing.
    app, orders, _, paid = shop(redis_url, idle=True)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await orders.send(Order(order_id=1, amount=10.0, at=t0))
        await orders.send(Order(order_id=2, amount=20.0, at=t0 + timedelta(seconds=5)))

        async def emitted() -> bool:
            return bool(await results(redis, paid))

        await wait_until(emitted, what="order 1 unmatched", within=30)
        await worker.stop()
    # (order 2 too, maybe, by the idle rule by then)
    assert ("1", None) in [(r["key"], r["right"]) for r in await results(redis, paid)]
    # What moved the right side on is in the inner stream: a replay sees it too.
    assert (1, int((t0 + timedelta(seconds=5)).timestamp() * 1000)) in await heartbeats(redis, app)


async def test_without_the_idle_rule_only_a_side_s_events_move_it_on(
    redis_url: str, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # The trial's backfill: orders sent, the payments a while later. With idle=False
    # the payments' quiet side holds the orders' windows open (no heartbeat), so the
    # payments are not late when they come, however long after; said once it held
    # the partition for longer than a failover takes (2 s here).
    app, orders, payments, paid = shop(redis_url, idle=False)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    caplog.set_level(logging.INFO, logger="streamkit.state")
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await orders.send(Order(order_id=1, amount=10.0, at=t0))
        await orders.send(Order(order_id=2, amount=20.0, at=t0 + timedelta(seconds=5)))

        async def warned() -> bool:
            return any("has had no event" in r.getMessage() for r in caplog.records)

        await wait_until(warned, what="the quiet side said", within=30)
        (said,) = [r.getMessage() for r in caplog.records if "has had no event" in r.getMessage()]
        assert said.startswith("join j, partition 0: the payments side holds the join's")
        assert "idle=False" in said
        assert await results(redis, paid) == []
        assert await heartbeats(redis, app) == []
        await payments.send(Payment(order_id=1, paid=10.0, at=t0 + timedelta(seconds=0.5)))
        await payments.send(Payment(order_id=2, paid=20.0, at=t0 + timedelta(seconds=5.2)))

        async def emitted() -> bool:  # order 1's window closed by the payments' times
            return len(await results(redis, paid)) == 2

        await wait_until(emitted, what="both pairs", within=30)
        await worker.stop()
    got = sorted((r["key"], r["right"]["order_id"]) for r in await results(redis, paid))
    assert got == [("1", 1), ("2", 2)]
    assert await heartbeats(redis, app) == []


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


async def test_read_count_and_tail_lines_count_the_lines_of_a_join_s_inner_entries(
    redis_url: str, redis: Redis
) -> None:
    # Two forwarders' batches (of 5 events, then of 3) and a heartbeat between them:
    # --count N and -n N are N lines, of events or heartbeats, not N entries.
    key = CLI_APP.streams["j__in"].key(0)
    first = [(1767225600000 + n, str(n).encode(), 0, b'{"n":%d}' % n) for n in range(1, 6)]
    then = [(1767225601000 + n, b"7" if n else b"6", 0, b'{"n":%d}' % (10 + n)) for n in range(3)]
    (packed,) = pack_forwarded(b"L", first)
    await redis.xadd(key, {b"J": packed})
    await redis.xadd(key, {HEARTBEAT: heartbeat(1, 1767225600900)})
    (packed,) = pack_forwarded(b"R", then)
    await redis.xadd(key, {b"J": packed})

    async def shown(*args: str) -> list[str]:
        got = await streamkit(*args, redis_url=redis_url)
        assert got.code == 0, got.err
        return [line.split("\t", 2)[2] for line in got.out.splitlines()]

    inner = "tests.test_joins_sides:j__in"
    assert await shown("read", inner, "--count", "1") == [
        'left 1 at 2026-01-01T00:00:00.001+00:00: {"n":1}'
    ]
    assert len(await shown("read", inner, "--count", "2")) == 2
    seven = await shown("read", inner, "--count", "7")
    assert seven[5:] == [
        "heartbeat: right side at 2026-01-01T00:00:00.900+00:00",
        'right 6 at 2026-01-01T00:00:01.000+00:00: {"n":10}',
    ]
    assert await shown("tail", inner, "-n", "1") == [
        'right 7 at 2026-01-01T00:00:01.002+00:00: {"n":12}'
    ]
    four = await shown("tail", inner, "-n", "4")
    assert [line.split(" ", 2)[:2] for line in four] == [
        ["heartbeat:", "right"],
        ["right", "6"],
        ["right", "7"],
        ["right", "7"],
    ]
    assert len(await shown("tail", inner, "-n", "20")) == 9  # (all of them)
    assert await shown("tail", inner, "-n", "1", "--key", "7") == four[-1:]
    assert await shown("read", inner, "--count", "1", "--key", "7") == four[2:3]
    assert await shown("tail", inner, "-n", "2", "--key", "3") == [
        'left 3 at 2026-01-01T00:00:00.003+00:00: {"n":3}'
    ]
    as_json = await streamkit("read", inner, "--count", "3", "--json", redis_url=redis_url)
    assert [orjson.loads(line)["key"] for line in as_json.out.splitlines()] == ["1", "2", "3"]


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
    app, orders, payments, paid = shop(redis_url, idle=True)
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


async def test_what_meets_does_not_depend_on_which_forwarder_ran_first(
    redis_url: str, redis: Redis
) -> None:
    # The trial's case: the same events, each side's forwarder run alone, the right's
    # first, then the left's (as if the left's worker were down meanwhile), then the
    # other way round. An event far behind its own side's newest (order 1 at 3 s, after
    # one at 10 s) is late both ways; it met the payment of 3.2 s when the left side
    # came first, before.
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    lefts = [(1, 10.0), (1, 3.0), (2, 20.0), (4, 25.0), (3, 30.0)]
    rights = [(1, 3.2), (1, 10.5), (2, 19.8), (3, 40.0), (2, 18.0)]

    async def run(processors: list[str], app: App, key: str, group: str) -> None:
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(partial(run_worker, app, processors=processors))

            async def done() -> bool:
                reply: Any = await _CAUGHT_UP(redis, keys=[key], args=[group])
                return bool(int(reply[0])) and bool(await redis.xlen(key))

            await wait_until(done, what=f"{processors} caught up", within=30)
            await worker.stop()

    outcomes = []
    for first, second in (("j__right", "j__left"), ("j__left", "j__right")):
        await redis.flushall()
        app, orders, payments, paid = shop(redis_url, idle=False)
        async with app:
            for n, secs in lefts:
                await orders.send(Order(order_id=n, amount=1.0, at=t0 + timedelta(seconds=secs)))
            for n, secs in rights:
                await payments.send(Payment(order_id=n, paid=1.0, at=t0 + timedelta(seconds=secs)))
        for forwarder in (first, second):
            stream = orders if forwarder == "j__left" else payments
            await run([forwarder], app, stream.key(0), app.processors[forwarder].group)
        await run(["j"], app, app.streams["j__in"].key(0), app.processors["j"].group)
        async with app:
            snapshot = await take_snapshot(app)
        (joiner,) = [p for p in snapshot.processors if p.name == "j"]
        rows = await results(redis, paid)
        outcomes.append(
            (
                sorted((r["key"], r["left"]["at"], r["right"] and r["right"]["at"]) for r in rows),
                joiner.late,
            )
        )

    def at(seconds: float) -> str:
        return (t0 + timedelta(seconds=seconds)).isoformat()

    expected = [("1", at(10), at(10.5)), ("2", at(20), at(19.8)), ("4", at(25), None)]
    assert outcomes == [(expected, 2), (expected, 2)]


@settings(max_examples=300, deadline=None)
@given(
    lefts=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60)), max_size=12),
    rights=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60)), max_size=12),
    picks=st.lists(st.booleans(), min_size=24, max_size=24),
    how=st.sampled_from(["inner", "left", "outer"]),
)
def test_what_the_semantics_emit_does_not_depend_on_how_the_sides_interleave(
    lefts: list[tuple[int, int]], rights: list[tuple[int, int]], picks: list[bool], how: str
) -> None:
    # Each side's events in their own order (out of order within and beyond the window
    # and grace), the two sides interleaved every which way: the same results.
    left = [(b"L", key, at * 1000) for key, at in lefts]
    right = [(b"R", key, at * 1000) for key, at in rights]
    mixed, i, j = [], 0, 0
    for pick in picks + [True] * len(left) + [False] * len(right):
        if pick and i < len(left):
            mixed.append(left[i])
            i += 1
        elif not pick and j < len(right):
            mixed.append(right[j])
            j += 1
    assert len(mixed) == len(left) + len(right)

    def joined(order: list[tuple[bytes, int, int]]) -> Counter[Any]:
        return model([order], within=5000, grace=2000, how=how)

    assert joined(mixed) == joined(left + right) == joined(right + left)
