"""Master failovers on a real local Redis Cluster while workers process and producers send.

Its own cluster (3 masters, 1 replica each; the session's cluster is not killed), two
``streamkit worker`` subprocesses running the scenario app (8 partitions), and two
producers in this process: one sending with ``replicas=1`` ("safe" keys), one plain.

Where the keys are (slots are given to masters in order: node 0 has 0-5460, node 1
5461-10922, node 2 10923-16383): partitions 0 and 4 on node 0; 1 and 5 and the stream's
metadata on node 1; 2, 3, 6, 7, the processor's membership and control stream, the
leader lease and the ``scenario:seen`` list the processor appends to on node 2.

What is done: ``CLUSTER FAILOVER`` on node 2's replica (a manual failover: the master
hands over once its replica has everything), then ``kill -9`` of node 1 (its replica
is promoted after ``cluster-node-timeout``). Added with the joins: node 1's replica is
held back for half a second before the kill (:func:`lag_then_kill`), so that the kill
loses that half second of writes, as a failover does where replication lags; before,
on one machine the replica had every write and the kill lost none.

Expectation, written before the first run:

* at-least-once: no event whose ``send(..., replicas=1)`` returned is lost, across both
  failovers;
* a plain send that returned may be lost by Redis if it had not reached node 1's
  replica when node 1 was killed: only events of partitions 1 and 5, acknowledged
  shortly (well under a second on one machine) before the kill (since the replica is
  held back: before it was, or after). The manual failover loses nothing;
* nothing that is in a stream after the failovers goes unprocessed (a loss by
  streamkit, as opposed to one by Redis);
* duplicates are allowed (acknowledgements and lease state that had not reached the
  replica make a promoted master deliver again), counted and reported;
* per-key order holds: no event is processed for the first time after a later event
  of its key (keys that lost events merely skip them);
* both workers and both producers go on after each promotion, without restarting;
  the workers log a warning (the lost connection, the redirection), not an exit.

Added after the first runs, with the warning it checks: each worker warns that the
cluster's masters changed.

State rides through the same failovers: two more workers run the stateful app
(``tests.apps.stateful``: two tables, a windowed table and an output stream, with
``state_replicas=1``) while a third producer sends to it with ``replicas=1``; the
killed master is restarted (it comes back as its successor's replica, so that waits
for one replica succeed again). Expectation: every table equals the events in the
stream (not "at least"), each echo is emitted once in order, and each closed window's
result once with the sum of its events.

The joins ride them too: two more workers run ``tests.apps.joined:app`` (orders
left-joined with payments within 500 ms of event time, a table-table join of their
counts and a global table, with ``state_replicas=1``) while a fourth producer sends
both sides with ``replicas=1``. The join's inner partition 2 and the global table's
slot are node 2's (the manual failover), inner partitions 0 and 3 node 1's (the killed
master). Expectation: the join's output equals the model over its inner stream as
multisets (each pair and each unmatched order once, none twice), the counting tables
hold each order id as often as its stream does, the derived table is both counts and
the global table the payments' counts. A read of the global table racing the failovers
(this process reads it all along) may be refused for a moment; one that answers gives
a committed value, never a count greater than the final one: the read is not part of
any commit, so that is all a reader can be promised.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

from streamkit import App, RedisUnavailable, StreamkitError, open_redis
from streamkit.lowlevel import redis_errors
from streamkit.testing import RedisCluster, wait_until
from tests.apps.expiring import (
    Number as Timed,
    assert_latest_then_expired,
    make_app as expiring_app,
)
from tests.apps.joined import Order, Payment, make_app as joined_app
from tests.apps.scenario import Numbered
from tests.apps.stateful import Number, make_app as stateful_app
from tests.cluster_scenarios import (
    PARTITIONS,
    Producer,
    caught_up,
    cluster_ok,
    count_processed,
    has_role,
    order_violations,
    processed,
    processed_at_least,
    replica_of,
    stream_contents,
)
from tests.reliability.test_join_faults import (
    APP as JOINED,
    assert_joined_exactly,
    close_windows,
)
from tests.reliability.test_state_faults import APP as STATEFUL, Sent, assert_exact
from tests.workers import start_worker

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis, Stream
    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


async def produce_numbers(numbers: Stream[Number], sent: Sent, stop: trio.Event) -> None:
    """Numbers for the stateful app, sent with ``replicas=1``; refusals are retried later
    by new numbers (what counts is what the stream holds)."""
    n = 0
    while not stop.is_set():
        # n is also the event time in ms: 5 ms apart, so that windows close.
        batch = [Number(key=f"k{(n + i) % 16}", n=(n + i) * 5) for i in range(10)]
        n += 10
        with contextlib.suppress(StreamkitError):
            await numbers.send_many(batch, replicas=1, replica_timeout=2)
        await trio.sleep(0.01)


async def produce_timed(timed: Stream[Timed], stop: trio.Event) -> None:
    """Numbers for the expiring app (what counts is what its stream holds)."""
    n = 0
    while not stop.is_set():
        batch = [Timed(key=f"k{(n + i) % 16}", n=n + i) for i in range(10)]
        n += 10
        with contextlib.suppress(StreamkitError):
            await timed.send_many(batch)
        await trio.sleep(0.01)


@attrs.define
class JoinProducer:
    """Orders 10 ms apart in event time and their payments (most within the window,
    some late by up to the grace, some never), shuffled in small batches, sent with
    ``replicas=1``. A refused send is not sent again: what counts is what the streams
    hold."""

    sent: int = 0  # order ids 0 .. sent - 1 were sent (or tried)
    refused: int = 0

    async def run(self, orders: Stream[Order], payments: Stream[Payment], stop: trio.Event) -> None:
        rng = random.Random(13)
        while not stop.is_set():
            ids = range(self.sent, self.sent + 10)
            self.sent += 10
            batches: list[tuple[Stream[Any], list[Any]]] = [
                (orders, [Order(order_id=n, at=n * 10) for n in ids]),
                (payments, [Payment(order_id=n, at=n * 10 + rng.choice([0, 100, 450, 800]))
                            for n in ids if n % 7]),
            ]  # fmt: skip
            for stream, batch in batches:
                rng.shuffle(batch)
                try:
                    await stream.send_many(batch, replicas=1, replica_timeout=2)
                except StreamkitError:
                    self.refused += 1
            await trio.sleep(0.05)


@attrs.define
class GlobalReads:
    """Reads of the join app's global table (``payments_seen``) all along, from this
    process: the greatest value each key was read with, and how many reads were refused
    (a failover in progress)."""

    greatest: dict[str, int] = attrs.field(factory=dict)
    answered: int = 0
    refused: int = 0

    async def run(self, table: Any, redis: Redis, producer: JoinProducer, stop: trio.Event) -> None:
        while not stop.is_set():
            keys = [str(n) for n in range(max(0, producer.sent - 40), producer.sent)]
            try:
                values = await table.read_many(keys, redis=redis)
            except StreamkitError:
                self.refused += 1
            else:
                self.answered += 1
                for key, value in zip(keys, values, strict=True):
                    if value is not None:
                        self.greatest[key] = max(self.greatest.get(key, 0), value)
            await trio.sleep(0.05)


async def join_results(redis: Redis, paid: Stream[Any]) -> int | None:
    """How many results the join emitted so far (``None`` while the cluster refuses)."""
    try:
        with redis_errors():
            return sum([await redis.xlen(paid.key(p)) for p in range(paid.partition_count)])
    except RedisUnavailable:
        return None


async def join_results_at_least(redis: Redis, paid: Stream[Any], n: int) -> bool:
    return (await join_results(redis, paid) or 0) >= n


async def count_join_results(redis: Redis, paid: Stream[Any]) -> int:
    """How many results the join emitted; asks again while the cluster refuses."""
    while True:
        count = await join_results(redis, paid)
        if count is not None:
            return count
        await trio.sleep(0.05)


# A key of node 1's slots (slot 7365), for the value that holds its replica back.
LAG_KEY = "{c}lag"
LAG_BYTES = 32 << 20
# How long node 1 goes on before it is killed, its replica holding nothing of it.
LAG = 0.5


async def lag_then_kill(master: RedisServer, replica: RedisServer) -> None:
    """``kill -9`` of ``master`` once it has taken :data:`LAG` seconds of writes that
    its replica will never have: the replica is frozen, then the master takes a value
    larger than what the kernel buffers between them, and every write after it (the
    workers' commits and relays, the producers' sends) waits in the master's output
    buffer, lost with it. Without that, on one machine the replica has every write
    before the master's death, and the kill would lose nothing."""
    replica.pause()
    try:
        async with open_redis(master.url) as redis:
            with redis_errors():
                await redis.set(LAG_KEY, b"x" * LAG_BYTES)
        await trio.sleep(LAG)  # the injected fault's duration
        master.stop()
    finally:
        replica.resume()


