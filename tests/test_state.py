"""State: tables and outputs committed with the acknowledgements, exactly once.

In-process workers on a real server (and the session's cluster where marked): counts
equal what was sent, outputs hold each result once, writes of failed events vanish,
and a processor cannot write another partition's keys.
"""

from __future__ import annotations

import operator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import (
    App,
    Backoff,
    ConfigError,
    Events,
    ExceptionPolicy,
    LockLost,
    OutcomeUnknown,
    ProcessorKeys,
    Record,
    RedisUnavailable,
    Table,
    WrongPartition,
    open_events,
    open_fetcher,
    open_lock_manager,
    partition_for,
    tumbling,
)
from streamkit._commit import MAX_VALUES_PER_OP, Changes, change_arguments
from streamkit._lua import script
from streamkit._redis import LuaScript, open_redis
from streamkit._worker import run_worker
from streamkit.testing import wait_until
from tests.apps.stateful import PARTITIONS as PARTITIONS_8, Number, Stateful, make_app
from tests.consume import GROUP, Tick, key_for, lock_name, pending_ids, serving, ticks_for

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from streamkit import Fetcher, LockManager, Redis, Stream
    from tests.netfaults import FaultProxies, FaultProxy

FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 1.0,
}


class Order(Record):
    order_id: int
    customer: str
    amount: float


class Profile(Record):
    customer: str
    city: str


class Enriched(Record):
    customer: str
    city: str


class Receipt(Record):
    customer: str
    order_id: int
    total: float


def shop(redis_url: str, **settings: Any) -> tuple[App, Any, Any, Table[float], Table[int]]:
    app = App("shop", redis_url=redis_url, **{**FAST, **settings})
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=4)
    receipts = app.stream("receipts", record=Receipt, partition_by="customer", partition_count=2)
    totals = app.table("totals", value=float, default=0.0)
    counts = app.table("counts", value=int, default=0)

    @app.processor(orders, tables=[totals, counts], outputs=[receipts])
    async def tally(events: Events[Order]) -> None:
        async for order in events.records():
            total = await totals.get(order.customer) + order.amount
            totals.set(order.customer, total)
            counts.set(order.customer, await counts.get(order.customer) + 1)
            events.emit(
                receipts, Receipt(customer=order.customer, order_id=order.order_id, total=total)
            )

    return app, orders, receipts, totals, counts


def orders_for(customers: int, per_customer: int) -> list[Order]:
    return [
        Order(order_id=n * customers + c, customer=f"c{c}", amount=float(n + 1))
        for n in range(per_customer)
        for c in range(customers)
    ]


async def receipts_of(redis: Redis, receipts: Any) -> list[Receipt]:
    out: list[Receipt] = []
    for partition in range(receipts.partition_count):
        entries: Any = await redis.xrange(receipts.key(partition))
        out.extend(receipts.codec.decode(e.field_values, stream="receipts") for e in entries)
    return out


async def wait_counts(counts: Table[int], expected: dict[str, int]) -> None:
    async def done() -> bool:
        return {k: v async for k, v in counts.items()} == expected

    await wait_until(done, what=f"the counts to reach {expected}", within=30)


@pytest.mark.cluster
async def test_a_table_and_outputs_reflect_every_event_once(redis_url: str, redis: Redis) -> None:
    app, orders, receipts, totals, counts = shop(redis_url)
    sent = orders_for(customers=10, per_customer=30)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await orders.send_many(sent)
        await wait_counts(counts, {f"c{c}": 30 for c in range(10)})
        await worker.stop()
    async with app:
        assert await totals.read("c3") == sum(range(1, 31))
        assert await totals.read("nobody") == 0.0
        assert await totals.read_many(["c0", "c1", "nobody"]) == [465.0, 465.0, 0.0]
        assert sum(await totals.sizes()) == 10
    got = await receipts_of(redis, receipts)
    assert sorted(r.order_id for r in got) == sorted(o.order_id for o in sent)
    # In order per customer, each with its running total.
    for c in range(10):
        mine = [r for r in got if r.customer == f"c{c}"]
        assert [r.total for r in mine] == [sum(range(1, n + 2)) for n in range(30)]


