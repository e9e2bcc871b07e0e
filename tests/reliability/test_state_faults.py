"""State under faults: counts, sums and outputs equal what was sent, not "at least".

Real ``streamkit worker`` processes run ``tests.apps.stateful:app`` (two tables and an
output stream, all committed with the acknowledgements) while a producer sends and
faults are injected: kill -9 in the middle of processing (and so of commits), a worker
frozen past its lease and woken again (a zombie whose commits must change nothing),
workers joining and leaving, Redis killed and restarted with ``appendfsync always``.
Afterwards every key's count and sum, and the output stream, are compared with what
was sent: equal, each result exactly once, in send order per key.
"""

from __future__ import annotations

import contextlib
import signal
from collections import defaultdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import ProcessorKeys, open_redis, partition_for
from streamkit._keys import state_key
from streamkit.lowlevel import redis_errors
from streamkit.testing import wait_until
from tests.apps.stateful import GRACE, WINDOW, Echo, Number, Stateful, make_app
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis, Stream
    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

APP = "tests.apps.stateful:app"
GROUP = ProcessorKeys(app="stateful", stream="numbers", processor="count").group
KEYS = 32
BATCH = 20
INTERVAL = 0.02  # BATCH events every INTERVAL: about 1,000 events/s
ENV = {"STREAMKIT_BATCH_SIZE": "20", "STREAMKIT_PREFETCH": "2", "STATEFUL_DELAY": "0.005"}
LEASE_TTL = 1.5  # tests.workers.FAST_ENV


class Sent:
    """What the producer sent, per key in order."""

    def __init__(self) -> None:
        self.by_key: dict[str, list[int]] = defaultdict(list)
        self.total = 0

    def add(self, numbers: list[Number]) -> None:
        for number in numbers:
            self.by_key[number.key].append(number.n)
        self.total += len(numbers)


async def produce(numbers: Stream[Number], sent: Sent, stop: trio.Event, start: int = 0) -> None:
    n = start
    while not stop.is_set():
        batch = [Number(key=f"k{(n + i) % KEYS}", n=n + i) for i in range(BATCH)]
        with contextlib.suppress(Exception):
            # A send refused while Redis restarts is not sent: not counted either.
            await numbers.send_many(batch)
            sent.add(batch)
        n += BATCH
        await trio.sleep(INTERVAL)


async def read_echoes(redis: Redis, echoes: Stream[Echo]) -> list[Echo]:
    out: list[Echo] = []
    for partition in range(echoes.partition_count):
        with redis_errors():
            entries: Any = await redis.xrange(echoes.key(partition))
        out.extend(echoes.codec.decode(e.field_values, stream=echoes.name) for e in entries)
    return out


async def assert_exact(redis: Redis, sent: Sent, app: Stateful, *, min_closed: int = KEYS) -> None:
    echoes, counts, sums = app.echoes, app.counts, app.sums
    expected_counts = {k: len(ns) for k, ns in sent.by_key.items()}

    async def all_counted() -> bool:
        with redis_errors():
            return sum(await counts.read_many(list(expected_counts), redis=redis)) == sent.total

    with contextlib.suppress(trio.TooSlowError):
        await wait_until(all_counted, what="every event counted", within=60, interval=0.1)
    got_counts = dict(
        zip(
            expected_counts, await counts.read_many(list(expected_counts), redis=redis), strict=True
        )
    )
    assert got_counts == expected_counts
    got_sums = dict(
        zip(expected_counts, await sums.read_many(list(expected_counts), redis=redis), strict=True)
    )
    assert got_sums == {k: sum(ns) for k, ns in sent.by_key.items()}

    async def all_echoed() -> bool:
        return len(await read_echoes(redis, echoes)) >= sent.total

    with contextlib.suppress(trio.TooSlowError):
        await wait_until(all_echoed, what="every echo relayed", within=30, interval=0.1)
    echoed: dict[str, list[int]] = defaultdict(list)
    for echo in await read_echoes(redis, echoes):
        echoed[echo.key].append(echo.n)
    # Each event's echo exactly once, in send order per key.
    assert dict(echoed) == dict(sent.by_key)
    await assert_windows_exact(redis, sent, app, min_closed)


async def describe_windows(redis: Redis, app: Stateful, windows: list[tuple[str, int]]) -> str:
    """What Redis holds of the windows ``(key, start)`` of ``tens`` (a missing result's
    diagnosis): the partition's watermark and late count, the window's index entry and
    hashes."""
    lines = [f"windows without a result: {windows}"]
    tens = app.tens
    for key, start in windows:
        partition = partition_for(key, app.numbers.partition_count)
        state = state_key("stateful", "numbers", "count", partition)
        with redis_errors():
            index: Any = await redis.zrange(tens.windows_key(partition), 0, -1, withscores=True)
            fields: Any = await redis.hgetall(state)
            values: Any = await redis.hgetall(tens.values_key(partition, start))
            closed: Any = await redis.hgetall(tens.closed_key(partition, start))
        lines.append(
            f"{key}@{start} (partition {partition}): state {fields}, index {index[:8]}, "
            f"open {values}, closed {closed}"
        )
    return "\n".join(lines)


