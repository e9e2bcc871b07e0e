"""A rebuild of state from the start (``streamkit reset --to start --state clear``) is
exact even when a worker is killed -9 in the middle of the replay, on a server and on a
cluster; ``--state keep`` processes the events again on purpose (counts double)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit.testing import wait_until
from tests.apps.stateful import GRACE, WINDOW, Number, make_app
from tests.reliability.test_state_faults import (
    APP,
    ENV,
    GROUP,
    KEYS,
    LEASE_TTL,
    Sent,
    assert_exact,
    read_echoes,
)
from tests.test_cli import streamkit
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

EVENTS = 3000


async def stop_all(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        if worker.process.poll() is None:
            worker.send_signal(15)  # SIGTERM: a clean stop
    for worker in workers:
        await worker.wait_exit(within=20)


@pytest.mark.timeout(180)
@pytest.mark.cluster
async def test_a_rebuild_killed_midway_is_still_exact(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    stateful = make_app(redis_url=redis_url)
    numbers = [Number(key=f"k{n % KEYS}", n=n) for n in range(EVENTS)]
    sent = Sent()
    sent.add(numbers)
    async with stateful.app:
        await stateful.numbers.send_many(numbers)
    workers.extend(start_worker(redis_url, tmp_path, app=APP, env=ENV) for _ in range(2))
    await assert_exact(redis, sent, stateful)
    await stop_all(workers)

    # A plain replay from the start would double every count: refused, nothing changed.
    refused = await streamkit("reset", APP, "count", "--to", "start", "-y", redis_url=redis_url)
    assert refused.code == 2, refused  # a usage error
    assert "--state clear" in refused.err
    assert "nothing was reset" in refused.err
    assert len(refused.err.strip().splitlines()) == 1, refused.err

    done = await streamkit(
        "reset", APP, "count", "--to", "start", "--state", "clear", "-y", redis_url=redis_url
    )
    assert done.code == 0, done.err
    assert "its state cleared" in done.out
    async with stateful.app:
        assert sum(await stateful.counts.read_many([f"k{k}" for k in range(KEYS)])) == 0

    # Replay with a kill -9 of one worker in the middle.
    first = start_worker(redis_url, tmp_path, app=APP, env=ENV)
    second = start_worker(redis_url, tmp_path, app=APP, env=ENV)
    workers.extend([first, second])
    await wait_members(redis, 2, group=GROUP)

    async def halfway() -> bool:
        async with stateful.app:
            counted = sum(await stateful.counts.read_many([f"k{k}" for k in range(KEYS)]))
        return counted > EVENTS // 4

    await wait_until(halfway, what="a quarter of the replay committed", within=60)
    first.kill()
    workers.append(start_worker(redis_url, tmp_path, app=APP, env=ENV))

    # Tables and windows equal the fold of the events, exactly (not doubled).
    async def tables_rebuilt() -> bool:
        async with stateful.app:
            counted = sum(await stateful.counts.read_many([f"k{k}" for k in range(KEYS)]))
        return counted == EVENTS

    await wait_until(tables_rebuilt, what="the rebuilt counts", within=90, interval=0.2)
    async with stateful.app:
        keys = [f"k{k}" for k in range(KEYS)]
        counts = dict(zip(keys, await stateful.counts.read_many(keys), strict=True))
        sums = dict(zip(keys, await stateful.sums.read_many(keys), strict=True))
    assert counts == {k: len(ns) for k, ns in sent.by_key.items()}
    assert sums == {k: sum(ns) for k, ns in sent.by_key.items()}

    # What it emits during the replay is emitted again: each echo twice, in order.
    async def echoed_twice() -> bool:
        return len(await read_echoes(redis, stateful.echoes)) >= 2 * EVENTS

    await wait_until(echoed_twice, what="every echo emitted again", within=60, interval=0.2)
    echoed: dict[str, list[int]] = defaultdict(list)
    for echo in await read_echoes(redis, stateful.echoes):
        echoed[echo.key].append(echo.n)
    assert dict(echoed) == {k: ns + ns for k, ns in sent.by_key.items()}
    # The windows were rebuilt too: each closed window's result, emitted once by each
    # run, has the sum of its events both times.
    expected: dict[tuple[str, int], int] = defaultdict(int)
    for key, ns in sent.by_key.items():
        for n in ns:
            expected[key, n - n % WINDOW] += n
    results: dict[tuple[str, int], list[int]] = defaultdict(list)

    async def read_results() -> bool:
        results.clear()
        for partition in range(stateful.tens_out.partition_count):
            for entry in await redis.xrange(stateful.tens_out.key(partition)):
                fields: Any = entry.field_values
                result = stateful.tens_out.codec.decode(fields, stream="tens_out")
                start = round(datetime.fromisoformat(result["start"]).timestamp() * 1000)
                results[result["key"], start].append(result["value"])
        return bool(results) and all(len(v) >= 2 for v in results.values())

    # On a cluster the results reach their stream through the outbox relay: wait.
    await wait_until(read_results, what="every window's result emitted again", within=60)
    assert {w: v for w, v in results.items() if v != [expected[w]] * 2} == {}
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()


@pytest.mark.timeout(120)
async def test_state_keep_processes_the_events_again_against_the_state(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    stateful = make_app(redis_url=redis_url)
    numbers = [Number(key=f"k{n % KEYS}", n=n) for n in range(500)]
    sent = Sent()
    sent.add(numbers)
    async with stateful.app:
        await stateful.numbers.send_many(numbers)
    workers.append(start_worker(redis_url, tmp_path, app=APP, env=ENV))
    await assert_exact(redis, sent, stateful, min_closed=0)
    await stop_all(workers)
    done = await streamkit(
        "reset", APP, "count", "--to", "start", "--state", "keep", "-y", redis_url=redis_url
    )
    assert done.code == 0, done.err
    workers.append(start_worker(redis_url, tmp_path, app=APP, env=ENV))
    keys = [f"k{k}" for k in range(KEYS)]

    async def doubled() -> bool:
        async with stateful.app:
            return sum(await stateful.counts.read_many(keys)) == 2 * len(numbers)

    await wait_until(doubled, what="every count doubled, as asked", within=60, interval=0.2)


@pytest.mark.timeout(120)
@pytest.mark.cluster
async def test_a_forced_rebuild_under_running_workers_is_exact(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """``--force`` while two workers are in the middle of the stream: the reset takes
    their leases in its own step, so nothing they had in flight commits and their cached
    values and watermarks never meet the replay; they start the partitions again from
    the start, at once (no new event needed), and every value ends exact."""
    stateful = make_app(redis_url=redis_url)
    numbers = [Number(key=f"k{n % KEYS}", n=n) for n in range(EVENTS)]
    sent = Sent()
    sent.add(numbers)
    async with stateful.app:
        await stateful.numbers.send_many(numbers)
    slow = {**ENV, "STATEFUL_DELAY": "0.05", "STATEFUL_BATCH": "5"}
    workers.extend(start_worker(redis_url, tmp_path, app=APP, env=slow) for _ in range(2))
    keys = [f"k{k}" for k in range(KEYS)]

    async def counted() -> int:
        async with stateful.app:
            return sum(await stateful.counts.read_many(keys))

    async def a_quarter() -> bool:
        return await counted() > EVENTS // 4

    await wait_until(a_quarter, what="a quarter of the events counted", within=60)
    assert await counted() < EVENTS  # the workers are in the middle of the stream
    refused = await streamkit(
        "reset", APP, "count", "--to", "start", "--state", "clear", "-y", redis_url=redis_url
    )
    assert refused.code == 1, refused
    assert "worker(s) run count" in refused.err
    done = await streamkit(
        "reset", APP, "count", "--to", "start", "--state", "clear", "-y", "--force",
        redis_url=redis_url,
    )  # fmt: skip
    assert done.code == 0, done.err
    assert "its state cleared" in done.out
    assert "took the leases of 8 partition(s)" in done.out, done.out

    # No event is sent from here on: the replay starts by itself, and ends exact.
    async def all_counted() -> bool:
        return await counted() >= EVENTS

    await wait_until(all_counted, what="the rebuilt counts", within=60, interval=0.2)
    await trio.sleep(LEASE_TTL)  # what a stale commit landing late would need
    async with stateful.app:
        counts = dict(zip(keys, await stateful.counts.read_many(keys), strict=True))
        sums = dict(zip(keys, await stateful.sums.read_many(keys), strict=True))
    assert counts == {k: len(ns) for k, ns in sent.by_key.items()}
    assert sums == {k: sum(ns) for k, ns in sent.by_key.items()}

    # The windows: none of the replayed events late (a running worker's watermark would
    # have made them so), every result emitted with the sum of its events (those the
    # workers emitted before the reset too: a closed window is final), the windows
    # still open exact, and no window's values left without its index entry.
    expected: dict[tuple[str, int], int] = defaultdict(int)
    for key, ns in sent.by_key.items():
        for n in ns:
            expected[key, n - n % WINDOW] += n
    must_close = {w for w in expected if w[1] + WINDOW + GRACE <= EVENTS - 1000}
    results: dict[tuple[str, int], list[int]] = defaultdict(list)

    async def read_results() -> bool:
        results.clear()
        for partition in range(stateful.tens_out.partition_count):
            for entry in await redis.xrange(stateful.tens_out.key(partition)):
                fields: Any = entry.field_values
                result = stateful.tens_out.codec.decode(fields, stream="tens_out")
                start = round(datetime.fromisoformat(result["start"]).timestamp() * 1000)
                results[result["key"], start].append(result["value"])
        return must_close <= set(results)

    await wait_until(read_results, what="every closed window's result", within=60)
    assert {w: v for w, v in results.items() if set(v) != {expected[w]}} == {}
    async with stateful.app:
        for key in keys:
            for window, value in await stateful.tens.read(key):
                start = round(window.start.timestamp() * 1000)
                assert value == expected[key, start], (key, window)
    for partition in range(stateful.numbers.partition_count):
        state = f"__stat:{{stateful.numbers.{partition}}}.count"
        assert await redis.hget(state, "late:tens") in (None, b"0"), partition
        index = f"__wins:{{stateful.numbers.{partition}}}.tens"
        starts = {m.decode().split(":")[0] for m in await redis.zrange(index, 0, -1)}
        for prefix in ("__wval", "__wcls"):
            pattern = f"{prefix}:{{stateful.numbers.{partition}}}.tens:*"
            async for found in redis.scan_iter(pattern):
                name = found.decode() if isinstance(found, bytes) else str(found)
                assert name.rpartition(":")[2] in starts, f"{name} has no index entry"
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()
        assert "held by 'streamkit reset'" in worker.log()  # the lease lost says by whom