async def test_a_batch_of_new_keys_is_read_in_one_round_trip(redis_url: str, redis: Redis) -> None:
    """Counting per key where most keys are new to the worker (users, sessions): a
    batch's partition keys are read with one HMGET per table, not a GET per event."""
    app, orders, _, totals, counts = shop(redis_url, batch_size=100)
    sent = orders_for(customers=2000, per_customer=1)  # every key new
    async with app:
        await orders.send_many(sent)  # a backlog: full batches
    await redis.config_resetstat()
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await wait_counts(counts, {f"c{c}": 1 for c in range(2000)})
        await worker.stop()
    stats: Any = await redis.info("commandstats")
    hget = stats.get("cmdstat_hget", {}).get("calls", 0)
    hmget = stats.get("cmdstat_hmget", {}).get("calls", 0)
    assert hget == 0, stats  # no event read its key alone
    # Two tables, batches of 100 at most: far fewer reads than events.
    assert 0 < hmget <= len(sent) // 4, hmget
    async with app:
        assert await totals.read_many(["c0", "c1999"]) == [1.0, 1.0]


async def test_a_batch_of_new_keys_of_a_table_with_a_ttl_is_read_at_once(
    redis_url: str, redis: Redis
) -> None:
    app = App("expiring", redis_url=redis_url, batch_size=100, **FAST)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=4)
    seen: Table[int] = app.table("seen", value=int, default=0, ttl=timedelta(hours=1))

    @app.processor(orders, tables=[seen])
    async def count(events: Events[Order]) -> None:
        async for order in events.records():
            seen.set(order.customer, await seen.get(order.customer) + 1)

    sent = orders_for(customers=1000, per_customer=1)
    async with app:
        await orders.send_many(sent)  # a backlog: full batches
    await redis.config_resetstat()
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await wait_counts(seen, {f"c{c}": 1 for c in range(1000)})
        await worker.stop()
    stats: Any = await redis.info("commandstats")
    # Each read of keys is an HMGET with a ZMSCORE of their deadlines: one per batch.
    # (A read per event would be 1,000.)
    assert 0 < stats.get("cmdstat_zmscore", {}).get("calls", 0) <= len(sent) // 4, stats


async def test_a_worker_stopped_as_its_events_are_processed_commits_them_all(
    redis_url: str,
) -> None:
    """The fetcher commits a quiet partition's changes on its own; a graceful stop that
    comes just then waits for that commit before it lets the partition go (a commit
    landing after the lock's release is refused, and its changes lost)."""
    for round_ in range(12):
        committed, sent = await stop_as_processed(App(f"stop{round_}", redis_url=redis_url, **FAST))
        assert committed == sent, f"round {round_}: {committed} of {sent} committed"


async def stop_as_processed(app: App) -> tuple[int, int]:
    """Count a backlog in a table, stop the worker the moment the last event is
    processed; return the count committed and the events sent."""
    sales = app.stream("sales", record=Order, partition_by="customer", partition_count=8)
    counts = app.table("counts", value=int, default=0)
    sent = orders_for(customers=40, per_customer=50)
    processed = 0
    all_processed = trio.Event()

    @app.processor(sales, tables=[counts])
    async def counting(events: Events[Order]) -> None:
        nonlocal processed
        async for order in events.records():
            counts.set(order.customer, await counts.get(order.customer) + 1)
            processed += 1
            if processed == len(sent):
                all_processed.set()

    async with app:
        await sales.send_many(sent)
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            await all_processed.wait()
            await worker.stop()
        return sum(await counts.read_many([f"c{c}" for c in range(40)])), len(sent)


