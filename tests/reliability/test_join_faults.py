"""Joins under faults: every result once, none twice, compared with the join's
semantics run one event at a time over the order the events reached it.

Real ``streamkit worker`` processes run ``tests.apps.joined:app`` (orders left-joined
with payments within 500 ms of event time, unmatched orders emitted once their window
closed) while a producer sends both streams, out of order within the grace, and
faults are injected: kill -9 in the middle of commits, a worker frozen past its lease
and woken (a zombie), a worker joining and one leaving. Afterwards the output is
compared with :func:`tests.apps.joined.model` over the join's inner stream: equal, as
multisets (each pair and each unmatched order exactly once).
"""

from __future__ import annotations

import contextlib
import functools
import random
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import StreamkitError, open_redis
from streamkit.lowlevel import redis_errors
from streamkit.testing import wait_until
from tests.apps.joined import (
    GRACE,
    PARTITIONS,
    Order,
    Payment,
    Result,
    forwarded_rows,
    make_app,
    model,
)
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis, Stream
    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

APP = "tests.apps.joined:app"
GROUP = "joined.pay__in.pay"
LEASE_TTL = 1.5  # tests.workers.FAST_ENV
ORDERS = 600


async def forwarded(
    redis: Redis, inner: Stream[Any], orders: Stream[Order], payments: Stream[Payment]
) -> list[list[tuple[bytes, int, int]]]:
    """The join's inner stream, per partition in order: (side, order id, at)."""
    out = []
    for partition in range(inner.partition_count):
        with redis_errors():
            entries: Any = await redis.xrange(inner.key(partition))
        out.append([row for entry in entries for row in forwarded_rows(entry.field_values)])
    return out


async def produce(orders: Stream[Order], payments: Stream[Payment], rng: random.Random) -> None:
    """Orders 10 ms apart in event time; most paid within the window (some late by up
    to the grace, some never), both streams sent in interleaved, shuffled batches."""
    for start in range(0, ORDERS, 40):
        batch_orders = [Order(order_id=n, at=n * 10) for n in range(start, start + 40)]
        batch_payments = [
            Payment(order_id=n, at=n * 10 + rng.choice([0, 100, 450, 800]))
            for n in range(start, start + 40)
            if n % 7
        ]
        rng.shuffle(batch_orders)
        rng.shuffle(batch_payments)
        await orders.send_many(batch_orders)
        await payments.send_many(batch_payments)
        await trio.sleep(0.02)
    await close_windows(orders, payments, ORDERS)


async def close_windows(
    orders: Stream[Order], payments: Stream[Payment], sent: int, *, retry: bool = False
) -> None:
    """One order and one payment far beyond the ``sent`` orders in event time, on every
    partition (ids from 10**6): every window closes. With ``retry``, a refused send is
    sent again (it may then be in a stream twice, which the checks allow)."""
    last = sent * 10 + 10 * GRACE
    closing = [
        next(n for n in range(10**6, 10**7) if orders.partition_of(Order(order_id=n, at=0)) == p)
        for p in range(PARTITIONS)
    ]
    await _send(orders, [Order(order_id=n, at=last) for n in closing], retry=retry)
    await _send(payments, [Payment(order_id=n, at=last) for n in closing], retry=retry)


async def _send(stream: Stream[Any], batch: list[Any], *, retry: bool) -> None:
    while True:
        try:
            await stream.send_many(batch)
        except StreamkitError:
            if not retry:
                raise
            await trio.sleep(0.1)
            continue
        return