async def assert_windows_exact(redis: Redis, sent: Sent, app: Stateful, min_closed: int) -> None:
    """Each closed window's result once, with the sum of its events; every window the
    last events closed is among them."""
    expected: dict[tuple[str, int], int] = defaultdict(int)
    for key, ns in sent.by_key.items():
        for n in ns:
            expected[key, n - n % WINDOW] += n
    last = max(n for ns in sent.by_key.values() for n in ns)
    must_close = {w for w in expected if w[1] + WINDOW + GRACE <= last - 1000}
    assert len(must_close) >= min_closed
    got: dict[tuple[str, int], list[int]] = defaultdict(list)

    async def read() -> None:
        got.clear()
        for partition in range(app.tens_out.partition_count):
            with redis_errors():
                entries: Any = await redis.xrange(app.tens_out.key(partition))
            for e in entries:
                result = app.tens_out.codec.decode(e.field_values, stream="tens_out")
                start = datetime.fromisoformat(result["start"])
                got[result["key"], round(start.timestamp() * 1000)].append(result["value"])

    async def closed() -> bool:
        await read()
        return must_close <= set(got)

    with contextlib.suppress(trio.TooSlowError):
        await wait_until(closed, what="the closed windows emitted", within=30, interval=0.2)
    missing = sorted(must_close - set(got))
    assert not missing, await describe_windows(redis, app, missing[:3])
    assert {w: (vs, expected[w]) for w, vs in got.items() if vs != [expected[w]]} == {}


@pytest.mark.timeout(150)
@pytest.mark.cluster
async def test_exact_under_kills_a_zombie_and_churn(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    stateful = make_app(redis_url=redis_url)
    app, numbers = stateful.app, stateful.numbers
    sent = Sent()
    stop = trio.Event()

    def start() -> WorkerProcess:
        worker = start_worker(redis_url, tmp_path, app=APP, env=ENV)
        workers.append(worker)
        return worker

    async with app, trio.open_nursery() as nursery:
        first, second = start(), start()
        await wait_members(redis, 2, group=GROUP)
        nursery.start_soon(produce, numbers, sent, stop)
        await wait_until(lambda: sent.total > 500, what="500 events sent", within=30)
        # kill -9 while commits are in flight, twice.
        first.kill()
        third = start()
        await wait_until(lambda: sent.total > 1500, what="1,500 events sent", within=30)
        third.kill()
        fourth = start()
        await wait_members(redis, 2, group=GROUP)
        # A zombie: frozen past its lease, woken after its partitions moved on.
        second.send_signal(signal.SIGSTOP)
        await trio.sleep(LEASE_TTL * 3)  # the injected fault's duration
        second.send_signal(signal.SIGCONT)
        # Churn: one joins, one leaves gracefully.
        start()
        await wait_until(lambda: sent.total > 4000, what="4,000 events sent", within=60)
        fourth.send_signal(signal.SIGTERM)
        await wait_until(lambda: sent.total > 5000, what="5,000 events sent", within=60)
        stop.set()
    await assert_exact(redis, sent, stateful)
    assert await fourth.wait_exit(within=15) == 0
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()


@pytest.mark.timeout(120)
async def test_exact_across_a_redis_restart(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    url = private_redis.url
    stateful = make_app(redis_url=url)
    app, numbers = stateful.app, stateful.numbers
    sent = Sent()
    stop = trio.Event()
    async with open_redis(url) as redis:
        async with app, trio.open_nursery() as nursery:
            workers.extend(start_worker(url, tmp_path, app=APP, env=ENV) for _ in range(2))
            await wait_members(redis, 2, group=GROUP)
            nursery.start_soon(produce, numbers, sent, stop)
            await wait_until(lambda: sent.total > 1000, what="1,000 events sent", within=30)
            private_redis.stop()  # SIGKILL: only what the AOF holds survives
            await trio.sleep(LEASE_TTL + 0.5)  # the injected fault's duration
            await trio.to_thread.run_sync(private_redis.start)
            await wait_until(lambda: sent.total > 2500, what="2,500 events sent", within=60)
            stop.set()
        await assert_exact(redis, sent, stateful)
    for worker in workers:
        assert worker.process.poll() is None, worker.log()
        assert "Traceback" not in worker.log(), worker.log()