async def test_a_retried_event_writes_once(redis_url: str, redis: Redis) -> None:
    app = App("retry", redis_url=redis_url, **FAST)
    words = app.stream("words", record=Order, partition_by="customer", partition_count=2)
    seen = app.table("seen", value=int, default=0)
    failures: list[int] = []

    @app.processor(
        words,
        tables=[seen],
        policy=ExceptionPolicy(action="retry", retries=5, backoff=Backoff(initial=0.01)),
    )
    async def count(events: Events[Order]) -> None:
        async for order in events.records():
            seen.set(order.customer, await seen.get(order.customer) + 1)
            if order.order_id % 3 == 0 and failures.count(order.order_id) < 2:
                failures.append(order.order_id)
                raise RuntimeError("flaky")

    sent = [Order(order_id=n, customer=f"k{n % 4}", amount=1.0) for n in range(40)]
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await words.send_many(sent)

        async def done() -> bool:
            return [await seen.read(f"k{k}") for k in range(4)] == [10, 10, 10, 10]

        await wait_until(done, what="ten counted per key", within=30)
        await worker.stop()
    assert len(failures) == 2 * len([n for n in range(40) if n % 3 == 0])


async def test_dead_lettered_events_leave_no_writes(redis_url: str, redis: Redis) -> None:
    app = App("dlq", redis_url=redis_url, **FAST)
    words = app.stream("words", record=Order, partition_by="customer", partition_count=2)
    seen = app.table("seen", value=int, default=0)

    @app.processor(words, tables=[seen], policy=ExceptionPolicy(action="dead_letter"))
    async def count(events: Events[Order]) -> None:
        async for order in events.records():
            seen.set(order.customer, await seen.get(order.customer) + 1)
            if order.order_id % 5 == 0:
                raise RuntimeError("bad order")

    sent = [Order(order_id=n, customer="k", amount=1.0) for n in range(1, 21)]
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await words.send_many(sent)
        dead = app.processors["count"].keys.dead_letter_key

        async def done() -> bool:
            return await seen.read("k") == 16 and await redis.xlen(dead) == 4

        await wait_until(done, what="16 counted and 4 dead letters", within=30)
        await worker.stop()


async def test_a_key_of_another_partition_is_refused(redis_url: str, redis: Redis) -> None:
    app = App("wrong", redis_url=redis_url, **FAST)
    words = app.stream("words", record=Order, partition_by="customer", partition_count=4)
    seen = app.table("seen", value=int, default=0)
    errors: list[BaseException] = []

    @app.processor(words, tables=[seen], policy=ExceptionPolicy(action="ignore"))
    async def count(events: Events[Order]) -> None:
        async for order in events.records():
            try:
                seen.set(order.customer + "-other", 1)
            except WrongPartition as exc:
                errors.append(exc)
            seen.set(order.customer, 1)

    # Keys whose "-other" twin lands in another partition.
    keys = [
        k
        for k in (f"k{n}" for n in range(40))
        if words.partitioner.partition_of(Order(order_id=0, customer=k, amount=0))
        != words.partitioner.partition_of(Order(order_id=0, customer=k + "-other", amount=0))
    ][:5]
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await words.send_many([Order(order_id=1, customer=k, amount=1.0) for k in keys])

        async def done() -> bool:
            return sum(await seen.sizes()) >= len(keys)

        await wait_until(done, what="every key written", within=30)
        await worker.stop()
    assert len(errors) == len(keys)
    assert "belongs to partition" in str(errors[0])


async def test_writing_outside_the_processor_is_refused(redis_url: str) -> None:
    app, *_, totals, _ = shop(redis_url)
    with pytest.raises(ConfigError, match="written only by its processor"):
        totals.set("c0", 1.0)
    with pytest.raises(ConfigError, match="already declared"):
        app.table("totals", value=float)
    other = App("other", redis_url=redis_url)
    stream = other.stream("s", record=Order, partition_by="customer")
    with pytest.raises(ConfigError, match="not a table of app"):
        other.processor(stream, tables=[totals])


