"""The blocking and asyncio clients against real servers: the same bytes as the Trio
producer, the same jobs, the same tables; threads, lost connections and errors.

The clients run in threads of the test (``trio.to_thread``), asyncio in its own loop
there (``asyncio.run``), while the Trio side (a worker, the queue) runs in the test's
own loop: as a web app and a worker would, in one process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import trio

from streamkit import (
    App,
    ConfigError,
    EncodeError,
    MetadataMismatch,
    NotReplicated,
    OutcomeUnknown,
    Record,
    RedisUnavailable,
    StreamkitError,
    open_redis,
)
from streamkit.clients import AsyncioClient, BlockingClient
from streamkit.jobs import JobCall, JobFailed, JobNotFound, JobStatus
from streamkit.testing import RedisServer, wait_until
from tests.jobs_serving import serving

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from streamkit import Redis, Stream

T = TypeVar("T")


class Line(Record):
    order: int
    customer: str
    amount: float
    tags: list[str]
    note: str | None = None


# Event time of the windowed table's orders: its window stays open through the test.
TOMORROW = datetime.now(UTC) + timedelta(days=1)

RECORDS = [
    Line(
        order=n,
        customer=f"customer-{n % 13}",
        amount=n * 1.25,
        tags=[f"t{n % 3}", "ünïcödé ✓"],
        note=None if n % 4 else "x" * (n % 50),
    )
    for n in range(400)
]


async def blocking(fn: Callable[[], T]) -> T:
    """Run blocking client code in a thread, as a WSGI server would."""
    return await trio.to_thread.run_sync(fn)


async def in_asyncio(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run asyncio client code in an event loop of its own, in a thread."""
    return await trio.to_thread.run_sync(lambda: asyncio.run(fn()))


def shop(redis_url: str, name: str = "shop", **settings: Any) -> tuple[App, Stream[Line]]:
    app = App(name, redis_url=redis_url, **settings)
    orders = app.stream("orders", record=Line, partition_by="customer", partition_count=4)
    return app, orders


async def entries_of(redis: Redis, stream: Stream[Any]) -> list[list[dict[bytes, bytes]]]:
    """Every partition's entries, as their fields, in order."""
    out = []
    for partition in range(stream.partition_count):
        entries: Any = await redis.xrange(stream.key(partition))
        out.append([dict(e.field_values) for e in entries])
    return out


# ------------------------------------------------------------------ the same bytes


@pytest.mark.cluster
@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_trio_blocking_and_asyncio_producers_write_the_same_bytes(
    redis_url: str, redis: Redis, compression: str | None
) -> None:
    streams = {}
    for via in ("trio", "blocking", "asyncio"):
        streams[via] = shop(redis_url, f"via-{via}", compression=compression)
    bulk, last = RECORDS[:-1], RECORDS[-1]

    app, orders = streams["trio"]
    async with app:
        trio_ids = await orders.send_many(bulk, chunk_size=7)
        trio_ids += await orders.send(last)

    app, orders = streams["blocking"]

    def send_blocking() -> list[str]:
        with app.blocking() as client:
            ids = client.send_many(orders, bulk, chunk_size=7)
            return ids + client.send(orders, last)

    blocking_ids = await blocking(send_blocking)

    asyncio_app, asyncio_orders = streams["asyncio"]

    async def send_asyncio() -> list[str]:
        async with asyncio_app.asyncio() as client:
            ids = await client.send_many(asyncio_orders, bulk, chunk_size=7)
            return ids + await client.send(asyncio_orders, last)

    asyncio_ids = await in_asyncio(send_asyncio)

    assert len(trio_ids) == len(blocking_ids) == len(asyncio_ids) == len(RECORDS)
    written = {via: await entries_of(redis, orders) for via, (_, orders) in streams.items()}
    assert sum(map(len, written["trio"])) == len(RECORDS)
    assert all(written["trio"])  # every partition got some
    assert written["blocking"] == written["trio"]
    assert written["asyncio"] == written["trio"]
    metadata = {
        via: await redis.hgetall(orders.spec.meta_key) for via, (_, orders) in streams.items()
    }
    assert metadata["blocking"] == metadata["trio"] == metadata["asyncio"]
    # The ids each returned are those of the entries, record by record.
    _, orders = streams["blocking"]
    for record, entry_id in zip(RECORDS, blocking_ids, strict=True):
        partition_entries: Any = await redis.xrange(
            orders.key(orders.partition_of(record)), entry_id, entry_id
        )
        assert orders.codec.decode(partition_entries[0].field_values, stream="o") == record
    # About one idempotency marker per partition is left, as with the Trio producer.
    markers = [k async for k in redis.scan_iter("__once:*")]
    assert len(markers) <= 3 * orders.partition_count


