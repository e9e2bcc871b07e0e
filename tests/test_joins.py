"""Stream-stream joins within a time: pairs once, unmatched events once when their
window closes, late events, the co-partitioning rule."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, ConfigError, DecodeError, Record
from streamkit._cli._fleet import take_snapshot
from streamkit._joins import pack_forwarded, unpack_forwarded
from streamkit._state_joins import decode_buffer, encode_buffer
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


class Order(Record):
    order_id: int
    amount: float
    at: datetime


class Payment(Record):
    order_id: int
    paid: float
    at: datetime


def order(n: int, seconds: float) -> Order:
    return Order(order_id=n, amount=10.0 * n, at=T0 + timedelta(seconds=seconds))


def payment(n: int, seconds: float) -> Payment:
    return Payment(order_id=n, paid=10.0 * n, at=T0 + timedelta(seconds=seconds))


async def results(redis: Redis, stream: Stream[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for partition in range(stream.partition_count):
        entries: Any = await redis.xrange(stream.key(partition))
        out.extend(stream.codec.decode(e.field_values, stream=stream.name) for e in entries)
    return out


def shop(redis_url: str, how: str, partitions: int = 2) -> tuple[App, Any, Any, Any]:
    app = App("joinshop", redis_url=redis_url, **FAST)
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=partitions)
    payments = app.stream(
        "payments", record=Payment, partition_by="order_id", partition_count=partitions
    )
    paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"], partition_count=2)
    app.join(
        "paid_orders",
        orders,
        payments,
        within=timedelta(minutes=10),
        # Two streams' events reach the join in no set order between them: a grace as
        # long as the tests' event times leaves none late.
        grace=timedelta(hours=1),
        how=how,  # type: ignore[arg-type]
        output=paid,
        left_time="at",
        right_time="at",
        idle=False,
    )
    return app, orders, payments, paid


@pytest.mark.cluster
async def test_pairs_within_the_window_once_and_unmatched_orders_when_it_closes(
    redis_url: str, redis: Redis
) -> None:
    app, orders, payments, paid = shop(redis_url, "left")
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await orders.send_many([order(1, 0), order(2, 10), order(3, 20)])
        await payments.send_many([payment(1, 60), payment(3, 900)])  # 3: 14m40s after
        await payments.send(payment(2, 30))

        async def paired() -> bool:
            return len([r for r in await results(redis, paid) if r["right"]]) >= 2

        # (Events of two streams have no order between them: what makes a window close
        # comes once what is to match in it was joined.)
        await wait_until(paired, what="the pairs", within=30)
        # Event time far beyond, on every partition: every window closes (no idle rule
        # here).
        closing = [next(n for n in range(4, 99) if orders.partition_of(order(n, 0)) == p)
                   for p in range(2)]  # fmt: skip
        await orders.send_many([order(n, 5 * 3600) for n in closing])
        await payments.send_many([payment(n, 5 * 3600 + 1) for n in closing])

        async def emitted() -> bool:
            return len(await results(redis, paid)) >= 5

        await wait_until(emitted, what="the pairs and the unmatched order", within=30)
        await worker.stop()
    async with app:
        snapshot = await take_snapshot(app)
    (joiner,) = [p for p in snapshot.processors if p.name == "paid_orders"]
    # The status shows what waits: the closing events, one of each side per partition.
    assert [row.buffered for row in joiner.partitions] == [{"paid_orders": 2}] * 2
    got = sorted(
        (r["key"], r["left"]["order_id"], None if r["right"] is None else r["right"]["paid"])
        for r in await results(redis, paid)
    )
    assert got == [
        ("1", 1, 10.0),
        ("2", 2, 20.0),
        ("3", 3, None),
        *sorted((str(n), n, 10.0 * n) for n in closing),
    ]


async def test_co_partitioning_is_required() -> None:
    app = App("badjoin")
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=4)
    payments = app.stream("payments", record=Payment, partition_by="order_id", partition_count=8)
    out = app.stream("out", record=dict, partition_by=lambda r: r["key"])
    with pytest.raises(ConfigError, match="co-partitioned"):
        app.join("j", orders, payments, within=60, output=out)


async def test_a_refused_join_leaves_the_app_as_it_was() -> None:
    """A join refused for a bad argument declares nothing, so the corrected call works;
    a name used twice is refused as the join's, not as one of its inner parts'."""
    app = App("redo")
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=4)
    payments = app.stream("payments", record=Payment, partition_by="order_id", partition_count=4)
    out = app.stream("out", record=dict, partition_by=lambda r: r["key"])
    streams, processors = dict(app.streams), dict(app.processors)
    for bad in ({"within": 0}, {"within": 60, "grace": -1}, {"within": 60, "how": "full"}):
        with pytest.raises(ConfigError):
            app.join("j", orders, payments, output=out, **bad)
        assert (app.streams, app.processors) == (streams, processors)
    with pytest.raises(ConfigError, match="no_such_setting"):
        app.join("j", orders, payments, within=60, output=out, no_such_setting=1)
    assert (app.streams, app.processors) == (streams, processors)
    # Each refused at the declaration, naming the option, before anything is declared
    # (a bad setting was refused only once the forwarders were declared).
    duration = "expected a duration (a timedelta, or seconds)"
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"within": "10"}, f"within: {duration}, got '10'"),
        ({"within": datetime(2026, 1, 1, tzinfo=UTC)}, f"within: {duration}, got datetime"),
        ({"within": 60, "grace": math.nan}, f"grace: {duration}, got nan"),
        ({"within": 60, "grace": math.inf}, f"grace: {duration}, got inf"),
        ({"within": True}, f"within: {duration}, got True"),
        ({"within": 60, "batch_size": 0}, "batch_size: must be a positive integer, got 0"),
        ({"within": 60, "result": "x"}, "result: must be a function of (key, left record"),
        ({"within": 60, "idle": "no"}, "idle: must be True or False, got 'no'"),
    ]
    for bad, message in refusals:
        with pytest.raises(ConfigError) as refused:
            app.join("j", orders, payments, output=out, **bad)
        assert str(refused.value).startswith(message), (bad, str(refused.value))
        assert (app.streams, app.processors) == (streams, processors)
    for side, stream in (("left", orders), ("right", payments)):
        with pytest.raises(ConfigError) as refused:
            app.join("j", orders, payments, within=60, output=stream)
        assert str(refused.value) == (
            f"output: join 'j' cannot emit to its own {side} stream {stream.name!r}: each "
            f"result would be joined again (give it a stream of its own)"
        )
        assert (app.streams, app.processors) == (streams, processors)
    app.join("j", orders, payments, within=60, output=out)
    assert {"j", "j__left", "j__right"} <= set(app.processors)
    with pytest.raises(ConfigError, match="'j' is used already"):
        app.join("j", orders, payments, within=60, output=out)


async def test_buffers_stay_flat_at_a_steady_rate(redis_url: str, redis: Redis) -> None:
    """Events go once their window and grace passed: at a steady rate the buffers hold
    about rate x (within + grace) events, and what status counts is what they hold."""

    class Click(Record):
        user: int

    app = App("steady", redis_url=redis_url, **FAST)
    views = app.stream("views", record=Click, partition_by="user", partition_count=2)
    buys = app.stream("buys", record=Click, partition_by="user", partition_count=2)
    out = app.stream("out", record=dict, partition_by=lambda r: r["key"], partition_count=1)
    join = app.join("bought", views, buys, within=0.3, grace=0.2, how="left", output=out)
    rate = 200  # events per second and side, at most
    samples: list[int] = []
    sent = [0]

    async def buffered() -> int:
        async with app:
            snapshot = await take_snapshot(app)
        (joiner,) = [p for p in snapshot.processors if p.name == "bought"]
        return sum(sum(row.buffered.values()) for row in joiner.partitions)

    async def produce() -> None:
        user = 0
        while True:
            await views.send_many([Click(user=user + n) for n in range(4)])
            await buys.send_many([Click(user=user + n) for n in range(0, 4, 2)])
            user += 4
            sent[0] += 6
            await trio.sleep(4 / rate)

    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        nursery.start_soon(produce)
        for _ in range(16):
            await trio.sleep(0.5)
            samples.append(await buffered())
        nursery.cancel_scope.cancel()
        await worker.stop()
    # What was sent in the last within + grace (0.5 s), and in the batches waiting to
    # be settled: at most what one second of the run sent (8 s), never all of it.
    assert max(samples[4:]) < sent[0] / 8, (samples, sent)
    late_half, early_half = samples[10:], samples[4:10]
    assert max(late_half) <= 2 * max(early_half) + 50, samples  # flat, not growing
    # The count status shows is what the buffers hold.
    async with app:
        held = 0
        for partition in range(2):
            for raw in (await redis.hgetall(join.key(partition))).values():
                held += len(decode_buffer(raw))
        assert held == await buffered()


async def test_a_late_event_matches_nothing_and_is_counted(redis_url: str, redis: Redis) -> None:
    app, orders, payments, paid = shop(redis_url, "outer", partitions=1)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await orders.send(order(1, 0))
        await orders.send(order(2, 5 * 3600))
        await payments.send(payment(2, 5 * 3600))  # the watermark: 5 hours on

        async def closed() -> bool:  # order 1's window, by the watermark
            return len(await results(redis, paid)) == 2

        await wait_until(closed, what="order 1 emitted alone", within=30)
        # 30 s after order 1, but 5 hours behind its own side's newest: late (so it is
        # late whichever side's events reached the join first)
        await payments.send(payment(1, 30))

        async def counted() -> bool:
            async with app:
                snapshot = await take_snapshot(app)
            (joiner,) = [p for p in snapshot.processors if p.name == "paid_orders"]
            return joiner.late == 1

        await wait_until(counted, what="the late payment counted", within=30)
        await worker.stop()
    # Order 1's window closed unmatched (an outer join emits it alone); the late payment
    # met nothing and is not emitted at all.
    got = sorted(
        (r["key"], r["right"] and r["right"]["order_id"]) for r in await results(redis, paid)
    )
    assert got == [("1", None), ("2", 2)]


def test_forwarded_events_are_read_in_both_forms_and_refused_otherwise() -> None:
    """The join reads the batches its forwarders write, and the one field per event
    and the one JSON field of earlier versions (an inner stream written before an
    upgrade); anything else is a decode error, not a crash of the partition."""
    app = App("joinforms")
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=1)
    payments = app.stream("payments", record=Payment, partition_by="order_id", partition_count=1)
    paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"], partition_count=1)
    joined = app.join("forms", orders, payments, within=60, output=paid)
    record = b'{"order_id":7,"amount":70.0,"at":"2026-01-01T00:00:00Z"}'
    new = joined.prepare_flat([b"j", b"L0 1767225600000 1 7" + record])
    old = joined.prepare_flat([b"data", b'["L","7",1767225600000,0,' + record + b"]"])
    assert new == old == (b"L", b"7", 1_767_225_600_000, 0, record)
    # A key of any bytes (spaces too), a record in its fields (form 1).
    flat = joined.prepare_flat([b"j", b'R1 5 3 a b["data:zstd","x"]'])
    assert flat == (b"R", b"a b", 5, 1, b'["data:zstd","x"]')
    for bad in (
        [b"j", b"X0 5 1 7" + record],  # no such side
        [b"j", b"L0 soon 1 7" + record],  # no time
        [b"j", b"L2 5 1 7" + record],  # no such form
        [b"j", b"L0 5 99 7"],  # a key longer than what follows
        [b"j", b"L0 5"],
        [b"data", b'["L","7"]'],
        [b"data", b"not json"],
        [b"other", b"field"],
        [b"j", b"L0 5 1 7", b"t", b"5"],
    ):
        with pytest.raises(DecodeError):
            joined.prepare_flat(bad)
    # A forwarder's batch: its events in order, whatever their bytes (spaces, digits,
    # newlines); one cut short, too long or badly described is a decode error.
    sent = [(1767225600000, b"7", 0, record), (5, b"a\nb", 1, b'["data:zstd","x"]')]
    sent.append((1, b"12", 0, b""))
    [packed] = pack_forwarded(b"L", sent)
    assert packed.startswith(b"L [1767225600000,1,")
    assert unpack_forwarded(packed) == [(b"L", k, at, form, r) for at, k, form, r in sent]
    assert joined.prepare_entry([b"J", packed])[0] == new
    assert joined.prepare_entry([b"j", b"L0 1767225600000 1 7" + record]) == [new]  # earlier
    many = pack_forwarded(b"R", [(1, b"7", 0, b"x" * 20_000)] * 4)  # 64 KiB an entry
    assert len(many) == 2
    assert sum(len(unpack_forwarded(p)) for p in many) == 4
    head, _, body = packed.partition(b"\n")
    for bad_pack in (
        packed[:-1],  # cut short
        packed + b"x",  # more than described
        b"X" + packed[1:],  # no such side
        b"L" + packed[2:],
        body,  # no description
        b"L [1,1,1]\n77",  # not four numbers per event
        b"L [1,1,-1,0]\n7",  # a negative length
        b"L [1,1,1.5,0]\n77",  # not whole
        b"L [1,1,1,2]\n77",  # no such form
        b'L [1,1,"1",0]\n77',
        b"L {}\n",
        b"L [1,1,1,0\n77",
    ):
        with pytest.raises(DecodeError):
            joined.prepare_entry([b"J", bad_pack])
    assert head.endswith(b"]")
    # Buffers keep each record's JSON as forwarded, in place, both ways, and how far
    # each event's side had come (none yet: left out, as earlier versions stored them).
    events = ((5, 0, 0, record, -math.inf), (6, 1, 1, b'["data:zlib","x"]', 1767225600000))
    assert decode_buffer(encode_buffer(events)) == events
    assert decode_buffer(encode_buffer(events[1:])) == events[1:]
    assert encode_buffer(events[:1]) == b"[[5,0,0," + record + b"]]"
    for bad_buffer in (b'[[5, 0, 2, "x"]]', b'[[5, 0, 0, "x", 1.5]]', b'[[5, 0, 0, "x", 1, 2]]'):
        with pytest.raises(DecodeError):
            decode_buffer(bad_buffer)


async def test_a_compressed_side_is_joined_with_a_custom_result(
    redis_url: str, redis: Redis
) -> None:
    """A side whose codec is not plain JSON (compressed) is forwarded as its fields and
    decoded for the result; a custom result gets both records."""
    app = App("joinzip", redis_url=redis_url, **FAST)
    orders = app.stream(
        "orders", record=Order, partition_by="order_id", partition_count=1, compression="zstd"
    )
    payments = app.stream("payments", record=Payment, partition_by="order_id", partition_count=1)
    paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"], partition_count=1)
    app.join(
        "zipped",
        orders,
        payments,
        within=timedelta(minutes=10),
        grace=timedelta(hours=1),
        output=paid,
        left_time="at",
        right_time="at",
        result=lambda key, o, p: {"key": key, "amount": o and o.amount, "paid": p and p.paid},
        idle=False,
    )
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await orders.send_many([order(1, 0), order(2, 10)])
        await payments.send_many([payment(2, 20), payment(1, 30)])

        async def paired() -> bool:
            return len(await results(redis, paid)) >= 2

        await wait_until(paired, what="both pairs", within=30)
        await worker.stop()
    inner = await redis.xrange(app.streams["zipped__in"].key(0))
    packs: list[Any] = [e.field_values[b"J"] for e in inner]
    forms = {(e[0], e[3]) for pack in packs for e in unpack_forwarded(pack)}
    assert forms == {(b"L", 1), (b"R", 0)}  # orders forwarded as their fields
    got = sorted((r["key"], r["amount"], r["paid"]) for r in await results(redis, paid))
    assert got == [("1", 10.0, 10.0), ("2", 20.0, 20.0)]


async def test_buffers_larger_than_the_cache_join_exactly(redis_url: str, redis: Redis) -> None:
    """With a cache of a few buffers, buffered events are evicted and read back: a
    partition that started with empty buffers knows which keys buffer nothing without
    asking Redis, and every key evicted is read again, so every pair is found and every
    unmatched order is emitted once."""
    app = App("joincache", redis_url=redis_url, state_cache_size=6, **FAST)
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=1)
    payments = app.stream("payments", record=Payment, partition_by="order_id", partition_count=1)
    paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"], partition_count=1)
    app.join(
        "cached",
        orders,
        payments,
        within=timedelta(minutes=10),
        grace=timedelta(hours=1),
        how="left",
        output=paid,
        left_time="at",
        right_time="at",
        idle=False,
    )
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        # 60 orders, 20 more, then the payments of the first ones' even ones: each
        # payment's order was evicted before (a cache of 6 buffers).
        await orders.send_many([order(n, n) for n in range(60)])

        async def buffered(n: int) -> bool:  # the orders joined and committed
            async with app:
                snapshot = await take_snapshot(app)
            (joiner,) = [p for p in snapshot.processors if p.name == "cached"]
            return [row.buffered for row in joiner.partitions] == [{"cached": n}]

        await wait_until(lambda: buffered(60), what="the orders buffered", within=30)
        # More orders, committed after the first ones landed: those are evicted.
        await orders.send_many([order(n, n) for n in range(100, 120)])
        await wait_until(lambda: buffered(80), what="more orders buffered", within=30)
        await payments.send_many([payment(n, n + 30) for n in range(0, 60, 2)])
        await orders.send(order(999, 5 * 3600))  # every window closes
        await payments.send(payment(999, 5 * 3600))

        async def emitted() -> bool:
            return len(await results(redis, paid)) >= 81

        await wait_until(emitted, what="the pairs and the unmatched orders", within=30)
        await worker.stop()
    got = sorted(
        (int(r["key"]), None if r["right"] is None else r["right"]["paid"])
        for r in await results(redis, paid)
    )
    expected = [
        *((n, 10.0 * n if n % 2 == 0 else None) for n in range(60)),
        *((n, None) for n in range(100, 120)),
        (999, 9990.0),
    ]
    assert got == expected


class LandsDuringRead:
    """Redis, with a commit landing while one of its commands (``method``) runs: the
    command runs first in Redis, and the commit's reply is handled before the
    command's (as with two connections)."""

    def __init__(self, redis: Redis, method: str, lands: Any) -> None:
        self._redis = redis
        self._method = method
        self._lands = lands

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._redis, name)
        if name != self._method:
            return real

        async def then_land(*args: Any, **kwargs: Any) -> Any:
            reply = await real(*args, **kwargs)
            self._lands()
            return reply

        return then_land