def test_a_default_or_initial_the_table_cannot_store_is_refused_at_declaration() -> None:
    # Else a missing key would read back as a value of the wrong type, in the middle
    # of processing.
    app = App("declared")
    with pytest.raises(ConfigError, match=r"default: table 'n': 'x' is not a valid int"):
        app.table("n", value=int, default="x")
    with pytest.raises(ConfigError, match=r"initial: windowed table 'w': 'zero' is not"):
        app.window("w", tumbling(timedelta(seconds=1)), value=int, initial="zero")
    assert app.tables == {}
    assert app.table("m", value=float, default=0).default == 0
    assert app.window("v", tumbling(timedelta(seconds=1)), value=list[int], initial=[])


async def test_a_zombie_commit_changes_nothing(
    app: App, redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """A worker whose lease was taken over (paused past it, say) processes events it
    had fetched, but its commit is refused: no table write, no output, no ack."""
    counts = Table("counts", int, 0, stream=ticks.spec, processor=GROUP.rpartition(".")[2])
    echoes = app.stream("echoes", record=Tick, partition_by="key", partition_count=1)
    await ticks.send_many(ticks_for(1, range(3)))

    async def zombie(fetcher: Fetcher[Tick]) -> None:
        async with (
            locks.hold(lock_name(1), ttl=30) as held,
            fetcher.partition(1, held) as feed,
            open_events(feed, tables=[counts], outputs=[echoes], redis=redis) as events,
        ):
            async for tick in events.records():
                counts.set(tick.key, await counts.get(tick.key) + 1)
                events.emit(echoes, tick)
                if tick.n == 1:
                    # Another owner took the lease meanwhile.
                    await redis.set(held.lease.key, b"someone-else:999")

    with trio.fail_after(10):
        async with open_fetcher(redis, ticks, group=GROUP) as fetcher:
            with pytest.raises(LockLost):
                await zombie(fetcher)
        assert await counts.read(key_for(1), redis=redis) == 0
        assert await redis.xlen(echoes.key(0)) == 0
        assert len(await pending_ids(redis, ticks, 1)) == 3


async def test_a_join_reads_a_table_another_processor_writes(redis_url: str, redis: Redis) -> None:
    app = App("join", redis_url=redis_url, **FAST)
    users = app.stream("users", record=Profile, partition_by="customer", partition_count=4)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=4)
    enriched = app.stream("enriched", record=Enriched, partition_by="customer", partition_count=4)
    profiles: Table[Profile | None] = app.table("profiles", value=Profile)

    @app.processor(users, tables=[profiles])
    async def keep_profiles(events: Events[Profile]) -> None:
        async for profile in events.records():
            profiles.set(profile.customer, profile)

    @app.processor(orders, outputs=[enriched])
    async def enrich(events: Events[Order]) -> None:
        async for order in events.records():
            profile = await profiles.get(order.customer)
            city = profile.city if profile is not None else "unknown"
            events.emit(enriched, Enriched(customer=order.customer, city=city))

    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await users.send_many([Profile(customer=f"c{n}", city=f"city{n}") for n in range(5)])

        async def known() -> bool:
            return sum(await profiles.sizes()) == 5

        await wait_until(known, what="five profiles committed", within=20)
        await orders.send_many([Order(order_id=n, customer=f"c{n}", amount=1.0) for n in range(6)])

        async def all_enriched() -> bool:
            lengths = [await redis.xlen(enriched.key(p)) for p in range(4)]
            return sum(lengths) == 6

        await wait_until(all_enriched, what="six orders enriched", within=20)
        await worker.stop()
    got = {}
    for p in range(4):
        entries: Any = await redis.xrange(enriched.key(p))
        for e in entries:
            record = enriched.codec.decode(e.field_values, stream="enriched")
            got[record.customer] = record.city
    assert got == {**{f"c{n}": f"city{n}" for n in range(5)}, "c5": "unknown"}