async def test_a_producer_with_another_partition_count_is_refused(redis_url: str) -> None:
    app, orders = shop(redis_url)
    async with app:
        await orders.send(RECORDS[0])
    other = App("shop", redis_url=redis_url)
    wider = other.stream("orders", record=Line, partition_by="customer", partition_count=8)
    async with other:
        with pytest.raises(MetadataMismatch) as from_trio:
            await wider.send(RECORDS[0])

    def send_blocking() -> None:
        with other.blocking() as client:
            client.send(wider, RECORDS[0])

    with pytest.raises(MetadataMismatch) as from_blocking:
        await blocking(send_blocking)

    async def send_asyncio() -> None:
        async with other.asyncio() as client:
            await client.send(wider, RECORDS[0])

    with pytest.raises(MetadataMismatch) as from_asyncio:
        await in_asyncio(send_asyncio)
    assert str(from_blocking.value) == str(from_trio.value) == str(from_asyncio.value)
    assert "partition_count" in str(from_blocking.value)


async def test_replica_waits_say_how_many_replicas_acknowledged(redis_url: str) -> None:
    # The session's server has no replicas: a send that asks for one is on the master
    # and says so.
    app, orders = shop(redis_url)

    def send_blocking() -> None:
        with app.blocking() as client:
            client.send(orders, RECORDS[0], replicas=1, replica_timeout=0.05)

    with pytest.raises(NotReplicated) as caught:
        await blocking(send_blocking)
    assert (caught.value.wanted, caught.value.acknowledged) == (1, 0)

    async def send_asyncio() -> None:
        async with app.asyncio() as client:
            await client.send_many(orders, RECORDS[:50], replicas=1, replica_timeout=0.05)

    with pytest.raises(NotReplicated):
        await in_asyncio(send_asyncio)


@pytest.mark.cluster
async def test_replica_waits_on_a_cluster_wait_for_the_partitions_replica(
    redis_cluster_url: str,
) -> None:
    app, orders = shop(redis_cluster_url)

    def send_blocking() -> int:
        with app.blocking() as client:
            return len(client.send_many(orders, RECORDS, replicas=1, replica_timeout=5))

    assert await blocking(send_blocking) == len(RECORDS)

    async def send_asyncio() -> int:
        async with app.asyncio() as client:
            return len(await client.send_many(orders, RECORDS, replicas=1, replica_timeout=5))

    assert await in_asyncio(send_asyncio) == len(RECORDS)


@pytest.mark.cluster
async def test_a_batch_whose_scripts_the_server_forgot_loads_them_and_appends_once(
    redis_url: str, redis: Redis
) -> None:
    """Every EVALSHA of a pipelined batch refused with NOSCRIPT (the script cache was
    flushed): the client loads the script once and runs those calls again; each record
    lands once, in order, on a server and on every node of a cluster."""
    streams = {via: shop(redis_url, f"via-{via}") for via in ("trio", "blocking", "asyncio")}
    app, orders = streams["trio"]
    async with app:
        await orders.send_many(RECORDS)

    _, blocking_orders = streams["blocking"]
    await redis.script_flush()

    def send_blocking() -> list[str]:
        with streams["blocking"][0].blocking() as client:
            return client.send_many(blocking_orders, RECORDS)

    assert len(await blocking(send_blocking)) == len(RECORDS)

    _, asyncio_orders = streams["asyncio"]
    await redis.script_flush()

    async def send_asyncio() -> list[str]:
        async with streams["asyncio"][0].asyncio() as client:
            return await client.send_many(asyncio_orders, RECORDS)

    assert len(await in_asyncio(send_asyncio)) == len(RECORDS)
    written = {via: await entries_of(redis, orders) for via, (_, orders) in streams.items()}
    assert written["blocking"] == written["asyncio"] == written["trio"]