@pytest.mark.timeout(180)
@pytest.mark.cluster
async def test_each_result_once_under_kills_a_zombie_and_churn(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    app, orders, payments, paid, _ = make_app(redis_url=redis_url)
    env = {"JOINED_BATCH": "20"}

    def start() -> WorkerProcess:
        worker = start_worker(redis_url, tmp_path, app=APP, env=env)
        workers.append(worker)
        return worker

    async def emitted() -> int:
        total = 0
        for partition in range(paid.partition_count):
            total += await redis.xlen(paid.key(partition))
        return total

    async def caught_up(n: int) -> bool:
        # n results, or (when a fault held a side up until its events were late, and
        # dropped, as the model drops them, so that fewer are due) all that are due
        # for what was forwarded so far.
        rows = await forwarded(redis, app.streams["pay__in"], orders, payments)
        return await emitted() >= min(n, sum(model(rows).values()))

    async with app, trio.open_nursery() as nursery:
        first, second = start(), start()
        await wait_members(redis, 2, group=GROUP)
        nursery.start_soon(produce, orders, payments, random.Random(7))
        await wait_until(lambda: _at_least(emitted, 60), what="60 results", within=60)
        first.kill()  # kill -9 while commits are in flight
        third = start()
        await wait_until(lambda: caught_up(200), what="200 results", within=60)
        second.send_signal(signal.SIGSTOP)  # a zombie: frozen past its lease
        await trio.sleep(LEASE_TTL * 3)  # the injected fault's duration
        second.send_signal(signal.SIGCONT)
        start()  # one joins
        await wait_until(lambda: caught_up(350), what="350 results", within=60)
        third.send_signal(signal.SIGTERM)  # one leaves
    keys = await assert_joined_exactly(redis, app, orders, payments, paid)
    # (A side held up by a fault reaches the join late in event time: its events then
    # miss their window, as the model says too. Most do not.)
    assert len(keys & set(range(ORDERS))) > ORDERS // 2
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()


async def _at_least(emitted: Any, n: int) -> bool:
    return bool(await emitted() >= n)


async def assert_joined_exactly(
    redis: Redis,
    app: Any,
    orders: Stream[Order],
    payments: Stream[Payment],
    paid: Any,
    *,
    from_streams: bool = False,
) -> set[int]:
    """Wait until both sides' closing events were forwarded and the results are in;
    then the output equals the model over the forwarded order, as multisets, and the
    tables are exact (each event counted once, or with ``from_streams`` as often as its
    stream holds it: for producers whose sends a fault may refuse or repeat)."""
    inner = app.streams["pay__in"]

    async def emitted() -> int:
        return sum([await redis.xlen(paid.key(p)) for p in range(paid.partition_count)])

    async def settled() -> bool:
        rows = await forwarded(redis, inner, orders, payments)
        closing = {(side, key) for partition in rows for side, key, _ in partition if key >= 10**6}
        return len(closing) == 2 * PARTITIONS and await emitted() >= sum(model(rows).values())

    with contextlib.suppress(trio.TooSlowError):  # what is missing is said below
        await wait_until(settled, what="every result emitted", within=90, interval=0.5)
    expected = model(await forwarded(redis, inner, orders, payments))
    got: Counter[tuple[str, int | None, int | None]] = Counter()
    for partition in range(paid.partition_count):
        for entry in await redis.xrange(paid.key(partition)):
            fields: Any = entry.field_values
            result = paid.codec.decode(fields, stream="paid")
            got[result["key"], result["order"], result["payment"]] += 1
    missing, extra = expected - got, got - expected
    assert got == expected, f"missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}; " + explain(
        await forwarded(redis, inner, orders, payments), [*missing, *extra][:4]
    )
    async with app:  # (re-entered, or entered again after the workers ran)
        await assert_tables_exact(
            app, await sent_counts(redis, orders, payments) if from_streams else None
        )
    return {int(key) for key, _, _ in got}


def explain(rows: list[list[tuple[bytes, int, int]]], results: list[Result]) -> str:
    """Where each result's key is in the join's inner stream, as the model saw it:
    partition, position, side, event time and the watermark before it."""
    wanted = {int(key) for key, _, _ in results}
    seen = []
    for partition, entries in enumerate(rows):
        watermark = -1
        for position, (side, key, at) in enumerate(entries):
            if key in wanted:
                seen.append(
                    f"p{partition}#{position} {side.decode()} {key} at {at} (wm {watermark})"
                )
            watermark = max(watermark, at)
    return "forwarded: " + "; ".join(seen)


Counts = dict[str, int]


async def sent_counts(
    redis: Redis, orders: Stream[Order], payments: Stream[Payment]
) -> tuple[Counts, Counts]:
    """How many times each order id is in the orders stream and in the payments stream
    (where a send refused during a failover may or may not have landed, or landed twice
    after a retry): what the counting tables must hold, exactly."""
    out: list[Counts] = []
    for stream in (orders, payments):
        counts: Counter[str] = Counter()
        for partition in range(stream.partition_count):
            with redis_errors():
                entries: Any = await redis.xrange(stream.key(partition))
            for entry in entries:
                record = stream.codec.decode(entry.field_values, stream=stream.name)
                counts[str(record.order_id)] += 1
        out.append(dict(counts))
    return out[0], out[1]


async def assert_tables_exact(app: Any, expected: tuple[Counts, Counts] | None = None) -> None:
    """Each order and payment counted once (or ``expected``: as often as its stream
    holds it); the table join is both counts of each key, and the global table the
    payments' counts, once the changes were applied."""

    async def read(name: str) -> dict[str, Any]:
        return {key: value async for key, value in app.tables[name].items()}

    async def agree() -> bool:
        orders, payments = await read("order_counts"), await read("payment_counts")
        # Every count's commit landed (the last may land after the join's last result).
        if expected is None and len(orders) < ORDERS + PARTITIONS:
            return False
        if expected is not None and (orders, payments) != expected:
            return False
        both = {
            key: {"left": orders.get(key), "right": payments.get(key)}
            for key in orders.keys() | payments.keys()
        }
        return await read("counted") == both and await read("payments_seen") == payments

    with contextlib.suppress(trio.TooSlowError):  # what differs is said below
        await wait_until(
            agree, what="the counts, the derived and global tables", within=30, interval=0.1
        )
    orders, payments = await read("order_counts"), await read("payment_counts")
    if expected is None:
        assert set(orders.values()) == {1}, "an order counted twice, or not at all"
        assert set(payments.values()) == {1}
        assert len(orders) == ORDERS + PARTITIONS
    else:
        assert orders == expected[0], "an order counted more or less often than it was sent"
        assert payments == expected[1], "a payment counted more or less often than it was sent"
    derived, seen = await read("counted"), await read("payments_seen")
    assert {k: v["left"] for k, v in derived.items() if v["left"] is not None} == orders
    assert {k: v["right"] for k, v in derived.items() if v["right"] is not None} == payments
    assert seen == payments


@pytest.mark.timeout(120)
async def test_each_result_once_across_a_redis_restart(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    url = private_redis.url
    app, orders, payments, paid, _ = make_app(redis_url=url)
    workers.extend(
        start_worker(url, tmp_path, app=APP, env={"JOINED_BATCH": "20"}) for _ in range(2)
    )
    async with open_redis(url) as redis, app:
        await wait_members(redis, 2, group=GROUP)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce, orders, payments, random.Random(11))
            await wait_until(lambda: _at_least_in(redis, paid, 100), what="100 results", within=60)
            private_redis.stop()  # SIGKILL: only what the AOF holds survives
            await trio.sleep(2.0)  # the injected fault's duration (past the lease)
            await trio.to_thread.run_sync(private_redis.start)
        await assert_joined_exactly(redis, app, orders, payments, paid)
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()


@pytest.mark.timeout(180)
async def test_a_worker_rides_out_a_redis_restart_while_it_starts(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """Redis killed (AOF on) when a worker has started some of its processors and not
    the others: past its session timeout, and past the retries of a single command, the
    worker waits for Redis as it does once running (it used to exit: the membership
    join gave up after the session timeout, the stream's metadata check at once), then
    starts them all, and every result is emitted once."""
    url = private_redis.url
    app, orders, payments, paid, _ = make_app(redis_url=url)
    worker = await _redis_lost_while_starting(private_redis, tmp_path, workers)
    await trio.sleep(RESTARTING)  # the injected fault's duration
    assert worker.process.poll() is None, worker.log()
    await trio.to_thread.run_sync(private_redis.start)
    await wait_until(lambda: RUNNING in worker.log(), what="the worker's start", within=60)
    assert worker.log().count(JOINED) >= len(app.processors), worker.log()
    async with open_redis(url) as redis, app:
        await produce(orders, payments, random.Random(5))
        await assert_joined_exactly(redis, app, orders, payments, paid)
    assert worker.process.poll() is None, worker.log()
    assert "Traceback" not in worker.log(), worker.log()


@pytest.mark.timeout(60)
async def test_a_worker_waiting_for_redis_in_its_start_stops_on_sigterm(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """A worker waiting out an outage in the middle of its start stops on SIGTERM, as
    asked (exit status 0), without a traceback (it ended with one: its start never
    finished)."""
    worker = await _redis_lost_while_starting(private_redis, tmp_path, workers)
    await wait_until(lambda: "unreachable" in worker.log(), what="the outage noticed", within=10)
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit(within=30) == 0, worker.log()
    assert "worker of joined stopped before it started" in worker.log(), worker.log()
    assert "Traceback" not in worker.log(), worker.log()


async def _redis_lost_while_starting(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> WorkerProcess:
    """A worker of the joined app, and Redis killed (AOF on) when the worker has
    started some of its processors and not the others."""
    every = len(make_app(redis_url=private_redis.url)[0].processors)
    for _ in range(5):  # until the fault falls inside the start-up (the first time, all but surely)
        worker = start_worker(private_redis.url, tmp_path, app=APP, env={"JOINED_BATCH": "20"})
        workers.append(worker)
        await wait_until(
            functools.partial(_has_joined, worker),
            what="a first processor",
            within=30,
            interval=0.002,
        )
        worker.send_signal(signal.SIGSTOP)  # frozen where it stands in its start-up
        if worker.log().count(JOINED) < every:
            break
        worker.kill()
    else:
        pytest.fail(f"each worker started all {every} processors before it could be stopped")
    private_redis.stop()  # SIGKILL: only what the AOF holds survives
    worker.send_signal(signal.SIGCONT)
    return worker


def _has_joined(worker: WorkerProcess) -> bool:
    return JOINED in worker.log()


#: The log line of a processor that joined its group, and the worker's once all did.
JOINED = "streamkit.membership: joined "
RUNNING = "worker of joined running"
#: Longer than the workers' session timeout and than a command's retries (5 s).
RESTARTING = 6.0


async def _at_least_in(redis: Redis, paid: Any, n: int) -> bool:
    return sum([await redis.xlen(paid.key(p)) for p in range(paid.partition_count)]) >= n
