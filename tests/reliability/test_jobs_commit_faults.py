"""Jobs enqueued in the commit under faults: exactly one job per event, each run.

Real ``streamkit worker`` processes run ``tests.apps.committing:app`` (a table, an
output stream and one job enqueued per event, all committed with the
acknowledgements) while a producer sends and faults are injected: kill -9 in the
middle of processing (and so of commits and relays), twice, each followed by a
takeover, a worker frozen past its lease and woken again (a zombie whose commits
and relays must change nothing), Redis killed and restarted with its AOF
(``appendfsync always``), and on a private cluster a manual failover of the master
holding the job's shard and half the partitions, with ``state_replicas=1``.
Afterwards: every key's count equals what was sent; the output holds each event once
with the id of the job it enqueued; the queue holds exactly those jobs, no other (its
counters and every job's record), each with its event's number, and every one ran to
success.
"""

from __future__ import annotations

import contextlib
import signal
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from streamkit import App, Events, ProcessorKeys, open_redis
from streamkit._keys import outbox_key
from streamkit._redis._slots import key_slot
from streamkit._worker import run_worker
from streamkit.jobs._layout import ShardKeys
from streamkit.lowlevel import redis_errors
from streamkit.testing import RedisCluster, wait_until
from tests.apps.committing import Committing, Enqueued, Number, make_app
from tests.cluster_scenarios import cluster_ok, has_role, replica_of
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis, Stream
    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

APP = "tests.apps.committing:app"
GROUP = ProcessorKeys(app="committing", stream="numbers", processor="count").group
KEYS = 32
BATCH = 20
INTERVAL = 0.02  # BATCH events every INTERVAL: about 1,000 events/s
ENV = {"STREAMKIT_BATCH_SIZE": "20", "STREAMKIT_PREFETCH": "2", "COMMITTING_DELAY": "0.005"}
LEASE_TTL = 1.5  # tests.workers.FAST_ENV


async def produce(numbers: Stream[Number], sent: dict[str, list[int]], stop: trio.Event) -> None:
    n = 0
    while not stop.is_set():
        batch = [Number(key=f"k{(n + i) % KEYS}", n=n + i) for i in range(BATCH)]
        with contextlib.suppress(Exception):
            # A send refused while Redis restarts is not sent: not counted either.
            await numbers.send_many(batch)
            for number in batch:
                sent[number.key].append(number.n)
        n += BATCH
        await trio.sleep(INTERVAL)


async def read_enqueued(redis: Redis, enqueued: Stream[Enqueued]) -> list[Enqueued]:
    out: list[Enqueued] = []
    for partition in range(enqueued.partition_count):
        with redis_errors():
            entries: Any = await redis.xrange(enqueued.key(partition))
        out.extend(enqueued.codec.decode(e.field_values, stream=enqueued.name) for e in entries)
    return out


def total_of(sent: dict[str, list[int]]) -> int:
    return sum(len(ns) for ns in sent.values())


async def assert_counted(redis: Redis, committing: Committing, sent: dict[str, list[int]]) -> None:
    counts = committing.counts

    async def all_counted() -> bool:
        with redis_errors():
            return sum(await counts.read_many(list(sent), redis=redis)) == total_of(sent)

    with contextlib.suppress(trio.TooSlowError):
        await wait_until(all_counted, what="every event counted", within=60, interval=0.1)
    got = dict(zip(sent, await counts.read_many(list(sent), redis=redis), strict=True))
    assert got == {k: len(ns) for k, ns in sent.items()}


async def assert_one_job_per_event(
    redis: Redis, committing: Committing, sent: dict[str, list[int]]
) -> None:
    total = total_of(sent)
    shard = ShardKeys(committing.app.name, 0)  # the app's queue, one shard

    async def all_succeeded() -> bool:
        with redis_errors():
            counters: Any = await redis.hgetall(shard.counts)
        return int(counters.get(b"success|note", 0)) >= total

    with contextlib.suppress(trio.TooSlowError):
        await wait_until(all_succeeded, what="every job run", within=60, interval=0.2)
    with redis_errors():
        counters: Any = await redis.hgetall(shard.counts)
    # Exactly as many jobs as events, all succeeded: none more (the counters count
    # every job the queue ever took, whatever its status).
    assert {k: int(v) for k, v in counters.items() if int(v)} == {b"success|note": total}
    echoes = await read_enqueued(redis, committing.enqueued)
    assert Counter(e.n for e in echoes) == Counter(n for ns in sent.values() for n in ns)
    assert len({e.job_id for e in echoes}) == total
    for echo in echoes:
        with redis_errors():
            fields: Any = await redis.hmget(shard.job(echo.job_id), ["args", "status"])
        assert fields[1] == b"success", echo
        assert orjson.loads(fields[0]) == [[echo.n], {}]