# ------------------------------------------------------------------------- jobs


def job_app(redis_url: str, started: threading.Event | None = None) -> App:
    app = App("shop", redis_url=redis_url, job_lease_ttl=1.0)

    @app.job
    async def add(a: int, b: int = 0) -> int:
        return a + b

    @app.job(retries=0)
    def refuse(reason: str) -> None:
        raise ValueError(reason)

    @app.job
    async def linger() -> None:
        if started is not None:
            started.set()
        await trio.sleep(60)

    return app


async def test_jobs_enqueued_by_the_clients_run_on_a_worker(redis_url: str) -> None:
    app = job_app(redis_url)
    async with app, serving(app.job_queue):

        def use_blocking() -> None:
            with app.blocking() as client:
                handle = client.enqueue(app.jobs["add"], 2, b=3)
                assert handle.result(timeout=10) == 5
                assert handle.status() is JobStatus.SUCCESS
                info = handle.info()
                assert (info.name, info.args, info.kwargs, info.tries) == ("add", (2,), {"b": 3}, 1)
                assert client.delay("add", 40, 2).result(timeout=10) == 42
                failing = client.delay("refuse", "no thanks")
                with pytest.raises(JobFailed) as caught:
                    failing.result(timeout=10)
                assert (caught.value.error_type, caught.value.status) == ("ValueError", "dead")
                assert failing.status() is JobStatus.DEAD
                handles = client.enqueue_many("add", [(n, n) for n in range(100)])
                assert [h.result(timeout=10) for h in handles] == [2 * n for n in range(100)]

        await blocking(use_blocking)

        async def use_asyncio() -> None:
            async with app.asyncio() as client:
                handle = await client.enqueue("add", 1, b=1)
                assert await handle.result(timeout=10) == 2
                assert await handle.status() is JobStatus.SUCCESS
                many = await client.enqueue_many("add", [{"a": n} for n in range(50)])
                results = await asyncio.gather(*(h.result(timeout=10) for h in many))
                assert results == list(range(50))
                with pytest.raises(JobFailed):
                    await (await client.delay("refuse", "no")).result(timeout=10)

        await in_asyncio(use_asyncio)


async def test_a_client_enqueues_the_same_job_record_as_the_trio_queue(
    redis_url: str, redis: Redis
) -> None:
    app = job_app(redis_url)
    at = datetime.now(UTC) + timedelta(hours=1)
    options: dict[str, Any] = {"priority": "high", "expires": timedelta(hours=2)}
    async with app:
        add = app.jobs["add"]
        trio_handles = [
            await add.enqueue(1, b=2, **options),
            await add.enqueue(3, delay=timedelta(minutes=5)),
            await add.enqueue(4, at=at),
        ]

    def enqueue_blocking() -> list[str]:
        with app.blocking() as client:
            return [
                client.enqueue(add, 1, b=2, **options).id,
                client.enqueue(add, 3, delay=timedelta(minutes=5)).id,
                client.enqueue(add, 4, at=at).id,
            ]

    async def enqueue_asyncio() -> list[str]:
        async with app.asyncio() as client:
            return [
                (await client.enqueue(add, 1, b=2, **options)).id,
                (await client.enqueue(add, 3, delay=timedelta(minutes=5))).id,
                (await client.enqueue(add, 4, at=at)).id,
            ]

    ids = {
        "trio": [h.id for h in trio_handles],
        "blocking": await blocking(enqueue_blocking),
        "asyncio": await in_asyncio(enqueue_asyncio),
    }
    async with app:
        queue = app.job_queue
        records = {
            via: [await redis.hgetall(queue.shard_keys[0].job(job_id)) for job_id in job_ids]
            for via, job_ids in ids.items()
        }
        infos = {
            via: [await queue.handle(job_id).info() for job_id in job_ids]
            for via, job_ids in ids.items()
        }
    # The server's clock at each enqueue, and the entry in the ready stream.
    timed = {b"enqueued", b"due", b"expires", b"entry"}
    for via in ("blocking", "asyncio"):
        for theirs, ours in zip(records[via], records["trio"], strict=True):
            assert {k: v for k, v in theirs.items() if k not in timed} == {
                k: v for k, v in ours.items() if k not in timed
            }
            assert theirs.keys() == ours.keys()
    for via, job_infos in infos.items():
        first, delayed, timed_at = job_infos
        assert (first.priority, first.status) == ("high", JobStatus.SENT), via
        assert first.expires_at is not None
        assert first.enqueued_at is not None
        assert first.expires_at - first.enqueued_at == timedelta(hours=2), via
        assert delayed.status is JobStatus.SCHEDULED
        assert delayed.due_at is not None
        assert delayed.enqueued_at is not None
        assert delayed.due_at - delayed.enqueued_at == timedelta(minutes=5), via
        assert timed_at.due_at is not None
        assert abs(timed_at.due_at - at) < timedelta(milliseconds=1), via


