"""Windowed tables on a real server: final results once, late events, idle closing,
retention, sessions."""

from __future__ import annotations

import math
import operator
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, ConfigError, Events, Record, hopping, session, tumbling
from streamkit._commit import Changes
from streamkit._events_delivery import Delivery
from streamkit._state import PartitionState
from streamkit._state_windows import _ABSENT, FixedWindowView
from streamkit._worker import run_worker
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis, Stream

FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 1.0,
}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Sale(Record):
    shop: str
    amount: int
    at: datetime


def sale(shop: str, amount: int, seconds: float) -> Sale:
    return Sale(shop=shop, amount=amount, at=T0 + timedelta(seconds=seconds))


async def results(redis: Redis, stream: Stream[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for partition in range(stream.partition_count):
        entries: Any = await redis.xrange(stream.key(partition))
        out.extend(stream.codec.decode(e.field_values, stream=stream.name) for e in entries)
    return out


def revenue_app(
    redis_url: str, *, returned: trio.Event | None = None, **window: Any
) -> tuple[App, Any, Any, Any]:
    """The app of these tests; ``returned`` is set when its processor's iteration ends."""
    app = App("win", redis_url=redis_url, **FAST)
    # One partition: one watermark for every shop, so the test knows what closes.
    sales = app.stream("sales", record=Sale, partition_by="shop", partition_count=1)
    totals = app.stream("totals", record=dict, partition_by=lambda r: r["key"], partition_count=2)
    options: dict[str, Any] = {"grace": timedelta(seconds=5), **window}
    revenue = app.window(
        "revenue",
        options.pop("kind", tumbling(timedelta(minutes=1))),
        value=int,
        initial=0,
        time="at",
        output=totals,
        **options,
    )

    @app.processor(sales, tables=[revenue])
    async def add_up(events: Events[Sale]) -> None:
        async for item in events.records():
            await revenue.update(item.shop, item, operator.add, item.amount)
        if returned is not None:
            returned.set()  # the iteration ended (not cancelled)

    return app, sales, totals, revenue


async def test_a_tumbling_sum_is_emitted_once_when_its_window_closes(
    redis_url: str, redis: Redis
) -> None:
    app, sales, totals, revenue = revenue_app(redis_url)
    sent = [
        sale("a", 1, 10),
        sale("a", 2, 50),
        sale("b", 5, 30),
        sale("a", 4, 61),  # the next minute; the first is still in its grace
        sale("a", 8, 63),  # within the grace: counted in the first minute
        sale("a", 16, 130),  # watermark past 60 + 5: the first minute closes
        sale("b", 32, 200),  # past 180 + 5: so does the third
    ]
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await sales.send_many(sent)

        async def closed() -> bool:
            return len(await results(redis, totals)) >= 4

        await wait_until(closed, what="four windows emitted", within=20)
        await worker.stop()
    got = sorted(
        ((r["key"], r["start"], r["value"]) for r in await results(redis, totals)),
    )
    minute = (T0 + timedelta(minutes=1)).isoformat()
    assert got == [
        ("a", T0.isoformat(), 3),
        ("a", minute, 12),
        ("a", (T0 + timedelta(minutes=2)).isoformat(), 16),
        ("b", T0.isoformat(), 5),
    ]
    async with app:
        # Closed windows went (no retention); b's fourth minute is still open.
        assert await revenue.read("a") == []
        windows = await revenue.read("b")
    assert [(w.start, value) for w, value in windows] == [(T0 + timedelta(minutes=3), 32)]


async def test_late_events_are_dropped_and_counted_or_dead_lettered(
    redis_url: str, redis: Redis
) -> None:
    from streamkit._cli._fleet import take_snapshot

    app, sales, totals, _ = revenue_app(redis_url, late="dead_letter")
    state_key = "__stat:{win.sales.0}.add_up"
    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await sales.send_many([sale("a", 1, 10), sale("a", 2, 100), sale("a", 4, 20)])
        dead = app.processors["add_up"].keys.dead_letter_key

        async def dead_lettered() -> bool:
            return await redis.xlen(dead) == 1

        await wait_until(dead_lettered, what="the late event dead-lettered", within=20)

        # Counted as late too, as a dropped one is (status's late column), once.
        async def counted() -> bool:
            return await redis.hget(state_key, "late:revenue") == b"1"

        await wait_until(counted, what="the dead-lettered late event counted", within=20)
        await sales.send(sale("a", 8, 300))  # more commits: still counted once

        async def acked() -> bool:
            return (await take_snapshot(app)).processors[0].partitions[0].lag == 0

        await wait_until(acked, what="the last sale processed", within=20)
        snapshot = await take_snapshot(app)
        await worker.stop()
    entry = (await redis.xrange(dead))[0]
    assert entry.field_values[b"dl.reason"] == b"late"
    got = [(r["start"], r["value"]) for r in await results(redis, totals)]
    assert got[0] == (T0.isoformat(), 1)
    assert snapshot.processors[0].late == 1
    assert await redis.hget(state_key, "late:revenue") == b"1"


async def test_late_events_show_in_status_in_a_metric_and_once_per_window_in_the_log(
    redis_url: str, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Dropped late events are counted by the commits; ``streamkit status`` (and its
    JSON, the dashboard's) shows them per partition, the worker exports them, and the
    log says so once per window, rate-limited."""
    from prometheus_client import CollectorRegistry, generate_latest

    from streamkit._cli._fleet import fleet_json, take_snapshot
    from streamkit._cli._fleet_view import partitions_table
    from streamkit.metrics import open_metrics
    from tests.scrape import parse

    app, sales, _, _ = revenue_app(redis_url)
    state_key = "__stat:{win.sales.0}.add_up"
    caplog.set_level("WARNING", logger="streamkit.state")
    registry = CollectorRegistry()
    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        async with open_metrics(worker, registry=registry, refresh_interval=60) as metrics:
            await sales.send_many(
                [
                    sale("a", 1, 10),
                    sale("a", 2, 100),  # the first minute closes (60 + 5 s of grace)
                    sale("b", 4, 20),  # late: the first minute
                    sale("a", 8, 30),  # late: the first minute again (logged once)
                    sale("a", 16, 200),  # the second minute closes
                    sale("a", 32, 70),  # late: the second minute (a line too soon)
                ]
            )

            async def counted() -> bool:
                return await redis.hget(state_key, "late:revenue") == b"3"

            await wait_until(counted, what="3 late events committed", within=20)
            await metrics.refresh()
            scraped = parse(generate_latest(registry).decode())
            snapshot = await take_snapshot(app)
        await worker.stop()

    assert scraped.by_partition("streamkit_late_events_total", processor="add_up") == {0: 3}
    [processor] = snapshot.processors
    assert processor.late == 3
    assert processor.partitions[0].late == {"revenue": 3}
    as_json = fleet_json(snapshot)["processors"][0]
    assert as_json["late"] == 3
    assert as_json["partitions"][0]["late"] == {"revenue": 3}
    table = partitions_table(processor, processor.partitions, None, T0, 120)
    assert [column.header for column in table.columns][-2] == "late"
    lines = [r.getMessage() for r in caplog.records if "late event" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "late event on windowed table 'revenue' partition 0: the window "
        "2026-01-01T00:00:00.000+00:00/2026-01-01T00:01:00.000+00:00 of key 'b' had closed"
    )
    assert "dropped" in lines[0]
    assert "streamkit status" in lines[0]


async def test_an_idle_partition_closes_its_window_by_the_wall_clock(
    redis_url: str, redis: Redis
) -> None:
    app, sales, totals, _ = revenue_app(
        redis_url, kind=tumbling(timedelta(seconds=1)), grace=timedelta(seconds=0.5)
    )
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        now = datetime.now(UTC)
        await sales.send(Sale(shop="a", amount=7, at=now))
        began = time.monotonic()

        async def closed() -> bool:
            return len(await results(redis, totals)) == 1

        # No later event and no stop: only the wall clock can close it (the window
        # ends within a second of `now`, then the grace; `within` is the slack).
        await wait_until(closed, what="the quiet window emitted", within=10)
        print(f"closed {time.monotonic() - began:.2f}s after its event")
        await worker.stop()
    assert [r["value"] for r in await results(redis, totals)] == [7]


async def test_closed_windows_stay_readable_for_the_retention(redis_url: str, redis: Redis) -> None:
    app, sales, totals, revenue = revenue_app(redis_url, retention=timedelta(minutes=3))
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await sales.send_many([sale("a", 1, 10), sale("a", 2, 130)])

        async def first_closed() -> bool:
            return len(await results(redis, totals)) == 1

        await wait_until(first_closed, what="the first minute emitted", within=20)
        windows = [(w.start, v) for w, v in await revenue.read("a")]
        assert windows == [(T0, 1), (T0 + timedelta(minutes=2), 2)]
        await sales.send(sale("a", 4, 600))  # past the first minute's retention

        async def expired() -> bool:
            return [w.start for w, _ in await revenue.read("a")] == [T0 + timedelta(minutes=10)]

        await wait_until(expired, what="the retained windows dropped", within=20)
        await worker.stop()


@pytest.mark.cluster
async def test_sessions_and_hopping_windows(redis_url: str, redis: Redis) -> None:
    app = App("sess", redis_url=redis_url, **FAST)
    sales = app.stream("sales", record=Sale, partition_by="shop", partition_count=2)
    visits = app.stream("visits", record=dict, partition_by=lambda r: r["key"], partition_count=2)
    rolling = app.stream("rolling", record=dict, partition_by=lambda r: r["key"], partition_count=2)
    sessions = app.window(
        "sessions",
        session(timedelta(seconds=30)),
        value=int,
        initial=0,
        time="at",
        output=visits,
        merge=lambda a, b: a + b,
    )
    hours = app.window(
        "hours",
        hopping(size=timedelta(minutes=2), every=timedelta(minutes=1)),
        value=int,
        initial=0,
        time="at",
        output=rolling,
    )

    @app.processor(sales, tables=[sessions, hours])
    async def track(events: Events[Sale]) -> None:
        async for item in events.records():
            await sessions.update(item.shop, item, operator.add, 1)
            await hours.update(item.shop, item, operator.add, item.amount)

    sent = [sale("a", 1, 0), sale("a", 1, 20), sale("a", 1, 45), sale("a", 1, 300)]
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await sales.send_many(sent)

        async def emitted() -> bool:
            return (
                len(await results(redis, visits)) >= 1 and len(await results(redis, rolling)) >= 2
            )

        await wait_until(emitted, what="sessions and hops emitted", within=20)
        await worker.stop()
    assert [(r["start"], r["end"], r["value"]) for r in await results(redis, visits)] == [
        (T0.isoformat(), (T0 + timedelta(seconds=75)).isoformat(), 3)
    ]
    hops = sorted((r["start"], r["value"]) for r in await results(redis, rolling))
    assert hops[:2] == [
        ((T0 - timedelta(minutes=1)).isoformat(), 3),
        (T0.isoformat(), 3),
    ]


async def test_a_drain_that_lands_during_an_idle_tick_ends_the_iteration(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopping while a quiet partition's windows tick closed (the tick awaits
    Redis) ends that partition's iteration then: the drain was missed, and the wait
    that followed, with every window closed, had nothing left to wake it until the
    grace cancelled the partition."""
    returned = trio.Event()
    app, sales, totals, _ = revenue_app(
        redis_url,
        returned=returned,
        kind=tumbling(timedelta(seconds=1)),
        grace=timedelta(seconds=0.5),
    )
    real_tick = PartitionState.tick
    real_drain = Delivery.drain
    ticked = trio.Event()
    drained = trio.Event()

    def drain(self: Delivery[Any]) -> None:
        real_drain(self)
        drained.set()

    async def tick_while_stopping(self: PartitionState) -> None:
        await real_tick(self)
        # The tick that closed the last window: no idle deadline is left to wake on.
        if not ticked.is_set() and self.idle_deadline() == math.inf:
            ticked.set()
            # The stop is requested and reaches the partition while the tick is on.
            with trio.fail_after(10):
                await drained.wait()

    monkeypatch.setattr(Delivery, "drain", drain)
    monkeypatch.setattr(PartitionState, "tick", tick_while_stopping)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await sales.send(Sale(shop="a", amount=7, at=datetime.now(UTC)))
        with trio.fail_after(10):
            await ticked.wait()
        await worker.stop()
    assert returned.is_set()
    assert [r["value"] for r in await results(redis, totals)] == [7]


async def test_a_window_of_many_keys_closes_in_pages_each_key_once(
    redis_url: str, redis: Redis
) -> None:
    """More keys in one window than a settling round closes (CLOSE_BATCH): the window
    closes over several commits, every key's result emitted once, and nothing of the
    window stays in Redis."""
    from streamkit._state_windows import CLOSE_BATCH

    keys = 2 * CLOSE_BATCH + 37
    app, sales, totals, revenue = revenue_app(redis_url, grace=timedelta(0))
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await sales.send_many([sale(f"k{i}", i % 5 + 1, 10) for i in range(keys)])
        await sales.send(sale("k0", 1, 70))  # the watermark passes the first minute

        async def closed() -> bool:
            return len(await results(redis, totals)) >= keys

        await wait_until(closed, what="every key's first minute emitted", within=30)
        await worker.stop()
    got = [(r["key"], r["value"]) for r in await results(redis, totals)]
    assert sorted(got) == sorted((f"k{i}", i % 5 + 1) for i in range(keys))
    async with app:
        assert await revenue.read("k5") == []
        # Only the second minute is left (one key), its first window gone from Redis.
        assert sum(await revenue.sizes()) == 1
    first = revenue.values_key(0, int(T0.timestamp() * 1000))
    assert not await redis.exists([first])


async def test_a_window_carries_over_to_the_next_owner(redis_url: str, redis: Redis) -> None:
    """A window opened by one worker and closed by the next: the values committed by
    the first are read back from Redis (in pages: more keys than a round closes), and
    the results count both workers' events."""
    from streamkit._state_windows import CLOSE_BATCH

    others = [f"o{i}" for i in range(CLOSE_BATCH + 40)]
    app, sales, totals, revenue = revenue_app(redis_url)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await sales.send_many([sale("a", 1, 10), sale("b", 2, 20)])
        await sales.send_many([sale(key, 3, 25) for key in others])

        async def committed() -> bool:
            return bool(sum(await revenue.sizes()) == 2 + len(others))

        await wait_until(committed, what="the first window committed", within=20)
        await worker.stop()
    assert await results(redis, totals) == []
    app2, sales2, totals2, _ = revenue_app(redis_url)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app2)
        await sales2.send_many([sale("a", 4, 30), sale("a", 8, 130)])

        async def closed() -> bool:
            return len(await results(redis, totals2)) >= 2 + len(others)

        await wait_until(closed, what="the carried-over window emitted", within=20)
        await worker.stop()
    got = sorted((r["key"], r["start"], r["value"]) for r in await results(redis, totals2))
    expected = [("a", T0.isoformat(), 5), ("b", T0.isoformat(), 2)]
    expected += [(key, T0.isoformat(), 3) for key in others]
    assert got == sorted(expected)


async def test_a_backlog_in_event_time_order_has_no_late_event(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition working through a backlog is not idle, even while a window is due
    and its next batch came while its windows settled: no event of a backlog sent in
    event-time order is late (the wall clock moved no watermark), every window exact."""
    # Every wait for a batch ends at once, as it does when a window was due already
    # (the watermark at its end) and the next batch takes a moment to come: a batch
    # that is there by then is taken, never the idle tick.
    monkeypatch.setattr(PartitionState, "idle_deadline", lambda self: trio.current_time() - 1)
    app = App("backlog", redis_url=redis_url, batch_size=20, **FAST)
    shops = [f"shop-{n}" for n in range(4)]
    sales = app.stream("sales", record=Sale, partition_by="shop", partition_count=8)
    totals = app.stream("totals", record=dict, partition_by=lambda r: r["key"], partition_count=1)
    # Windows of 5 ms of event time, each shop's events 1 ms apart: one is due at
    # nearly every batch.
    revenue = app.window(
        "revenue", tumbling(timedelta(milliseconds=5)), value=int, initial=0, time="at",
        output=totals,
    )  # fmt: skip

    @app.processor(sales, tables=[revenue])
    async def add_up(events: Events[Sale]) -> None:
        async for item in events.records():
            await revenue.update(item.shop, item, operator.add, item.amount)

    n = 400  # per shop
    async with app:
        await sales.send_many([sale(shop, 1, i / 1000) for i in range(n) for shop in shops])
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)

        async def emitted() -> bool:
            return bool(sum(r["value"] for r in await results(redis, totals)) >= n * len(shops))

        # (The last windows close by the idle rule, once the backlog is done.)
        await wait_until(emitted, what="the backlog's windows", within=30)
        await worker.stop()
    got = await results(redis, totals)
    assert [r["value"] for r in got] == [5] * (len(shops) * n // 5)
    from streamkit._cli._fleet import take_snapshot

    async with app:
        snapshot = await take_snapshot(app)
    assert [p.late for p in snapshot.processors] == [0]


async def test_a_commit_with_an_event_in_flight_leaves_its_writes_out(
    redis_url: str, redis: Redis
) -> None:
    """Writes of the events in flight go straight into the layer of writes, with what
    each replaced: a commit taken meanwhile carries only the done ones, and a failed
    event's writes are taken back to the committed value, however often it wrote."""
    _, _, _, revenue = revenue_app(redis_url)
    view = FixedWindowView(revenue, 0, 1, redis, 100)
    view.watermark = 0
    assert view.fold("a", 1_000, operator.add, (5,)) is False  # done: a = 5
    view.promote()
    view.fold("a", 2_000, operator.add, (1,))  # in flight: a = 6, then 8, b = 1
    view.fold("a", 3_000, operator.add, (2,))
    view.fold("b", 3_000, operator.add, (1,))

    changes = Changes()
    view.contribute(changes, [])
    written = [(op, values) for op, _, values in changes.ops if op == "h"]
    assert written == [("h", [b"a", b"5"])], "only the done write is committed"
    assert view._known(0, b"a") == 8  # the event in flight still sees its own writes

    view.discard()  # the event failed
    assert view._known(0, b"a") == 5, "back to the committed value"
    assert view._known(0, b"b") is _ABSENT, "a key the failed event made is gone"

    view.fold("a", 4_000, operator.add, (10,))
    view.promote()  # done this time
    changes = Changes()
    view.contribute(changes, [])
    assert [values for op, _, values in changes.ops if op == "h"] == [[b"a", b"15"]]


async def test_windows_larger_than_the_cache_stay_exact(redis_url: str, redis: Redis) -> None:
    """Many windows open per key and a cache of a few values: windows are evicted,
    their values read back from Redis a batch at a time (prefetched), and every
    window's result is still the sum of its events."""
    app = App("wincache", redis_url=redis_url, state_cache_size=8, **FAST)
    sales = app.stream("sales", record=Sale, partition_by="shop", partition_count=1)
    totals = app.stream("totals", record=dict, partition_by=lambda r: r["key"], partition_count=2)
    revenue = app.window(
        "revenue",
        tumbling(timedelta(seconds=1)),
        value=int,
        initial=0,
        grace=timedelta(hours=1),
        time="at",
        output=totals,
    )

    @app.processor(sales, tables=[revenue])
    async def add_up(events: Events[Sale]) -> None:
        async for item in events.records():
            await revenue.update(item.shop, item, operator.add, item.amount)

    expected: dict[tuple[str, int], int] = {}
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        for round_ in range(4):
            # Every other round the other windows: the last round's are evicted.
            seconds = range(20) if round_ % 2 == 0 else range(20, 40)
            batch = [
                sale(f"s{k}", round_ + k, second + 0.5) for second in seconds for k in range(5)
            ]
            for s in batch:
                key = (s.shop, int((s.at - T0).total_seconds()))
                expected[key] = expected.get(key, 0) + s.amount
            await sales.send_many(batch)

            async def committed(n: int = 100 * (round_ + 1)) -> bool:
                pending: Any = await redis.xpending(sales.key(0), "wincache.sales.add_up")
                return bool(await redis.xlen(sales.key(0)) == n and pending[0] == 0)

            await wait_until(committed, what=f"round {round_} committed", within=20)
        await sales.send(sale("s0", 0, 2 * 3600))  # closes every window
        await wait_until(
            lambda: _at_least(redis, totals, len(expected)), what="every result", within=20
        )
        await worker.stop()
    got = {
        (r["key"], int((datetime.fromisoformat(r["start"]) - T0).total_seconds())): r["value"]
        for r in await results(redis, totals)
    }
    assert len(await results(redis, totals)) == len(expected), "a result emitted twice"
    assert got == expected


async def _at_least(redis: Redis, stream: Stream[Any], n: int) -> bool:
    return len(await results(redis, stream)) >= n


def test_an_event_time_is_the_same_millisecond_however_it_is_given() -> None:
    _, _, _, revenue = revenue_app("redis://unused")  # time="at"
    assert revenue.time_of(2.01) == 2010  # 2.00999... s: to_ms's millisecond, not floored
    assert revenue.time_of(T0) == revenue.time_of(T0.timestamp()) == int(T0.timestamp()) * 1000
    assert revenue.time_of(sale("a", 1, 2.01)) == revenue.time_of(T0.timestamp() + 2.01)


@pytest.mark.parametrize("kind", ["tumbling", "session"])
async def test_without_the_idle_rule_the_last_event_closes_every_window_it_passes(
    redis_url: str, redis: Redis, kind: str
) -> None:
    """With ``idle=False`` only events move the watermark; the last one closes every
    window it passes, also those whose commit was in flight as it came (put off by that
    round, they close once the commit lands, not with a later event that never comes)."""
    app = App("noidle", redis_url=redis_url, batch_size=7, **FAST)
    sales = app.stream("sales", record=Sale, partition_by="shop", partition_count=1)
    totals = app.stream("totals", record=dict, partition_by=lambda r: r["key"], partition_count=2)
    shape = (
        tumbling(timedelta(seconds=1)) if kind == "tumbling" else session(timedelta(seconds=0.5))
    )
    revenue = app.window(
        "revenue", shape, value=int, initial=0, time="at", output=totals, idle=False
    )

    @app.processor(sales, tables=[revenue])
    async def add_up(events: Events[Sale]) -> None:
        async for item in events.records():
            await revenue.update(item.shop, item, operator.add, item.amount)

    # Three shops, two windows (one session) a shop in each of three blocks, then each
    # shop's last event far after: batches of 7, each commit in flight while the next
    # batch is processed.
    sent = [sale(f"s{i % 3}", 1, block * 3 + i / 10) for block in range(3) for i in range(20)]
    sent += [sale(f"s{i}", 0, 1000) for i in range(3)]
    windows = 18 if kind == "tumbling" else 9
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await sales.send_many(sent)

        async def closed() -> bool:
            return len(await results(redis, totals)) >= windows

        await wait_until(closed, what="every window the last events passed", within=20)
        await worker.stop()
    got = await results(redis, totals)
    assert (len(got), sum(r["value"] for r in got)) == (windows, 60)


@pytest.mark.parametrize(
    ("option", "bad", "said"),
    [
        ("time", 5, "time: expected a field name, a function of the record or None, got 5"),
        ("result", "x", "result: must be a function of (key, window, value), got 'x'"),
        ("merge", 3, "merge: must be a function of two values, or None, got 3"),
        ("idle", "no", "idle: must be True or False, got 'no'"),
    ],
)
def test_a_window_s_functions_are_checked_where_it_is_declared(
    option: str, bad: object, said: str
) -> None:
    # (they failed only once the partition ran: 'int' object is not callable)
    app = App("windowchecks")
    with pytest.raises(ConfigError) as refused:
        app.window("w", tumbling(10), value=int, initial=0, **{option: bad})  # type: ignore[arg-type]
    assert str(refused.value) == said
    assert "w" not in app.tables