async def test_outputs_are_trimmed_like_any_append(redis_url: str, redis: Redis) -> None:
    app = App("trim", redis_url=redis_url, **FAST)
    words = app.stream("words", record=Order, partition_by="customer", partition_count=1)
    out = app.stream(
        "out", record=Order, partition_by="customer", partition_count=1, partition_size=10
    )

    @app.processor(words, outputs=[out])
    async def copy(events: Events[Order]) -> None:
        async for order in events.records():
            events.emit(out, order)

    # A consumer of `out` that has processed everything: the output may be trimmed
    # down to its partition size, and no further.
    await redis.xgroup_create(out.key(0), "reader", "$", mkstream=True)
    sent = [Order(order_id=n, customer="k", amount=1.0) for n in range(300)]
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await words.send_many(sent)
        dead = words.key(0)

        async def copied() -> bool:
            groups: Any = await redis.xinfo_groups(dead)
            return bool(groups) and groups[0][b"entries-read"] == 300 and not groups[0][b"pending"]

        await wait_until(copied, what="300 orders copied", within=20)
        await worker.stop()
    length = await redis.xlen(out.key(0))
    # The reader's group read nothing: its oldest needed entry is the first appended,
    # so nothing may go; advance it and append once more to see the trim.
    assert length == 300
    await redis.xgroup_setid(out.key(0), "reader", "$")
    async with app:
        await words.send(Order(order_id=300, customer="k", amount=1.0))
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)

        async def trimmed() -> bool:
            return await redis.xlen(out.key(0)) < 300

        await wait_until(trimmed, what="the output trimmed", within=20)
        await worker.stop()
    assert await redis.xlen(out.key(0)) >= 10


async def test_the_commit_script_applies_each_kind_of_change_in_order(redis: Redis) -> None:
    # The fenced commit (commit/ack) on its own, with every op streamkit._commit lays out:
    # each op's values counted as its command takes them (pairs or single values), a
    # hash write long enough to be split into two ops, a trim between the writes.
    await redis.set("{s}lock", "me")
    changes = Changes()
    fields = [str(i) for i in range(MAX_VALUES_PER_OP)]
    changes.hset("{s}h", [value for field in fields for value in (field, f"v{field}")])
    changes.trim("{s}out", 2, 1)
    changes.hdel("{s}h", ["0", "1"])
    changes.xadd("{s}out", ["a", "1", "b", "2"])
    changes.xadd("{s}out", ["a", "3"])
    changes.zadd("{s}z", [1, "m1", 2, "m2", 3, "m3"])
    changes.zrem("{s}z", ["m2"])
    keys, args = change_arguments([changes], 3)
    assert args[0] == 8  # the hash write split in two
    ack = LuaScript(script("commit/ack"))
    acked = await ack(redis, keys=["{s}stream", "{s}lock", *keys], args=["me", "g", 0, 0, *args])
    assert acked == 0
    stored = await redis.hgetall("{s}h")
    assert len(stored) == MAX_VALUES_PER_OP - 2
    assert stored[b"2"] == b"v2"
    assert b"0" not in stored
    assert b"1" not in stored
    assert [dict(entry.field_values) for entry in await redis.xrange("{s}out")] == [
        {b"a": b"1", b"b": b"2"},
        {b"a": b"3"},
    ]
    assert await redis.zrange("{s}z", 0, -1, withscores=True) == ((b"m1", 1.0), (b"m3", 3.0))


# ------------------------------------------------- commits of unknown outcome


async def consume_pending(
    fetcher: Fetcher[Tick], locks: LockManager, counts: Table[int], events_sent: int
) -> None:
    """Count what partition 1 holds pending, as its next owner would, to the end."""
    async with serving(fetcher, locks, 1, tables=[counts], redis=fetcher.redis) as events:
        async for tick in events.records():
            counts.set(tick.key, await counts.get(tick.key) + 1)
            if tick.n == events_sent - 1:
                break


#: The digests of the scripts that commit (a commit goes with a read, or alone).
COMMITS = (script("commit/read").sha.encode(), script("commit/ack").sha.encode())