async def test_job_ids_dedupe_across_the_trio_queue_and_the_clients(redis_url: str) -> None:
    app = job_app(redis_url)
    async with app:
        first = await app.jobs["add"].enqueue(1, job_id="order-7")

    def enqueue_blocking() -> str:
        with app.blocking() as client:
            handle = client.enqueue("add", 2, job_id="order-7")
            [many] = client.enqueue_many("add", [JobCall(args=(2,), job_id="order-7")])
            assert (handle.added, many.added) == (False, False)  # duplicates: nothing added
            return handle.id

    async def enqueue_asyncio() -> str:
        async with app.asyncio() as client:
            handle = await client.enqueue("add", 3, job_id="order-7")
            assert not handle.added
            return handle.id

    assert first.added
    assert await blocking(enqueue_blocking) == first.id
    assert await in_asyncio(enqueue_asyncio) == first.id
    async with app:
        counts = await app.job_queue.counts()
        assert counts.queued["normal"] == 1
        assert (await app.job_queue.handle(first.id).info()).args == (1,)


async def test_abort_a_queued_and_a_running_job_from_the_clients(redis_url: str) -> None:
    started = threading.Event()
    app = job_app(redis_url, started)

    def abort_queued() -> None:
        with app.blocking() as client:
            handle = client.delay("add", 1, 1)
            assert handle.abort("changed my mind") is JobStatus.ABORTED
            with pytest.raises(JobFailed) as caught:
                handle.result(timeout=5)
            assert caught.value.error_type == "Aborted"
            assert "changed my mind" in str(caught.value)

    await blocking(abort_queued)

    async with app, serving(app.job_queue):

        async def abort_running() -> None:
            async with app.asyncio() as client:
                handle = await client.delay("linger")
                assert await asyncio.to_thread(started.wait, 10)
                assert await handle.status() is JobStatus.EXECUTING
                assert await handle.abort() is JobStatus.EXECUTING
                with pytest.raises(JobFailed) as caught:
                    await handle.result(timeout=10)
                assert caught.value.status == "aborted"
                assert await handle.status() is JobStatus.ABORTED

        await in_asyncio(abort_running)


async def test_waiting_for_results_times_out_and_unknown_jobs_are_said(redis_url: str) -> None:
    app = job_app(redis_url)

    def use_blocking() -> None:
        with app.blocking() as client:
            handle = client.delay("add", 1)
            with pytest.raises(TimeoutError, match=r"did not end within 0\.3s"):
                handle.result(timeout=0.3)
            unknown = client.handle("no-such-job")
            with pytest.raises(JobNotFound):
                unknown.status()
            with pytest.raises(JobNotFound):
                unknown.result(timeout=1)
            with pytest.raises(JobNotFound):
                unknown.abort()

    await blocking(use_blocking)

    async def use_asyncio() -> None:
        async with app.asyncio() as client:
            with pytest.raises(TimeoutError):
                await (await client.delay("add", 1)).result(timeout=0.3)
            with pytest.raises(JobNotFound):
                await client.handle("no-such-job").info()

    await in_asyncio(use_asyncio)