async def test_a_buffer_whose_commit_lands_while_the_index_is_read_still_closes(
    redis_url: str, redis: Redis
) -> None:
    """A buffered event whose commit is in flight is known from memory, not from the
    index; if that commit lands while a settling round reads the index, the event is in
    neither what the read returned nor in flight after it, and was left buffered until
    a later watermark (a lost unmatched result when none came: found by
    tests/test_joins_machine.py)."""
    from streamkit._commit import Changes
    from streamkit._state_joins import JoinView

    app = App("landing", redis_url=redis_url)
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=1)
    payments = app.stream("payments", record=Payment, partition_by="order_id", partition_count=1)
    paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"])
    join = app.join("j", orders, payments, within=0.1, grace=0.15, how="left", output=paid)
    view = JoinView(join, 0, 1, redis, 100)
    view.watermark = 10_009
    stored = b'{"order_id":4,"amount":40.0,"at":"2026-01-01T00:00:10.009000+00:00"}'
    await view.add_many([(b"L", b"4", 10_009, 0, stored)])
    view.promote()
    pinned: list[bytes] = []
    view.contribute(Changes(), pinned)  # handed to a commit, not landed yet
    view._redis = LandsDuringRead(redis, "zrange", lambda: view.unpin(pinned))  # type: ignore[assignment]
    closed = await view.settle(35_000)
    assert [(r["key"], r["right"]) for r in closed] == [("4", None)]
    assert view.next_due == math.inf


