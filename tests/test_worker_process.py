"""``streamkit worker`` as real subprocesses: signals, kills, bad paths, no Redis."""

from __future__ import annotations

import functools
import signal
from typing import TYPE_CHECKING

import pytest

from streamkit.testing import free_port, wait_until
from tests.apps.scenario import SEEN, TAKEN, Numbered, make_app
from tests.scenarios import numbered_events, seen, tally
from tests.workers import WorkerProcess, lock_holders, start_worker, wait_members

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from pathlib import Path

    from streamkit import Redis


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.close()


async def wait_seen(redis: Redis, count: int) -> None:
    async def enough() -> bool:
        return await redis.llen(SEEN) >= count

    await wait_until(enough, what=f"{count} processings in {SEEN}", within=60)


@pytest.mark.cluster
async def test_sigterm_finishes_acknowledges_and_leaves(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    app, stream = make_app(redis_url=redis_url)
    sent = numbered_events(keys=16, per_key=100)
    async with app:
        await stream.send_many(sent)
    worker = start_worker(redis_url, tmp_path, env={"SCENARIO_DELAY": "0.05"})
    workers.append(worker)
    await wait_seen(redis, 100)

    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log()
    log = worker.log()
    assert "stopping gracefully" in log
    assert "Traceback" not in log
    # Its leases are released and its place left. (Entries it had prefetched but not
    # processed stay pending: the next owner reads them first.)
    locks = await redis.keys("__lock:{scenario.numbered.*")
    assert {k for k in locks if not k.endswith(b":fence")} == set()
    await wait_members(redis, 0)

    # A new worker processes the rest: nothing lost, and nothing the first worker
    # processed is processed again (it was all acknowledged).
    workers.append(start_worker(redis_url, tmp_path))
    await wait_seen(redis, len(sent))
    result = tally(sent, await seen(redis))
    assert (result.lost, result.duplicated, result.order_violations) == (0, 0, 0)


async def test_a_second_signal_exits_at_once(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # Events of one key only: its partition takes a batch that lasts far longer than
    # the grace period, so only the second signal ends the worker; the others are idle.
    app, stream = make_app(redis_url=redis_url)
    async with app:
        await stream.send_many(numbered_events(keys=1, per_key=50))
    busy = stream.partition_of(Numbered(key="k0", seq=0))
    worker = start_worker(
        redis_url,
        tmp_path,
        env={
            "SCENARIO_DELAY": "60",
            "STREAMKIT_GRACE_PERIOD": "60",
            "SCENARIO_BATCH": "1",
            "SCENARIO_MARK_TAKEN": "1",
        },
    )
    workers.append(worker)
    everything = dict.fromkeys(range(8), worker.pid)
    only_busy = {p: worker.pid if p == busy else None for p in range(8)}

    async def holds(expected: Mapping[int, int | None]) -> bool:
        return await lock_holders(redis) == expected

    async def in_a_batch() -> bool:
        return await holds(everything) and await redis.llen(TAKEN) > 0

    await wait_until(in_a_batch, what="the worker holding every partition, one busy", within=30)
    worker.send_signal(signal.SIGINT)
    # Stopping gracefully: the idle partitions are handed back at once, the busy one
    # is kept while its batch runs.
    await wait_until(
        functools.partial(holds, only_busy),
        what=f"the worker holding partition {busy} only",
        within=30,
    )
    worker.send_signal(signal.SIGINT)
    # It exits at once, long before the 60 s grace period, through its own handler.
    assert await worker.wait_exit(within=10) == 128 + signal.SIGINT, worker.log()
    log = worker.log()
    assert "SIGINT: stopping gracefully (again: exit at once)" in log
    assert "SIGINT again: exiting at once" in log
    assert "Traceback" not in log
    assert await redis.llen(SEEN) == 0  # the batch never finished


@pytest.mark.cluster
async def test_killed_worker_partitions_are_taken_over(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    app, stream = make_app(redis_url=redis_url)
    sent = numbered_events(keys=16, per_key=60)
    async with app:
        await stream.send_many(sent)
    workers.extend(
        start_worker(redis_url, tmp_path, env={"SCENARIO_DELAY": "0.02"}) for _ in range(2)
    )
    await wait_members(redis, 2)
    await wait_seen(redis, 100)
    workers[0].kill()
    # Events in flight when the worker died are processed again: wait for every
    # distinct event, not for a count.

    async def nothing_lost() -> bool:
        return tally(sent, await seen(redis)).lost == 0

    await wait_until(nothing_lost, what="every event processed", within=60)
    result = tally(sent, await seen(redis))
    assert result.order_violations == 0
    await wait_members(redis, 1)  # the dead worker was reaped


async def test_wrong_app_path(redis_url: str, tmp_path: Path, workers: list[WorkerProcess]) -> None:
    worker = start_worker(redis_url, tmp_path, app="tests.apps.nowhere:app")
    workers.append(worker)
    assert await worker.wait_exit() == 2
    log = worker.log()
    assert "cannot import 'tests.apps.nowhere'" in log
    assert "Traceback" not in log


async def test_unknown_processor(
    redis_url: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(redis_url, tmp_path, args=("--processors", "record,nope"))
    workers.append(worker)
    assert await worker.wait_exit() == 2
    assert "unknown processor 'nope' (known: record)" in worker.log()


async def test_unreachable_redis_retries_then_exits(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}"
    worker = start_worker(nowhere, tmp_path, env={"STREAMKIT_CONNECT_GIVE_UP_AFTER": "1"})
    workers.append(worker)
    assert await worker.wait_exit() == 1
    log = worker.log()
    assert "retrying in" in log
    assert f"Redis at {nowhere} is unavailable" in log
    assert "Traceback" not in log