async def commit_blackholed(proxy: FaultProxy) -> None:
    """Wait until a commit went into the proxy's blackhole: it never reaches Redis."""
    await wait_until(
        lambda: any(sha in proxy.dropped_data("requests") for sha in COMMITS),
        what="a commit sent into the blackhole",
        within=5,
    )


async def lost_with_its_link(
    proxy: FaultProxy, call: Callable[[], Awaitable[object]], sent: Callable[[], Awaitable[None]]
) -> RedisUnavailable:
    """Run ``call`` with the proxy's requests blackholed and, once ``sent`` returns (what
    must not reach Redis went into the blackhole), reset the connection: the caller
    hears only that it was lost, its outcome unknown. Returns what ``call`` raised."""
    proxy.blackhole("requests")
    lost: list[RedisUnavailable] = []

    async def run() -> None:
        try:
            await call()
        except RedisUnavailable as exc:
            lost.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await sent()
        proxy.heal()
    [error] = lost
    return error


async def counted_once_by_the_next_owner(
    redis: Redis, ticks: Stream[Tick], locks: LockManager, counts: Table[int]
) -> None:
    """Partition 1's next owner, on a link that works, counts what was left pending:
    every tick is then counted once."""
    async with open_fetcher(redis, ticks, group=GROUP) as fetcher:
        await consume_pending(fetcher, locks, counts, 3)
    assert await counts.read(key_for(1), redis=redis) == 3


async def commit_behind_a_lost_one(
    proxy: FaultProxy, fetcher: Fetcher[Tick], locks: LockManager, counts: Table[int]
) -> None:
    """Count ticks 0-2 of partition 1 through ``proxy``: the commit of tick 0 goes into
    a blackhole; tick 1's waits behind it, then the first is cut."""
    async with (
        locks.hold(lock_name(1), ttl=30) as held,
        fetcher.partition(1, held) as feed,
        open_events(feed, tables=[counts], redis=fetcher.redis, ack_batch=1) as events,
    ):
        async for tick in events.records():
            counts.set(tick.key, await counts.get(tick.key) + 1)
            if tick.n == 0:
                # The fetcher waits for more on a connection it has (a wait sent into
                # the blackhole would give up after its command_timeout).
                await wait_until(lambda: fetcher.statistics().blocks >= 2, what="waits", within=5)
                # Moving past it hands its commit to the fetcher: into a void.
                proxy.blackhole("requests")
            elif tick.n == 1:
                await commit_blackholed(proxy)
            else:
                # Tick 1's commit (count 2) waits behind the first: cut that one.
                proxy.heal()
                await wait_until(lambda: feed.failure is not None, what="failed", within=5)