async def test_enqueue_checks_arguments_and_options_before_sending(redis_url: str) -> None:
    app = job_app(redis_url)
    stranger = App("elsewhere", redis_url=redis_url)

    @stranger.job
    async def other() -> None: ...

    def use_blocking() -> None:
        with app.blocking() as client:
            with pytest.raises(TypeError, match="job add"):
                client.delay("add", 1, 2, 3)
            with pytest.raises(EncodeError, match="the arguments of job add"):
                client.delay("add", object())
            # Of the types the job's annotations declare, as the Trio queue checks.
            with pytest.raises(TypeError) as mistyped:
                client.delay("add", "42", b="1")
            assert str(mistyped.value) == (
                "job add: argument a: expected int, got str '42'; "
                "argument b: expected int, got str '1'"
            )
            with pytest.raises(ConfigError, match="priority"):
                client.enqueue("add", 1, priority="urgent")  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="delay"):
                client.enqueue("add", 1, delay=-1)
            with pytest.raises(ConfigError, match="not a job of app 'shop'"):
                client.delay(other)
            with pytest.raises(ConfigError, match="not a job of app 'shop'"):
                client.delay("other")

    async def use_asyncio() -> None:
        async with app.asyncio() as client:
            with pytest.raises(TypeError, match=r"^job add: argument a: expected int, got float"):
                await client.enqueue_many("add", [(1,), (2.5,)])
            with pytest.raises(TypeError, match=r"^job add: each call of enqueue_many is a tuple"):
                await client.enqueue_many("add", [5])  # type: ignore[list-item]

    not_a_call = r"^job add: each call of enqueue_many is a tuple of positional arguments "
    with pytest.raises(TypeError, match=not_a_call + r".*, got int 5$"):
        await blocking(lambda: app.blocking().enqueue_many("add", [(1,), 5]))  # type: ignore[list-item]
    await blocking(use_blocking)
    await in_asyncio(use_asyncio)
    async with app:
        with pytest.raises(TypeError, match=not_a_call + r".*got list \[1\] \(a list of"):
            await app.jobs["add"].enqueue_many([[1]])
        assert (await app.job_queue.counts()).pending == 0


# ------------------------------------------------------------------------ tables


async def test_the_clients_read_tables_a_processor_wrote(redis_url: str) -> None:
    from streamkit import tumbling
    from streamkit._worker import run_worker

    app, orders = shop(redis_url, lease_ttl=1.0, heartbeat_interval=0.1, session_timeout=1.0)
    totals = app.table("totals", value=float, default=0.0)
    revenue = app.window(
        "revenue", tumbling(timedelta(hours=1)), value=float, initial=0.0, time=lambda r: TOMORROW
    )

    @app.processor(orders, tables=[totals, revenue])
    async def tally(events: Any) -> None:
        async for line in events.records():
            totals.set(line.customer, await totals.get(line.customer) + line.amount)
            await revenue.update(line.customer, line, lambda v, a: v + a, line.amount)

    def send_blocking() -> None:
        with app.blocking() as client:
            client.send_many(orders, RECORDS)

    expected = {f"customer-{c}": 0.0 for c in range(13)}
    for record in RECORDS:
        expected[record.customer] += record.amount

    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await blocking(send_blocking)

        async def counted() -> bool:
            return {k: v async for k, v in totals.items()} == expected

        await wait_until(counted, what="every order counted", within=30)
        await worker.stop()

    async with app:
        trio_view = {
            "one": await totals.read("customer-3"),
            "missing": await totals.read("nobody"),
            "many": await totals.read_many(["customer-0", "nobody", "customer-12"]),
            "items": sorted([item async for item in totals.items()]),
            "sizes": await totals.sizes(),
            "windows": await revenue.read("customer-5"),
            "window items": sorted([item async for item in revenue.items()]),
        }

    def read_blocking() -> dict[str, Any]:
        with app.blocking() as client:
            return {
                "one": client.read(totals, "customer-3"),
                "missing": client.read(totals, "nobody"),
                "many": client.read_many(totals, ["customer-0", "nobody", "customer-12"]),
                "items": sorted(client.items(totals)),
                "sizes": client.sizes(totals),
                "windows": client.read(revenue, "customer-5"),
                "window items": sorted(client.items(revenue)),
            }

    async def read_asyncio() -> dict[str, Any]:
        async with app.asyncio() as client:
            return {
                "one": await client.read(totals, "customer-3"),
                "missing": await client.read(totals, "nobody"),
                "many": await client.read_many(totals, ["customer-0", "nobody", "customer-12"]),
                "items": sorted([item async for item in client.items(totals)]),
                "sizes": await client.sizes(totals),
                "windows": await client.read(revenue, "customer-5"),
                "window items": sorted([item async for item in client.items(revenue)]),
            }

    assert trio_view["one"] == expected["customer-3"]
    assert trio_view["missing"] == 0.0
    assert trio_view["windows"]  # one window, with the customer's total
    assert await blocking(read_blocking) == trio_view
    assert await in_asyncio(read_asyncio) == trio_view

    def defaults_blocking() -> tuple[Any, Any]:
        with app.blocking() as client:
            return client.read(totals, "nobody", -1.0), client.read(revenue, "nobody")

    assert await blocking(defaults_blocking) == (-1.0, [])