# The partitions whose master (node 1) is killed.
KILLED_PARTITIONS = {1, 5}


@pytest.mark.timeout(180)
async def test_workers_and_producers_ride_out_a_manual_failover_and_a_killed_master(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    async with trio.open_nursery() as nursery:
        cluster: RedisCluster = await nursery.start(RedisCluster(node_timeout=1000).run)
        nodes = cluster.nodes
        env = {"SCENARIO_PARTITIONS": str(PARTITIONS), "SCENARIO_BATCH": "20"}
        workers.extend(start_worker(cluster.url, tmp_path, env=env) for _ in range(2))
        stateful_env = {"STREAMKIT_STATE_REPLICAS": "1", "STATEFUL_DELAY": "0.005"}
        stateful_workers = [
            start_worker(cluster.url, tmp_path, app=STATEFUL, env=stateful_env) for _ in range(2)
        ]
        workers.extend(stateful_workers)
        workers.append(
            start_worker(cluster.url, tmp_path, app="tests.apps.expiring:app", env=stateful_env)
        )
        joined_env = {"STREAMKIT_STATE_REPLICAS": "1", "JOINED_BATCH": "20"}
        workers.extend(
            start_worker(cluster.url, tmp_path, app=JOINED, env=joined_env) for _ in range(2)
        )
        joined, orders, payments, paid, _ = joined_app(redis_url=cluster.url)
        join_producer, global_reads = JoinProducer(), GlobalReads()
        timed_app, timed, latest = expiring_app(redis_url=cluster.url)
        stateful = stateful_app(redis_url=cluster.url)
        state_sent = Sent()
        app = App("scenario", redis_url=cluster.url)
        stream = app.stream(
            "numbered", record=Numbered, partition_by="key", partition_count=PARTITIONS
        )
        safe, plain = Producer("s", replicas=1), Producer("p", replicas=0)
        stop = trio.Event()
        async with app, stateful.app, timed_app, joined:
            redis = app.redis
            async with trio.open_nursery() as producers:
                producers.start_soon(safe.run, stream, stop)
                producers.start_soon(plain.run, stream, stop)
                producers.start_soon(produce_numbers, stateful.numbers, state_sent, stop)
                producers.start_soon(produce_timed, timed, stop)
                producers.start_soon(join_producer.run, orders, payments, stop)
                producers.start_soon(
                    global_reads.run, joined.tables["payments_seen"], redis, join_producer, stop
                )

                await wait_until(
                    lambda: processed_at_least(redis, 400), what="400 processed", within=60
                )
                await wait_until(
                    lambda: join_results_at_least(redis, paid, 50),
                    what="50 join results",
                    within=60,
                )

                # 1. Manual failover of node 2 (membership, seen list, 4 partitions).
                promoted = await replica_of(nodes[2])
                async with open_redis(f"redis://127.0.0.1:{promoted}") as replica:
                    await replica.cluster_failover()
                await wait_until(
                    lambda: has_role(promoted, "master"),
                    what="node 2's replica promoted",
                    within=20,
                )
                await wait_until(lambda: cluster_ok(nodes), what="cluster_state:ok", within=20)
                count = await count_processed(redis)
                results = await count_join_results(redis, paid)
                await wait_until(
                    lambda: processed_at_least(redis, count + 400),
                    what="progress after the manual failover",
                    within=30,
                )
                await wait_until(
                    lambda: join_results_at_least(redis, paid, results + 50),
                    what="join results after the manual failover",
                    within=30,
                )

                # 2. kill -9 of node 1 (partitions 1 and 5), its replica lagging.
                successor = await replica_of(nodes[1])
                lagging_from = time.monotonic()
                await lag_then_kill(nodes[1], next(n for n in nodes if n.port == successor))
                await wait_until(
                    lambda: has_role(successor, "master"),
                    what="node 1's replica promoted",
                    within=30,
                )
                alive = [n for n in nodes if n is not nodes[1]]
                await wait_until(lambda: cluster_ok(alive), what="cluster_state:ok", within=20)
                recovered_at = time.monotonic()
                # Back as its successor's replica: waits for a replica succeed again.
                await trio.to_thread.run_sync(nodes[1].start)
                await wait_until(
                    lambda: has_role(nodes[1].port, "slave"),
                    what="the killed master back as a replica",
                    within=30,
                )
                count = await count_processed(redis)
                results = await count_join_results(redis, paid)
                await wait_until(
                    lambda: processed_at_least(redis, count + 400),
                    what="progress after the killed master",
                    within=30,
                )
                await wait_until(
                    lambda: join_results_at_least(redis, paid, results + 50),
                    what="join results after the killed master",
                    within=30,
                )
                stop.set()
            await close_windows(orders, payments, join_producer.sent, retry=True)

            # Everything in the streams now is processed, eventually.
            in_streams = await stream_contents(redis, stream)

            async def all_processed() -> bool:
                return in_streams <= set(await processed(redis))

            await wait_until(all_processed, what="every event in a stream processed", within=60)
            seen = await processed(redis)
            # The stateful app: what its stream holds is what was sent (a send refused
            # for want of a replica may still be in it).
            state_sent.by_key.clear()
            state_sent.total = 0
            for partition in range(stateful.numbers.partition_count):
                with redis_errors():
                    entries: Any = await redis.xrange(stateful.numbers.key(partition))
                state_sent.add(
                    [
                        stateful.numbers.codec.decode(e.field_values, stream="numbers")
                        for e in entries
                    ]
                )
            await assert_exact(redis, state_sent, stateful, min_closed=16)
            # Keys of a table with a ttl: exact through the failovers (each key's
            # greatest n of what its stream holds), then expired and swept.
            greatest: dict[str, int] = {}
            for partition in range(timed.partition_count):
                with redis_errors():
                    entries = await redis.xrange(timed.key(partition))
                for entry in entries:
                    fields: Any = entry.field_values
                    number = timed.codec.decode(fields, stream="numbers")
                    greatest[number.key] = max(greatest.get(number.key, -1), number.n)

            async def caught_up_latest() -> bool:
                values = await latest.read_many(sorted(greatest), redis=redis)
                return values == [greatest[k] for k in sorted(greatest)] or -1 in values

            await wait_until(caught_up_latest, what="latest caught up", within=30)
            await assert_latest_then_expired(redis, latest, greatest)
            # The joins: each result once, the tables exact (from what the streams hold).
            keys = await assert_joined_exactly(
                redis, joined, orders, payments, paid, from_streams=True
            )
            assert len(keys) > join_producer.sent // 2, (len(keys), join_producer.sent)
            # The global table's reads during the failovers: committed values only.
            applied: dict[str, Any] = {
                k: v async for k, v in joined.tables["payments_seen"].items()
            }
            assert global_reads.answered > 0
            beyond = {k: v for k, v in global_reads.greatest.items() if v > applied.get(k, 0)}
            assert not beyond, f"read greater than the final count: {sorted(beyond.items())[:5]}"
            print(
                f"join: {join_producer.sent} orders, {join_producer.refused} sends refused, "
                f"{len(keys)} keys emitted; global reads: {global_reads.answered} answered, "
                f"{global_reads.refused} refused"
            )

        for worker in workers:
            assert worker.process.poll() is None, worker.log()
        nursery.cancel_scope.cancel()

    acknowledged = {**safe.acknowledged, **plain.acknowledged}
    lost_by_redis = set(acknowledged) - in_streams
    lost_safe = lost_by_redis & set(safe.acknowledged)
    unprocessed = in_streams - set(seen)
    duplicated = len(seen) - len(set(seen))
    violations = order_violations(seen)
    report = (
        f"safe: {len(safe.acknowledged)} acknowledged, {len(safe.failed)} failed; "
        f"plain: {len(plain.acknowledged)} acknowledged, {len(plain.failed)} failed; "
        f"lost by Redis: {len(lost_by_redis)} (safe {len(lost_safe)}); "
        f"unprocessed: {len(unprocessed)}; duplicated: {duplicated}; "
        f"order violations: {violations}; producer errors: "
        f"{sorted(set(safe.errors + plain.errors))[:5]}"
    )
    print(report)
    assert not lost_safe, report
    assert not unprocessed, report
    for key, seq in lost_by_redis:
        assert stream.partition_of(Numbered(key=key, seq=seq)) in KILLED_PARTITIONS, report
        assert lagging_from - acknowledged[key, seq] < 1.0, report
    assert violations == 0, report
    # The producers went on after the promotion, without a new client.
    assert max(plain.acknowledged.values()) > recovered_at, report
    # The safe one too, though a send to node 1's slots now fails: its new master has
    # no replica left (NotReplicated).
    assert safe.answered_at > recovered_at, report
    # Each worker says that the masters changed (the manual failover, the killed one).
    for worker in workers:
        assert "has other masters now" in worker.log()


async def test_the_client_follows_the_replica_promoted_for_a_killed_master(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A killed master's slots go to its promoted replica, not to the dead node forever
    (coredis relearns the layout after errors, but did not count a refused connection),
    and the client says that the masters changed."""
    async with trio.open_nursery() as nursery:
        cluster: RedisCluster = await nursery.start(RedisCluster(node_timeout=1000).run)
        nodes = cluster.nodes
        key = "{x}k"  # slot 16287: node 2's
        async with open_redis(cluster.url) as redis:
            await redis.set(key, "1")
            successor = await replica_of(nodes[2])
            # The replica has the key before its master dies (replication is
            # asynchronous: killed sooner, the promoted replica would not have it).
            await wait_until(
                functools.partial(caught_up, nodes[2], successor),
                what="the replica caught up",
                within=10,
            )
            nodes[2].stop()
            await wait_until(
                lambda: has_role(successor, "master"), what="replica promoted", within=30
            )

            async def answered() -> bool:
                try:
                    with redis_errors():
                        return await redis.get(key) == b"1"
                except RedisUnavailable:
                    return False

            await wait_until(answered, what="the key read from the promoted replica", within=10)
        nursery.cancel_scope.cancel()
    changed = [r for r in caplog.records if "has other masters now" in r.getMessage()]
    assert changed, [r.getMessage() for r in caplog.records]
    assert changed[-1].levelname == "WARNING"
    assert f"127.0.0.1:{successor}" in changed[-1].getMessage().partition("before")[0]