@pytest.mark.timeout(30)
async def test_no_commit_lands_behind_a_commit_of_unknown_outcome(
    fault_proxies: FaultProxies, redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """A commit lost with its connection (here: it never reached Redis) stops the
    partition; the commits handed over behind it store counts that include its writes,
    so none may land: the lost commit's event stays pending and would be counted twice
    (a soak of random resets counted keys once too many)."""
    proxy = await fault_proxies.open()
    counts = Table("counts", int, 0, stream=ticks.spec, processor=GROUP.rpartition(".")[2])
    await ticks.send_many(ticks_for(1, range(3)))
    async with (
        open_redis(proxy.url) as cut,
        open_fetcher(cut, ticks, group=GROUP, idle_block=0.05, command_timeout=1) as fetcher,
    ):
        with trio.fail_after(10), pytest.raises(RedisUnavailable):
            await commit_behind_a_lost_one(proxy, fetcher, locks, counts)
        # Whatever landed is consistent: the count is that of the ticks acknowledged.
        pending = await pending_ids(redis, ticks, 1)
        assert await counts.read(key_for(1), redis=redis) == 3 - len(pending)
    await counted_once_by_the_next_owner(redis, ticks, locks, counts)


async def leave_after_a_lost_flush(
    proxy: FaultProxy, fetcher: Fetcher[Tick], locks: LockManager, counts: Table[int]
) -> None:
    """Count ticks of partition 1 through ``proxy``; at tick 1, flush (tick 0, count 1)
    into a blackhole, cut it, and leave with its error, tick 1 in flight."""
    async with serving(fetcher, locks, 1, tables=[counts], redis=fetcher.redis) as events:
        async for tick in events.records():
            counts.set(tick.key, await counts.get(tick.key) + 1)
            if tick.n == 1:
                break
        raise await lost_with_its_link(proxy, events.flush, lambda: commit_blackholed(proxy))


@pytest.mark.timeout(30)
async def test_a_commit_of_unknown_outcome_is_not_acknowledged_without_its_writes(
    fault_proxies: FaultProxies, redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """An explicit flush lost with its connection: leaving the partition must not
    acknowledge its events afterwards (their writes went with the lost call; an
    acknowledgement alone would lose the events)."""
    proxy = await fault_proxies.open()
    counts = Table("counts", int, 0, stream=ticks.spec, processor=GROUP.rpartition(".")[2])
    await ticks.send_many(ticks_for(1, range(3)))
    async with open_redis(proxy.url) as cut, open_fetcher(cut, ticks, group=GROUP) as fetcher:
        with trio.fail_after(10), pytest.raises(RedisUnavailable):
            await leave_after_a_lost_flush(proxy, fetcher, locks, counts)
        pending = await pending_ids(redis, ticks, 1)
        assert await counts.read(key_for(1), redis=redis) == 3 - len(pending)
    await counted_once_by_the_next_owner(redis, ticks, locks, counts)


async def close_windows_cut_short(
    proxy: FaultProxy, fetcher: Fetcher[Number], locks: LockManager, stateful: Stateful
) -> None:
    """Fold numbers 100 and 3000 of partition 0 into ``tens`` through ``proxy``, then
    commit: the settling round closes window 0 (known here), then reads window 1000
    (stored by an earlier owner) from Redis, and that read is cut."""
    async with (
        locks.hold(fetcher.keys.lock_name(0), ttl=30) as held,
        fetcher.partition(0, held) as feed,
        open_events(feed, tables=[stateful.tens], redis=fetcher.redis) as events,
    ):
        async for number in events.records():
            await stateful.tens.update(number.key, number, operator.add, number.n)
            if number.n == 3000:
                break

        async def read_sent() -> None:
            await wait_until(
                lambda: b"HSCAN" in proxy.dropped_data("requests"), what="a read cut", within=5
            )

        raise await lost_with_its_link(proxy, events.commit, read_sent)


@pytest.mark.timeout(30)
async def test_a_settling_round_cut_short_loses_no_window(
    fault_proxies: FaultProxies, redis_url: str, redis: Redis
) -> None:
    """A window closed in a settling round whose next read failed keeps its result: the
    partition commits nothing more and starts over (a soak of random resets lost a
    window's result, its values deleted by the commit made as the partition was left)."""
    proxy = await fault_proxies.open()
    stateful = make_app(redis_url=redis_url)
    key = next(f"k{i}" for i in range(100) if partition_for(f"k{i}", PARTITIONS_8) == 0)
    tens_keys = ProcessorKeys(app="stateful", stream="numbers", processor="count")
    async with stateful.app, open_lock_manager(redis) as locks:
        await stateful.numbers.send_many([Number(key=key, n=1000)])
        async with open_fetcher(redis, stateful.numbers, group=tens_keys) as fetcher:
            await consume_numbers(fetcher, locks, stateful, last=1000)
        await stateful.numbers.send_many([Number(key=key, n=100), Number(key=key, n=3000)])
        async with (
            open_redis(proxy.url) as cut,
            open_fetcher(cut, stateful.numbers, group=tens_keys) as fetcher,
        ):
            with trio.fail_after(10), pytest.raises(RedisUnavailable):
                await close_windows_cut_short(proxy, fetcher, locks, stateful)
        pending: Any = await redis.xpending(stateful.numbers.key(0), tens_keys.group)
        if pending.pending:
            # Left pending (nothing committed since the cut): the next owner does them.
            async with open_fetcher(redis, stateful.numbers, group=tens_keys) as fetcher:
                await consume_numbers(fetcher, locks, stateful, last=3000)
        entries: Any = await redis.xrange(stateful.tens_out.key(partition_for(key, 4)))
        got = [stateful.tens_out.codec.decode(e.field_values, stream="tens_out") for e in entries]
        assert sorted((r["start"][-15:], r["value"]) for r in got) == [
            ("T00:00:00+00:00", 100),
            ("T00:00:01+00:00", 1000),
        ]


async def consume_numbers(
    fetcher: Fetcher[Number], locks: LockManager, stateful: Stateful, *, last: int
) -> None:
    """Fold partition 0's numbers into ``tens``, until number ``last``."""
    async with (
        locks.hold(fetcher.keys.lock_name(0), ttl=30) as held,
        fetcher.partition(0, held) as feed,
        open_events(feed, tables=[stateful.tens], redis=fetcher.redis) as events,
    ):
        async for number in events.records():
            await stateful.tens.update(number.key, number, operator.add, number.n)
            if number.n == last:
                break


async def test_tables_larger_than_the_cache_stay_exact(redis_url: str, redis: Redis) -> None:
    """A cache of a few values for hundreds of keys, written again and again: values
    are evicted (never one whose commit has not landed) and read back, every count and
    total exact."""
    app, orders, _, totals, counts = shop(redis_url, state_cache_size=7)
    sent = orders_for(customers=300, per_customer=4)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await orders.send_many(sent)
        await wait_counts(counts, {f"c{c}": 4 for c in range(300)})
        await worker.stop()
    async with app:
        assert await totals.read_many(["c0", "c299"]) == [10.0, 10.0]


async def echo_partition_1(
    fetcher: Fetcher[Tick], locks: LockManager, echoes: Stream[Tick], proxy: FaultProxy | None
) -> None:
    """Echo partition 1's ticks (0-2); with ``proxy``, at tick 1 flush (tick 0's echo)
    into its blackhole and cancel the flush there, as a caller's timeout would."""
    async with serving(fetcher, locks, 1, outputs=[echoes], redis=fetcher.redis) as events:
        async for tick in events.records():
            events.emit(echoes, tick)
            if tick.n == 1 and proxy is not None:
                proxy.blackhole("requests")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(events.flush)
                    await commit_blackholed(proxy)
                    nursery.cancel_scope.cancel()
                proxy.heal()
            elif tick.n == 2:
                break


@pytest.mark.timeout(30)
async def test_a_commit_cancelled_in_flight_stops_the_partition(
    app: App,
    fault_proxies: FaultProxies,
    redis: Redis,
    ticks: Stream[Tick],
    locks: LockManager,
) -> None:
    """A commit cancelled in flight (by the caller's own timeout, say) may have landed
    or not, as one lost with its connection: the partition stops, saying so, and its
    next owner emits each tick's echo once (an acknowledgement of tick 0 without the
    echo the cancelled commit carried would lose it)."""
    proxy = await fault_proxies.open()
    echoes = app.stream("echoes", record=Tick, partition_by="key", partition_count=1)
    await ticks.send_many(ticks_for(1, range(3)))
    async with open_redis(proxy.url) as cut, open_fetcher(cut, ticks, group=GROUP) as fetcher:
        with trio.fail_after(10), pytest.raises(OutcomeUnknown, match="cancelled in flight"):
            await echo_partition_1(fetcher, locks, echoes, proxy)
    async with open_fetcher(redis, ticks, group=GROUP) as fetcher:
        with trio.fail_after(10):
            await echo_partition_1(fetcher, locks, echoes, None)
    echoed: Any = await redis.xrange(echoes.key(0))
    got = [echoes.codec.decode(e.field_values, stream="echoes").n for e in echoed]
    assert got == [0, 1, 2]