@pytest.mark.timeout(150)
@pytest.mark.cluster
async def test_one_job_per_event_under_kills_and_a_zombie(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    committing = make_app(redis_url=redis_url)
    app, numbers = committing.app, committing.numbers
    sent: dict[str, list[int]] = defaultdict(list)
    stop = trio.Event()

    def start() -> WorkerProcess:
        worker = start_worker(redis_url, tmp_path, app=APP, env=ENV)
        workers.append(worker)
        return worker

    def total() -> int:
        return total_of(sent)

    async with app, trio.open_nursery() as nursery:
        first, second = start(), start()
        await wait_members(redis, 2, group=GROUP)
        nursery.start_soon(produce, numbers, sent, stop)
        await wait_until(lambda: total() > 500, what="500 events sent", within=30)
        # kill -9 while commits and relays are in flight, twice: the others take over.
        first.kill()
        third = start()
        await wait_until(lambda: total() > 1200, what="1,200 events sent", within=30)
        third.kill()
        start()
        await wait_members(redis, 2, group=GROUP)
        # A zombie: frozen past its lease, woken after its partitions moved on.
        second.send_signal(signal.SIGSTOP)
        await trio.sleep(LEASE_TTL * 3)  # the injected fault's duration
        second.send_signal(signal.SIGCONT)
        await wait_until(lambda: total() > 3000, what="3,000 events sent", within=60)
        stop.set()
        await assert_counted(redis, committing, sent)
        await assert_one_job_per_event(redis, committing, sent)
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()


@pytest.mark.timeout(120)
async def test_one_job_per_event_across_a_redis_restart(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    url = private_redis.url
    committing = make_app(redis_url=url)
    sent: dict[str, list[int]] = defaultdict(list)
    stop = trio.Event()
    async with open_redis(url) as redis:
        async with committing.app, trio.open_nursery() as nursery:
            workers.extend(start_worker(url, tmp_path, app=APP, env=ENV) for _ in range(2))
            await wait_members(redis, 2, group=GROUP)
            nursery.start_soon(produce, committing.numbers, sent, stop)
            await wait_until(lambda: total_of(sent) > 800, what="800 events sent", within=30)
            private_redis.stop()  # SIGKILL: only what the AOF holds survives
            await trio.sleep(LEASE_TTL + 0.5)  # the injected fault's duration
            await trio.to_thread.run_sync(private_redis.start)
            await wait_until(lambda: total_of(sent) > 2000, what="2,000 events sent", within=60)
            stop.set()
        await assert_counted(redis, committing, sent)
        await assert_one_job_per_event(redis, committing, sent)
    for worker in workers:
        assert worker.process.poll() is None, worker.log()
        assert "Traceback" not in worker.log(), worker.log()


async def read_sent(redis: Redis, numbers: Stream[Number]) -> dict[str, list[int]]:
    """What the numbers stream holds, by key (a send that raised may have landed)."""
    held: dict[str, list[int]] = defaultdict(list)
    for partition in range(numbers.partition_count):
        with redis_errors():
            entries: Any = await redis.xrange(numbers.key(partition))
        for entry in entries:
            number = numbers.codec.decode(entry.field_values, stream=numbers.name)
            held[number.key].append(number.n)
    return held


async def tries_of(redis: Redis, committing: Committing) -> dict[str, int]:
    """Each job's tries, by job id (one: it ran once)."""
    shard = ShardKeys(committing.app.name, 0)
    tries = {}
    for echo in await read_enqueued(redis, committing.enqueued):
        with redis_errors():
            value: Any = await redis.hget(shard.job(echo.job_id), "tries")
        tries[echo.job_id] = int(value)
    return tries


def master_index(key: str) -> int:
    """The node of a new :class:`RedisCluster` (3 masters) whose slots hold ``key``."""
    slot = key_slot(key)
    return 0 if slot <= 5460 else 1 if slot <= 10922 else 2


@pytest.mark.timeout(120)
@pytest.mark.cluster
async def test_one_job_per_event_across_a_manual_failover(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """``CLUSTER FAILOVER`` of the master holding the queue's shard (and partitions 0, 3,
    4 and 7) while two workers commit and relay with ``state_replicas=1``: a manual
    failover loses no write, so every event is counted once and has exactly one job,
    which ran to success in one try."""
    env = {**ENV, "STREAMKIT_STATE_REPLICAS": "1"}
    sent: dict[str, list[int]] = defaultdict(list)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        cluster: RedisCluster = await nursery.start(RedisCluster(node_timeout=1000).run)
        committing = make_app(redis_url=cluster.url)
        node = cluster.nodes[master_index(ShardKeys(committing.app.name, 0).base)]
        assert node is cluster.nodes[master_index(committing.numbers.key(0))]
        async with committing.app:
            redis = committing.app.redis
            async with trio.open_nursery() as producing:
                workers.extend(
                    start_worker(cluster.url, tmp_path, app=APP, env=env) for _ in range(2)
                )
                await wait_members(redis, 2, group=GROUP)
                producing.start_soon(produce, committing.numbers, sent, stop)
                await wait_until(lambda: total_of(sent) > 600, what="600 events sent", within=30)
                promoted = await replica_of(node)
                async with open_redis(f"redis://127.0.0.1:{promoted}") as replica:
                    await replica.cluster_failover()
                await wait_until(
                    lambda: has_role(promoted, "master"), what="the replica promoted", within=20
                )
                await wait_until(
                    lambda: cluster_ok(cluster.nodes), what="cluster_state:ok", within=20
                )
                at_failover = total_of(sent)
                await wait_until(
                    lambda: total_of(sent) > at_failover + 600,
                    what="600 more events sent",
                    within=30,
                )
                stop.set()
            # What counts is what the stream holds; a manual failover lost none of the
            # sends that returned.
            held = await read_sent(redis, committing.numbers)
            for key, ns in sent.items():
                assert set(ns) <= set(held[key]), key
            await assert_counted(redis, committing, held)
            await assert_one_job_per_event(redis, committing, held)
            # Each ran once: one try (a manual failover interrupts no try for good).
            tries = Counter((await tries_of(redis, committing)).values())
            assert tries == {1: total_of(held)}, tries
        for worker in workers:
            assert worker.process.poll() is None, worker.log()
            assert "Traceback" not in worker.log(), worker.log()
            assert "has other masters now" in worker.log()  # it went through the failover
        nursery.cancel_scope.cancel()


@pytest.mark.timeout(60)
@pytest.mark.cluster
async def test_the_relay_of_a_job_waits_for_the_shards_replica(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``state_replicas=1`` the relay keeps a job's outbox entry until the job's
    shard master has a replica of the job: with that replica frozen, the job is added
    (and runs) but its entry stays, and the relay warns; once the replica is back, the
    entry goes, and the job is not added twice."""
    async with trio.open_nursery() as nursery:
        cluster: RedisCluster = await nursery.start(RedisCluster().run)
        app = App("waiting", redis_url=cluster.url, state_replicas=1, lease_ttl=1.0)
        orders = app.stream("orders", record=Number, partition_by="key", partition_count=1)
        ran: list[int] = []

        @app.job
        async def note(n: int) -> int:
            ran.append(n)
            return n

        @app.processor(orders, jobs=[note])
        async def take(events: Events[Number]) -> None:
            async for number in events.records():
                events.enqueue(note, number.n)

        shard = ShardKeys("waiting", 0)
        outbox = outbox_key("waiting", "orders", "take", 0)
        # The partition (and its outbox) on node 1, the queue's shard on node 0.
        assert master_index(orders.key(0)) == 1
        assert master_index(shard.base) == 0
        port = await replica_of(cluster.nodes[0])
        replica = next(n for n in cluster.nodes if n.port == port)
        async with app, trio.open_nursery() as running:
            redis = app.redis

            async def outbox_empty() -> bool:
                with redis_errors():
                    return int(await redis.xlen(outbox)) == 0

            async def relay_warned() -> bool:
                return any("relaying" in r.getMessage() for r in caplog.records)

            await running.start(run_worker, app)
            await orders.send(Number(key="a", n=1))
            await wait_until(lambda: ran == [1], what="the first job run", within=20)
            await wait_until(outbox_empty, what="the first entry relayed", within=20)
            replica.pause()
            try:
                await orders.send(Number(key="a", n=2))
                await wait_until(lambda: ran == [1, 2], what="the second job run", within=20)
                await wait_until(relay_warned, what="the relay's warning", within=20)
                assert "NotReplicated" in caplog.text or "replica" in caplog.text
                # Kept: the shard's replica lacks the job.
                assert not await outbox_empty()
            finally:
                replica.resume()
            await wait_until(outbox_empty, what="the second entry relayed", within=30)
            with redis_errors():
                counters: Any = await redis.hgetall(shard.counts)
            assert {k: int(v) for k, v in counters.items() if int(v)} == {b"success|note": 2}
            assert ran == [1, 2]
            running.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
