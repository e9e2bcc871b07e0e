"""The fetcher: order, takeovers, fencing and backpressure, on a real Redis."""

from __future__ import annotations

import contextlib
import functools
import time
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis as redis_py
import trio
from coredis.tokens import PureToken

from streamkit import (
    ConfigError,
    LockLost,
    OutcomeUnknown,
    ServerRefused,
    open_events,
    open_fetcher,
)
from streamkit._commit import Changes
from streamkit._keys import lock_key, permit_key
from streamkit.testing import wait_until
from tests.consume import (
    GROUP,
    PARTITIONS,
    lock_name,
    pending_count,
    pending_ids,
    serving,
    ticks_for,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import App, Fetcher, LockManager, PartitionFeed, Redis, Stream
    from tests.consume import Tick


async def blocked_clients(redis: Redis) -> bool:
    """Whether some client waits in a blocking command (the session's server is ours)."""
    return cast("int", (await redis.info("clients"))["blocked_clients"]) > 0


async def delivered(redis: Redis, ticks: Stream[Tick], count: int) -> bool:
    """Whether ``count`` entries of partition 0 are delivered and unacknowledged."""
    return await pending_count(redis, ticks, 0) >= count


def blocked_ids(plain: redis_py.Redis) -> set[int]:
    """The ids of the clients waiting in a blocking command (a blocking call)."""
    return {int(c["id"]) for c in plain.client_list() if "b" in c["flags"]}


def waits_anew(plain: redis_py.Redis, before: set[int]) -> bool:
    """Whether a client not among ``before`` waits in a blocking command."""
    return bool(blocked_ids(plain) - before)


def has_more_than(got: list[int], n: int) -> bool:
    return len(got) > n


def delivered_last(plain: redis_py.Redis, key: str) -> bool:
    """Whether the group delivered the last entry of stream ``key`` (a blocking call)."""
    last = plain.xinfo_stream(key)["last-generated-id"]
    groups = plain.xinfo_groups(key)
    return any(g["last-delivered-id"] == last for g in groups)


@pytest.mark.cluster
async def test_records_in_order_per_partition(
    app: App, redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    sent = {p: list(range(p * 1000, p * 1000 + 300)) for p in range(PARTITIONS)}
    for p, numbers in sent.items():
        await ticks.send_many(ticks_for(p, numbers))
    seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}

    async def consume(fetcher: Fetcher[Tick], partition: int) -> None:
        async with serving(fetcher, locks, partition) as events:
            async for tick in events.records():
                seen[partition].append(tick.n)
                if len(seen[partition]) == len(sent[partition]):
                    return

    with trio.fail_after(10):
        async with (
            open_fetcher(redis, ticks, group=GROUP, batch_size=64) as fetcher,
            trio.open_nursery() as nursery,
        ):
            for p in range(PARTITIONS):
                nursery.start_soon(consume, fetcher, p)
    assert seen == sent
    for p in range(PARTITIONS):
        assert await pending_ids(redis, ticks, p) == []


@pytest.mark.cluster
async def test_new_events_wake_an_idle_fetcher(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    got: list[int] = []
    with trio.fail_after(10):
        async with (
            open_fetcher(redis, ticks, group=GROUP, idle_block=5) as fetcher,
            serving(fetcher, locks, 1) as events,
            trio.open_nursery() as nursery,
        ):

            async def produce() -> None:
                # Wait until the fetcher's XREAD blocks in Redis, then send.
                await wait_until(
                    functools.partial(blocked_clients, redis),
                    what="a client blocked in Redis",
                    within=5,
                    interval=0.005,
                )
                await ticks.send_many(ticks_for(1, range(5)))

            nursery.start_soon(produce)
            async for tick in events.records():
                got.append(tick.n)
                if len(got) == 5:
                    break
    # Well before idle_block ran out: the blocking XREAD woke up.
    assert got == [0, 1, 2, 3, 4]


@pytest.mark.cluster
async def test_a_lease_lost_while_waiting_fences_the_read_behind_the_wait(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """A quiet partition's fenced read goes behind the blocking XREAD and runs when it
    returns: it checks the lease then, not when it was sent."""

    async def reader_taken_over_while_waiting(fetcher: Fetcher[Tick]) -> None:
        async with (
            locks.hold(lock_name(2), ttl=30) as held,
            fetcher.partition(2, held) as feed,
            open_events(feed) as events,
        ):
            await wait_until(
                functools.partial(blocked_clients, redis),
                what="the fetcher waiting in a blocking XREAD",
                within=5,
                interval=0.005,
            )
            # Taken over while the fetcher waits (its lease lapsed in a pause).
            await redis.set(held.lease.key, b"someone-else:999")
            await ticks.send_many(ticks_for(2, range(5)))
            async for _ in events.records():
                raise AssertionError("a fenced-out reader got an event")

    with trio.fail_after(10):
        async with open_fetcher(redis, ticks, group=GROUP, idle_block=5) as fetcher:
            with pytest.raises(LockLost) as info:
                await reader_taken_over_while_waiting(fetcher)
    assert "refused" in str(info.value)
    # Nothing was delivered to anyone: it all waits for the rightful owner.
    assert await pending_ids(redis, ticks, 2) == []


async def test_entries_read_as_a_wait_is_cancelled_are_delivered_in_order(
    app: App, redis_url: str, redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """The fenced read behind a wait may run in Redis just as the wait is cancelled
    (here by a partition leaving, which cancels it at once): what it read is pending,
    delivered to no one, and the partition finds it in its history."""
    rounds = 10
    got: list[int] = []
    raced: list[int] = []
    key = ticks.key(0)
    # Blocking clients: they wait without a trip through Trio, so the fetcher cannot
    # take the read's reply before the wait is cancelled.
    with (
        trio.fail_after(60),
        app.blocking() as client,
        redis_py.Redis.from_url(redis_url) as plain,
    ):
        async with (
            open_fetcher(redis, ticks, group=GROUP, idle_block=5) as fetcher,
            serving(fetcher, locks, 0) as events,
            trio.open_nursery() as nursery,
        ):

            async def send_and_leave() -> None:
                for n in range(rounds):
                    async with locks.hold(lock_name(1), ttl=30) as held:
                        before = blocked_ids(plain)
                        async with fetcher.partition(1, held):
                            # The new wait (the one before is cancelled, its
                            # connection discarded).
                            await wait_until(
                                functools.partial(waits_anew, plain, before),
                                what="the fetcher waiting in a new blocking XREAD",
                                within=5,
                                interval=0.002,
                            )
                            client.send(ticks, *ticks_for(0, [n]))
                            # Read by the fenced read behind the wait?
                            deadline = time.monotonic() + 0.5
                            while time.monotonic() < deadline:
                                if delivered_last(plain, key):
                                    raced.append(n)
                                    break
                            # Leaving now cancels the wait before the fetcher took
                            # the read's reply.
                    await wait_until(
                        functools.partial(has_more_than, got, n), what=f"tick {n}", within=10
                    )

            nursery.start_soon(send_and_leave)
            async for tick in events.records():
                got.append(tick.n)
                if len(got) == rounds:
                    break
    assert raced, "no round cancelled a wait whose read had run"
    assert got == list(range(rounds))
    assert await pending_ids(redis, ticks, 0) == []


async def test_entries_delivered_unseen_are_read_before_newer_ones(
    app: App, redis_url: str, redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """A read of the fetcher's own can deliver entries to its consumer that it never
    sees: one whose reply was lost, or the read behind a wait that Redis runs after
    the wait was given up, later than the reads sent since on another connection.
    They are read from the history, in order, before anything newer: never skipped.

    Here each such delivery is made by hand, an entry sent and delivered to the
    partition's consumer in one transaction while the fetcher waits for new entries,
    in the middle of entries the fetcher reads itself."""
    rounds = 5
    got: list[int] = []
    key = ticks.key(0)
    consumer = "p0"
    with trio.fail_after(60), redis_py.Redis.from_url(redis_url) as plain:
        async with (
            open_fetcher(redis, ticks, group=GROUP, idle_block=5) as fetcher,
            serving(fetcher, locks, 0) as events,
            trio.open_nursery() as nursery,
        ):

            async def send() -> None:
                for n in range(0, 3 * rounds, 3):
                    await ticks.send_many(ticks_for(0, [n]))
                    await wait_until(
                        functools.partial(has_more_than, got, n), what=f"tick {n}", within=10
                    )
                    # Sent and delivered to the consumer at once, by no read of the
                    # fetcher's: as a read whose reply never came.
                    stolen = ticks.codec.encode(ticks_for(0, [n + 1])[0])
                    with plain.pipeline(transaction=True) as both:
                        both.xadd(key, cast("Any", stolen))
                        both.xreadgroup(GROUP, consumer, {key: ">"}, count=1)
                        both.execute()
                    await ticks.send_many(ticks_for(0, [n + 2]))
                    await wait_until(
                        functools.partial(has_more_than, got, n + 2),
                        what=f"tick {n + 2}",
                        within=10,
                    )

            nursery.start_soon(send)
            async for tick in events.records():
                got.append(tick.n)
                if len(got) == 3 * rounds:
                    break
    assert got == list(range(3 * rounds))
    await wait_until(
        functools.partial(nothing_pending, redis, ticks), what="every tick acknowledged", within=10
    )


async def nothing_pending(redis: Redis, ticks: Stream[Tick]) -> bool:
    return await pending_ids(redis, ticks, 0) == []


async def test_an_acknowledgement_waits_for_the_commit_in_flight(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """A consumer's last acknowledgement, before it lets its partition go, returns only
    once a commit in flight (sent by the fetcher, or by another task) has landed: one
    landing after the lock's release would be refused, and its changes lost."""
    await ticks.send_many(ticks_for(1, range(3)))
    landed: list[bool] = []
    with trio.fail_after(10):
        async with (
            open_fetcher(redis, ticks, group=GROUP, idle_block=5) as fetcher,
            locks.hold(lock_name(1), ttl=30) as held,
            fetcher.partition(1, held) as feed,
            trio.open_nursery() as nursery,
        ):
            batch = await feed.receive()
            changes = Changes(on_landed=lambda: landed.append(True))
            changes.hset(f"{ticks.key(1)}:counts", [b"k1", b"3"])
            # Held up in Redis for a while: the commit stays in flight.
            await redis.client_pause(300, PureToken.WRITE)
            nursery.start_soon(feed.ack, batch.ids, changes)
            await wait_until(feed.commit_lock.locked, what="a commit in flight", within=5)
            await feed.ack([])
            assert landed == [True]
            feed.done(batch)
    assert await pending_ids(redis, ticks, 1) == []


async def test_backlog_sent_before_any_worker_is_processed(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    await ticks.send_many(ticks_for(2, range(10)))
    with trio.fail_after(10):
        async with (
            open_fetcher(redis, ticks, group=GROUP) as fetcher,
            serving(fetcher, locks, 2) as events,
        ):
            got = [t.n async for t in _first(events.records(), 10)]
    assert got == list(range(10))


async def _first(iterator: AsyncIterator[Any], n: int) -> AsyncIterator[Any]:
    count = 0
    async for item in iterator:
        yield item
        count += 1
        if count == n:
            return


@pytest.mark.cluster
async def test_takeover_processes_pending_entries_first_in_order(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    await ticks.send_many(ticks_for(0, range(20)))
    first_owner: list[int] = []
    with trio.fail_after(10):
        # The first owner fetches everything (one batch) but processes only 5.
        async with open_fetcher(redis, ticks, group=GROUP, batch_size=100) as fetcher:
            with trio.CancelScope() as scope:
                async with serving(fetcher, locks, 0) as events:
                    async for tick in events.records():
                        first_owner.append(tick.n)
                        if len(first_owner) == 6:
                            # Dies while processing the 6th: no ack for it.
                            scope.cancel()
                            await trio.sleep_forever()
        assert len(await pending_ids(redis, ticks, 0)) == 15
        await ticks.send_many(ticks_for(0, range(20, 25)))

        second_owner: list[tuple[int, int]] = []
        async with (
            open_fetcher(redis, ticks, group=GROUP, batch_size=4) as fetcher,
            serving(fetcher, locks, 0) as events,
        ):
            async for event in events.raw():
                second_owner.append((event.record.n, event.delivery_count))
                if len(second_owner) == 19:
                    break
    assert first_owner == list(range(6))
    # The previous owner's pending entries first (delivered twice now), in order,
    # then the new ones (delivered once).
    assert second_owner == [(n, 2) for n in range(5, 20)] + [(n, 1) for n in range(20, 24)]


@pytest.mark.cluster
async def test_fenced_out_reader_cannot_read(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    async def stale_reader(fetcher: Fetcher[Tick]) -> None:
        async with locks.hold(lock_name(3), ttl=30) as held:
            # Another owner took the lock (our lease lapsed during a pause).
            await redis.set(held.lease.key, b"someone-else:999")
            async with fetcher.partition(3, held) as feed, open_events(feed) as events:
                await ticks.send_many(ticks_for(3, range(5)))
                async for _ in events.records():
                    raise AssertionError("a fenced-out reader got an event")

    with trio.fail_after(10):
        async with open_fetcher(redis, ticks, group=GROUP) as fetcher:
            with pytest.raises(LockLost) as info:
                await stale_reader(fetcher)
    assert "refused" in str(info.value)
    # Nothing was delivered to anyone: it all waits for the rightful owner.
    assert await pending_ids(redis, ticks, 3) == []
    groups = await redis.xinfo_groups(ticks.key(3))
    assert cast("Any", groups)[0][b"entries-read"] in (None, 0)


async def exec_calls(redis: Redis) -> int:
    """How many transactions (``EXEC``) the session's server has run so far."""
    stats = cast("dict[str, Any]", await redis.info("commandstats"))
    return int(stats.get("cmdstat_exec", {}).get("calls", 0))


async def test_a_lease_lost_between_reads_of_new_entries_fences_the_next(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """A read of new entries on one server is plain commands in a transaction, fenced
    by a permit that ``commit/permit`` makes only under our lease: the lease taken over
    between two reads, the next is refused and neither delivers nor acknowledges."""
    await ticks.send_many(ticks_for(2, range(1000)))
    transactions = await exec_calls(redis)
    lock = ""

    async def reader(fetcher: Fetcher[Tick]) -> None:
        nonlocal lock
        async with (
            locks.hold(lock_name(2), ttl=30) as held,
            fetcher.partition(2, held) as feed,
            open_events(feed) as events,
        ):
            lock = held.lease.key
            async for _ in events.records():
                if lock:
                    # Both batches read ahead (prefetch 2) are delivered: then the lock
                    # changes hands, before the next read carries the first's acks.
                    await wait_until(
                        functools.partial(delivered_on, redis, ticks, 2, 200),
                        what="two batches delivered",
                        within=5,
                    )
                    await redis.set(lock, b"someone-else:999")
                    lock = ""

    with trio.fail_after(10):
        async with open_fetcher(redis, ticks, group=GROUP, batch_size=100) as fetcher:
            with pytest.raises(LockLost) as info:
                await reader(fetcher)
    assert "refused" in str(info.value)
    assert await exec_calls(redis) > transactions  # (the second read was one)
    # The two batches read under the lease, and nothing after: nothing acknowledged.
    assert await pending_count(redis, ticks, 2) == 200
    groups = cast("Any", await redis.xinfo_groups(ticks.key(2)))
    assert groups[0][b"entries-read"] == 200
    # The permit lives inside a read's transaction only.
    assert not await redis.exists([permit_key(lock_key(lock_name(2)))])


async def delivered_on(redis: Redis, ticks: Stream[Tick], partition: int, count: int) -> bool:
    return await pending_count(redis, ticks, partition) >= count


async def test_fenced_out_worker_cannot_ack(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    await ticks.send_many(ticks_for(1, range(3)))
    lock_key = ""

    async def stale_worker(fetcher: Fetcher[Tick]) -> None:
        nonlocal lock_key
        async with (
            locks.hold(lock_name(1), ttl=30) as held,
            fetcher.partition(1, held) as feed,
            open_events(feed) as events,
        ):
            lock_key = held.lease.key
            async for tick in events.records():
                if tick.n == 1:
                    await redis.set(held.lease.key, b"someone-else:999")

    with trio.fail_after(10):
        async with open_fetcher(redis, ticks, group=GROUP) as fetcher:
            with pytest.raises(LockLost):
                await stale_worker(fetcher)
        pending = await pending_ids(redis, ticks, 1)
        # Record 0's ack was refused too: the stale worker acknowledged nothing.
        assert len(pending) == 3

        await redis.delete([lock_key])
        async with (
            open_fetcher(redis, ticks, group=GROUP) as fetcher,
            serving(fetcher, locks, 1) as events,
        ):
            got = [t.n async for t in _first(events.records(), 3)]
    assert got == [0, 1, 2]
    assert await pending_ids(redis, ticks, 1) == []


async def test_an_acknowledgement_without_a_reply_is_outcome_unknown(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """A fenced acknowledgement held back past the command timeout (``CLIENT PAUSE
    WRITE``) is :class:`OutcomeUnknown`, raised from the block that commits it."""
    await ticks.send_many(ticks_for(1, range(3)))
    got: list[int] = []

    async def process_then_pause(feed: PartitionFeed) -> None:
        async with open_events(feed) as events:
            got.extend([t.n async for t in _first(events.records(), 3)])
            await redis.client_pause(5_000, PureToken.WRITE)

    with trio.fail_after(10):
        async with (
            open_fetcher(redis, ticks, group=GROUP, command_timeout=0.2) as fetcher,
            locks.hold(lock_name(1), ttl=30) as held,
            fetcher.partition(1, held) as feed,
        ):
            try:
                with pytest.raises(OutcomeUnknown) as caught:
                    await process_then_pause(feed)
            finally:
                await redis.client_unpause()
    assert got == [0, 1, 2]
    assert caught.value.reason == "a fenced acknowledgement timed out"


@pytest.mark.cluster
async def test_backpressure_bounds_buffered_entries(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    await ticks.send_many(ticks_for(0, range(50_000)), chunk_size=5000)
    batch_size, prefetch = 500, 2
    with trio.fail_after(20):
        async with (
            open_fetcher(
                redis, ticks, group=GROUP, batch_size=batch_size, prefetch=prefetch
            ) as fetcher,
            serving(fetcher, locks, 0) as events,
        ):
            iterator = events.records()
            first = await iterator.__anext__()
            # What the fetcher read is delivered to its consumer in Redis: wait until
            # it read all it may.
            await wait_until(
                functools.partial(delivered, redis, ticks, prefetch * batch_size),
                what=f"{prefetch * batch_size} entries delivered",
                within=10,
                interval=0.005,
            )
            # Give a misbehaving fetcher the chance to overshoot: nothing notifies
            # about a read that must not happen, so this one wait is a pause.
            await trio.sleep(0.1)
            assert await pending_count(redis, ticks, 0) == prefetch * batch_size
            assert fetcher.statistics().buffered_entries[0] == prefetch * batch_size

            # Consuming frees room, and the fetcher reads on.
            rest = [t.n async for t in _first(iterator, 1500)]
    assert first.n == 0
    assert rest == list(range(1, 1501))


async def test_partition_registered_twice_is_refused(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    with trio.fail_after(10):
        async with open_fetcher(redis, ticks, group=GROUP) as fetcher:
            async with locks.hold(lock_name(0), ttl=30) as held, fetcher.partition(0, held):
                with pytest.raises(ConfigError):
                    async with fetcher.partition(0, held):
                        pass
            with pytest.raises(ConfigError):
                async with fetcher.partition(PARTITIONS, held):
                    pass
            # A lease on another partition's lock cannot fence this one.
            async with locks.hold(lock_name(1), ttl=30) as other:
                with pytest.raises(ConfigError, match="cannot fence partition 2"):
                    async with fetcher.partition(2, other):
                        pass


async def test_a_group_of_another_stream_is_refused(redis: Redis, ticks: Stream[Tick]) -> None:
    with pytest.raises(ConfigError, match="group"):
        async with open_fetcher(redis, ticks, group="shop.orders.proc"):
            pass


async def test_bad_options_are_refused(redis: Redis, ticks: Stream[Tick]) -> None:
    with pytest.raises(ConfigError):
        async with open_fetcher(redis, ticks, group=GROUP, prefetch=0):
            pass
    with pytest.raises(ConfigError):
        async with open_fetcher(redis, ticks, group=GROUP, idle_block=0):
            pass


async def test_users_exception_leaves_the_fetcher_unwrapped(
    redis: Redis, ticks: Stream[Tick]
) -> None:
    with pytest.raises(KeyError):
        async with open_fetcher(redis, ticks, group=GROUP):
            raise KeyError("mine")


@pytest.mark.cluster
async def test_history_reads_count_deliveries(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """Redis 7.0 increments the delivery counter on history reads too."""
    await ticks.send_many(ticks_for(2, range(2)))
    counts: list[int] = []
    with trio.fail_after(10):
        for _ in range(3):
            with contextlib.suppress(_Crash):
                async with (
                    open_fetcher(redis, ticks, group=GROUP) as fetcher,
                    serving(fetcher, locks, 2) as events,
                ):
                    async for event in events.raw():
                        counts.append(event.delivery_count)
                        # Crash before moving past it: it stays pending.
                        raise _Crash
    assert counts == [1, 2, 3]
    assert len(await pending_ids(redis, ticks, 2)) == 2


class _Crash(Exception):
    pass


@pytest.mark.cluster
async def test_acknowledging_trims_what_every_group_processed(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """Consuming frees memory: acknowledgements trim, as appends do (keeping trim_to)."""
    await ticks.send_many(ticks_for(0, range(2000)), chunk_size=500)
    await ticks.send_many(ticks_for(1, range(50)))
    seen = 0
    with trio.fail_after(20):
        async with (
            open_fetcher(redis, ticks, group=GROUP, batch_size=100, trim_to=10) as fetcher,
            serving(fetcher, locks, 0) as events,
        ):
            async for _ in events.records():
                seen += 1
                if seen == 2000:
                    break
    assert seen == 2000
    # Trimmed whole stream nodes (XTRIM MINID ~): far below the 2,000 appended,
    # never below what is still needed, and only where this group processed.
    assert await redis.xlen(ticks.key(0)) < 200
    assert await redis.xlen(ticks.key(1)) == 50
    assert await pending_ids(redis, ticks, 0) == []


async def test_consuming_a_full_redis_frees_memory_for_producers(
    locks: LockManager, redis: Redis, ticks: Stream[Tick]
) -> None:
    # Workers ran before Redis filled up: the group exists (a full Redis refuses to
    # create one, but lets it be found and read).
    await redis.xgroup_create(ticks.key(0), GROUP, "0", mkstream=True)
    await ticks.send_many(ticks_for(0, range(20_000)), chunk_size=1000)
    info: Any = await redis.info("memory")
    await redis.config_set({"maxmemory-policy": "noeviction"})
    await redis.config_set({"maxmemory": int(info["used_memory"])})
    try:
        with pytest.raises(ServerRefused):
            await ticks.send_many(ticks_for(0, range(1000)))
        seen = 0
        with trio.fail_after(30):
            async with (
                open_fetcher(redis, ticks, group=GROUP, trim_to=10) as fetcher,
                serving(fetcher, locks, 0) as events,
            ):
                async for _ in events.records():
                    seen += 1
                    if seen == 20_000:
                        break
        assert seen == 20_000
        # What was processed was trimmed while Redis was full: producers go on.
        await ticks.send_many(ticks_for(0, range(1000)))
    finally:
        await redis.config_set({"maxmemory": 0})


async def test_a_quiet_fetcher_waits_long_and_an_acknowledgement_ends_the_wait(
    redis: Redis, ticks: Stream[Tick], locks: LockManager
) -> None:
    """With events handed out, a blocking wait lasts ``idle_block`` (the consumers'
    acknowledgements go when it ends); with nothing handed out nor due, ``quiet_block``
    (what idle partitions cost Redis is a look at each per wait). An acknowledgement
    queued during a quiet wait (a windowed table's tick commits without a batch) ends
    it: it is sent at once, not a quiet wait later."""
    await ticks.send_many(ticks_for(0, range(3)))
    with trio.fail_after(20):
        async with (
            open_fetcher(redis, ticks, group=GROUP, idle_block=0.05, quiet_block=60) as fetcher,
            locks.hold(lock_name(0), ttl=30) as held,
            fetcher.partition(0, held) as feed,
        ):
            batch = await feed.receive()
            # Handed out: short waits, renewed again and again.
            await wait_until(
                lambda: fetcher.statistics().blocks >= 5, what="short waits", within=10
            )
            feed.ack_later(batch.ids[:1])
            feed.done(batch)

            async def pending(n: int) -> bool:
                return await pending_count(redis, ticks, 0) == n

            await wait_until(
                lambda: pending(2), what="the acknowledgement after a short wait", within=10
            )
            # Nothing out nor due: one long wait.
            await wait_until(
                functools.partial(blocked_clients, redis), what="a quiet wait", within=10
            )
            blocks = fetcher.statistics().blocks
            await trio.sleep(0.5)  # ten short waits' worth: the quiet one goes on
            assert fetcher.statistics().blocks == blocks
            feed.ack_later(batch.ids[1:])
            await wait_until(
                lambda: pending(0),
                what="the acknowledgements queued in a quiet wait, sent at once",
                within=5,
            )