async def test_an_undecodable_event_of_a_joined_stream_is_dead_lettered_by_its_forwarder(
    redis_url: str, redis: Redis
) -> None:
    """A forwarder decodes each event for its key and time, a batch at once: an event
    that does not decode goes to the forwarder's dead letters, as one of any processor
    would, and the events around it are joined."""
    from streamkit import _keys

    app, orders, payments, paid = shop(redis_url, "inner", partitions=1)
    letters_key = _keys.dead_letter_key(app.name, "orders", "paid_orders__left")
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await orders.send_many([order(1, 0), order(2, 10)])
        await redis.xadd(orders.key(0), {"data": b"not json"})
        await redis.xadd(orders.key(0), {"data": b'{"order_id": "three"}'})
        await orders.send_many([order(4, 20)])
        await payments.send_many([payment(n, 30) for n in (1, 2, 4)])

        async def done() -> bool:
            return len(await results(redis, paid)) >= 3 and await redis.xlen(letters_key) >= 2

        await wait_until(done, what="the pairs and the dead letters", within=30)
        await worker.stop()
    assert sorted(r["left"]["order_id"] for r in await results(redis, paid)) == [1, 2, 4]
    letters: Any = await redis.xrange(letters_key)
    assert len(letters) == 2
    text = b" ".join(v for e in letters for v in e.field_values.values() if isinstance(v, bytes))
    assert b"not json" in text
    assert b"three" in text