# ----------------------------------------------------------------- threads, errors


async def test_threads_share_one_blocking_client(redis_url: str, redis: Redis) -> None:
    app, orders = shop(redis_url)

    @app.job
    async def noop(n: int) -> None: ...

    threads, sends = 8, 40
    ids: list[list[str]] = [[] for _ in range(threads)]
    job_ids: list[list[str]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def work(client: BlockingClient, me: int, start: threading.Barrier) -> None:
        try:
            start.wait()
            for n in range(sends):
                ids[me] += client.send(orders, RECORDS[(me * sends + n) % len(RECORDS)])
                job_ids[me].append(client.delay(noop, n).id)
            ids[me] += client.send_many(orders, RECORDS[:100], chunk_size=10)
        except BaseException as exc:  # reported below
            errors.append(exc)

    def run_threads() -> None:
        start = threading.Barrier(threads)
        with app.blocking(max_connections=4) as client:
            workers = [
                threading.Thread(target=work, args=(client, me, start)) for me in range(threads)
            ]
            for thread in workers:
                thread.start()
            for thread in workers:
                thread.join()

    await blocking(run_threads)
    assert not errors, errors
    every_id = [entry_id for mine in ids for entry_id in mine]
    assert len(every_id) == threads * (sends + 100)
    total = sum([await redis.xlen(key) for key in orders.partition_keys()])
    assert total == len(every_id)
    assert all(every_id)
    every_job = [job_id for mine in job_ids for job_id in mine]
    assert len(set(every_job)) == threads * sends
    async with app:
        assert (await app.job_queue.counts()).queued["normal"] == threads * sends


async def test_a_lost_reply_is_retried_with_its_marker_and_appends_once(
    private_redis: RedisServer,
) -> None:
    """A send whose reply does not come (the server hangs) is sent again with its
    idempotency marker: once the server answers, the records are in it once."""
    app, orders = shop(private_redis.url)
    retried = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "appending to" in record.getMessage():
                retried.set()

    handler = Watch(level=logging.DEBUG)
    logger = logging.getLogger("streamkit.redis")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    client = app.blocking(socket_timeout=0.3)
    try:
        await blocking(lambda: client.send(orders, RECORDS[0]))  # connected, metadata checked
        private_redis.pause()
        outcome: list[Any] = []

        def send() -> None:
            try:
                outcome.append(client.send(orders, *RECORDS[1:6]))
            except BaseException as exc:  # reported below
                outcome.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        await wait_until(retried.is_set, what="the send to be retried", within=10)
        private_redis.resume()
        await blocking(lambda: sender.join(10))
        assert len(outcome) == 1
        assert isinstance(outcome[0], list), outcome
        async with open_redis(private_redis.url) as redis:
            entries = await entries_of(redis, orders)
        assert sum(map(len, entries)) == 6
    finally:
        private_redis.resume()
        logger.removeHandler(handler)
        logger.setLevel(level)
        client.close()


async def test_an_enqueue_whose_reply_is_lost_is_not_sent_again(
    private_redis: RedisServer,
) -> None:
    app = job_app(private_redis.url)
    client = app.blocking(socket_timeout=0.3)
    try:
        await blocking(lambda: client.delay("add", 0))  # connected, script loaded
        private_redis.pause()
        with pytest.raises(OutcomeUnknown, match="may or may not have run"):
            await blocking(lambda: client.delay("add", 1))
        private_redis.resume()
        async with app:
            # The enqueue sat in the server's socket buffer and ran once it woke: one
            # job, not two.
            assert (await app.job_queue.counts()).queued["normal"] == 2
    finally:
        private_redis.resume()
        client.close()


async def test_a_record_of_the_wrong_field_types_is_refused_by_every_producer(
    redis_url: str, redis: Redis
) -> None:
    """Refused before anything is sent, by both clients as by the Trio producer, in the
    same words: the stream, the field, the type declared, the type given."""
    app, orders = shop(redis_url)
    # A record of the wrong field types: refused before anything is sent, as the Trio
    # producer refuses it, by both clients.
    mistyped = Line(order="7", customer="c", amount=1.0, tags=["a"])  # type: ignore[arg-type]
    expected = "orders: Line.order: expected int, got str '7'"

    def send_mistyped() -> None:
        with app.blocking() as client:
            client.send(orders, mistyped)

    async def send_mistyped_asyncio() -> None:
        async with app.asyncio() as client:
            await client.send_many(orders, [RECORDS[0], mistyped])

    before = await entries_of(redis, orders)
    with pytest.raises(EncodeError) as from_blocking:
        await blocking(send_mistyped)
    with pytest.raises(EncodeError) as from_asyncio:
        await in_asyncio(send_mistyped_asyncio)
    async with app:
        with pytest.raises(EncodeError) as from_trio:
            await orders.send(mistyped)
    assert str(from_blocking.value) == str(from_asyncio.value) == str(from_trio.value) == expected
    assert await entries_of(redis, orders) == before


def amount_key(line: Line) -> object:
    """A partition key function whose keys the partitioner refuses (floats)."""
    return line.amount


@pytest.mark.parametrize(
    ("customer", "given"), [(None, "NoneType None"), (["c"], "list ['c']"), (1.5, "float 1.5")]
)
async def test_a_key_field_of_the_wrong_type_is_said_as_a_field_by_every_producer(
    redis_url: str, redis: Redis, customer: object, given: str
) -> None:
    """The partition key's field holding the wrong type is refused as any field is (an
    EncodeError naming it), not as a key the partitioner refuses, by every producer
    and every send; a key function's refused result is an EncodeError too."""
    app, orders = shop(redis_url)
    keyed = app.stream("keyed", record=Line, partition_by=amount_key)
    mistyped = Line(order=7, customer=customer, amount=1.5, tags=["a"])  # type: ignore[arg-type]
    expected = f"orders: Line.customer: expected str, got {given}"
    key_refused = "keyed: partition key (partition_by=amount_key): float keys such as 0.0"

    def send_blocking() -> list[str]:
        with app.blocking() as client:
            errors = []
            sends: list[Callable[[], object]] = [
                lambda: client.send(orders, mistyped),
                lambda: client.send_many(orders, [RECORDS[0], mistyped]),
                lambda: client.send(keyed, RECORDS[0]),
            ]
            for send in sends:
                with pytest.raises(EncodeError) as caught:
                    send()
                errors.append(str(caught.value))
            return errors

    async def send_asyncio() -> list[str]:
        async with app.asyncio() as client:
            errors = []
            sends: list[Callable[[], Awaitable[object]]] = [
                lambda: client.send(orders, mistyped),
                lambda: client.send_many(orders, [RECORDS[0], mistyped]),
                lambda: client.send(keyed, RECORDS[0]),
            ]
            for send in sends:
                with pytest.raises(EncodeError) as caught:
                    await send()
                errors.append(str(caught.value))
            return errors

    from_trio = []
    trio_sends: list[Callable[[], Awaitable[object]]] = [
        lambda: orders.send(mistyped),
        lambda: orders.send_many([RECORDS[0], mistyped]),
        lambda: keyed.send(RECORDS[0]),
    ]
    async with app:
        for send in trio_sends:
            with pytest.raises(EncodeError) as caught:
                await send()
            from_trio.append(str(caught.value))
    for errors in (await blocking(send_blocking), await in_asyncio(send_asyncio), from_trio):
        assert errors[:2] == [expected, expected]
        assert errors[2].startswith(key_refused), errors[2]
    assert await entries_of(redis, orders) == [[], [], [], []]
    assert await redis.keys("__strm:*") == set()


async def test_errors_are_one_clear_line(redis_url: str, private_redis: RedisServer) -> None:
    with pytest.raises(ConfigError, match="is not a URL; write redis://"):
        App("shop", redis_url="localhost:6379").blocking()
    app, orders = shop(redis_url)

    # Unreachable: nothing listens there any more.
    url = private_redis.url
    private_redis.stop()
    gone, gone_orders = shop(url)
    with pytest.raises(RedisUnavailable) as caught:
        await blocking(lambda: gone.blocking(socket_timeout=1).send(gone_orders, RECORDS[0]))
    assert "\n" not in str(caught.value)
    assert "connecting to" in str(caught.value)
    assert not isinstance(caught.value, OutcomeUnknown)  # surely not sent

    # Passwords: missing or wrong, worded as the Trio side words them.
    with RedisServer() as guarded:
        async with open_redis(guarded.url) as admin:
            await admin.config_set({"requirepass": "s3cret"})
        for url in (guarded.url, guarded.url.replace("redis://", "redis://:wrong@")):
            locked = App("shop", redis_url=url, connect_give_up_after=0)
            locked_orders = locked.stream("orders", record=Line, partition_by="customer")
            with pytest.raises(ConfigError) as trio_side:
                async with locked:
                    pass

            def send_locked() -> None:
                with locked.blocking() as client:  # noqa: B023 (called at once)
                    client.send(locked_orders, RECORDS[0])  # noqa: B023

            with pytest.raises(ConfigError) as from_blocking:
                await blocking(send_locked)
            assert str(from_blocking.value).split(" (")[0] == str(trio_side.value).split(" (")[0]
            assert "wrong" not in str(from_blocking.value)

    # A record the codec cannot encode: nothing sent.
    def send_bad() -> None:
        with app.blocking() as client:
            client.send(orders, Line(order=1, customer="c", amount=1.0, tags=[object()]))  # type: ignore[list-item]

    with pytest.raises(EncodeError):
        await blocking(send_bad)

    # A closed client says so.
    client = app.blocking()
    client.close()
    with pytest.raises(StreamkitError, match="closed"):
        client.send(orders, RECORDS[0])
    closed = app.asyncio()

    async def use_closed() -> None:
        await closed.aclose()
        await closed.send(orders, RECORDS[0])

    with pytest.raises(StreamkitError, match="closed"):
        await in_asyncio(use_closed)
    assert isinstance(closed, AsyncioClient)


async def test_a_client_used_after_fork_connects_anew_in_the_child(
    redis_url: str, redis: Redis
) -> None:
    """gunicorn's preloaded app: a client opened in the parent, used by a forked child
    and by the parent at the same time (tests/clients_fork.py, run as a process)."""
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, str(Path(__file__).parent / "clients_fork.py"), redis_url],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    parent, child = report["parent"], report["child"]
    assert "error" not in child, child
    assert report["status"] == 0
    # The child made its own connection; the parent kept its own throughout.
    assert child["connection"] != parent["before"]
    assert parent["connection"] == parent["before"] == parent["after"]
    # Every send and enqueue of both landed, once; no job id was made twice.
    sent = 0
    for key in ["__strm:{forked.ticks.0}", "__strm:{forked.ticks.1}"]:
        sent += await redis.xlen(key)
    assert sent == 2 + 2 * 200 + 2 * 200 + 1
    assert child["asyncio"] == parent["asyncio"] == 200
    assert len(set(parent["jobs"]) | set(child["jobs"])) == 100
    assert await redis.xlen("__jobs:{forked.0}:q1") == 100
