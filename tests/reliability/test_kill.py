"""Scenario 1: ``kill -9`` of a worker in the middle of processing, repeatedly."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from streamkit.testing import wait_until
from tests.apps.scenario import make_app
from tests.reliability.harness import (
    Producer,
    ScenarioReport,
    SeenMonitor,
    inflight_of,
    lock_holders,
    record_report,
    worker_id,
)
from tests.scenarios import seen, tally
from tests.workers import FAST_ENV, start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

KEYS = 32
KILLS = 3
BATCH = 20
PREFETCH = 2
PARTITIONS = 8
ENV = {
    "SCENARIO_DELAY": "0.01",
    "SCENARIO_BATCH": str(BATCH),
    "STREAMKIT_BATCH_SIZE": str(BATCH),
    "STREAMKIT_PREFETCH": str(PREFETCH),
}


async def wait_working(monitor: SeenMonitor, redis: Redis, worker: WorkerProcess) -> None:
    """Wait until ``worker`` holds a partition and has processed events of it."""
    me = worker_id(worker)

    async def working() -> bool:
        holders = await lock_holders(redis, PARTITIONS)
        mine = {p for p, pid in holders.items() if pid == worker.pid}
        return bool(mine) and any(
            o.worker == me and monitor.partition_of[o.key] in mine
            for o in monitor.observations[-500:]
        )

    await wait_until(
        working, what=f"worker {worker.pid} processing a partition it holds", within=30
    )


@pytest.mark.timeout(90)
@pytest.mark.cluster
async def test_kill_9_repeatedly_while_two_others_run(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    began = trio.current_time()
    app, stream = make_app(redis_url=redis_url)
    async with app, trio.open_nursery() as nursery:
        monitor = SeenMonitor.for_stream(redis, stream, KEYS)
        assert monitor.partitions() == frozenset(range(PARTITIONS))
        nursery.start_soon(monitor.run)
        producer = Producer(stream, keys=KEYS, interval=0.04)
        nursery.start_soon(producer.run)

        workers.extend(start_worker(redis_url, tmp_path, env=ENV) for _ in range(3))
        await wait_members(redis, 3)

        inflight_total = 0
        recoveries: list[float] = []
        for _ in range(KILLS):
            victim = workers[-1]
            await wait_working(monitor, redis, victim)
            victim.kill()
            killed_at = trio.current_time()
            inflight = await inflight_of(redis, victim.pid, PARTITIONS)
            assert inflight, "the victim held no partition when it was killed"
            inflight_total += sum(inflight.values())
            recoveries.append(
                await monitor.wait_resumed(inflight, killed_at, excluding=worker_id(victim))
            )
            assert await victim.wait_exit() == -9
            # A replacement joins; it becomes the next victim.
            workers.append(start_worker(redis_url, tmp_path, env=ENV))
            await wait_members(redis, 3)

        await producer.stop()
        await monitor.wait_processed(producer.sent)
        nursery.cancel_scope.cancel()

    result = tally(producer.sent, await seen(redis))
    # What a killed worker had delivered and not acknowledged (its partitions'
    # pending entries at the kill) is all it can make the next owner repeat; never
    # more than partitions x prefetch x batch_size per kill.
    assert inflight_total <= KILLS * PARTITIONS * PREFETCH * BATCH
    report = ScenarioReport.from_tally(
        result,
        scenario="kill-9",
        title="kill -9 of a worker mid-processing, 3 times, two others running",
        injected=(
            f"SIGKILL of the newest of 3 workers while it processed, {KILLS} times, a "
            f"replacement started after each; events sent throughout "
            f"({KEYS} keys, ~{KEYS / 0.04:.0f} events/s)"
        ),
        duplicate_bound=inflight_total,
        recovery_seconds=max(recoveries),
        recovery=(
            "from the kill until every partition the killed worker held was processed "
            "again by another worker (worst of the kills; lease_ttl and session_timeout "
            f"are {FAST_ENV['STREAMKIT_LEASE_TTL']}s)"
        ),
        duration_seconds=trio.current_time() - began,
        notes=(
            f"recovery per kill: {', '.join(f'{r:.2f}s' for r in recoveries)}; "
            f"duplicates bounded by the {inflight_total} entries the killed workers had "
            f"delivered and not acknowledged"
        ),
    )
    record_report(report)
    assert result.lost == 0
    assert result.order_violations == 0
    assert result.duplicated <= inflight_total
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()
