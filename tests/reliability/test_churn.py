"""Scenario 5: a churn soak, workers joining and leaving every few seconds: a minute
of it in ``nox -s reliability`` (``STREAMKIT_CHURN_SOAK=60``), 24 s (two rounds of every
change) in the suite."""

from __future__ import annotations

import itertools
import os
import signal
from typing import TYPE_CHECKING

import pytest
import trio

from tests.apps.scenario import make_app
from tests.reliability.harness import (
    Producer,
    ScenarioReport,
    SeenMonitor,
    inflight_of,
    record_report,
    worker_id,
)
from tests.reliability.test_kill import ENV, KEYS, PARTITIONS
from tests.scenarios import seen, tally
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

SOAK = float(os.environ.get("STREAMKIT_CHURN_SOAK", "24"))  # seconds of churn
TICK = 3.0  # one join or leave every TICK seconds
INTERVAL = 0.075  # KEYS events every INTERVAL: about 430 events/s, 25k in the minute
# Joins and leaves in turn; every other leave is a kill -9, the others SIGTERM.
ACTIONS = ("join", "join", "sigterm", "kill")


@pytest.mark.timeout(150)
async def test_churn_soak(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    began = trio.current_time()
    app, stream = make_app(redis_url=redis_url)
    alive: list[WorkerProcess] = []
    left: list[WorkerProcess] = []
    killed: list[tuple[WorkerProcess, float, dict[int, int]]] = []
    counts = {"join": 0, "sigterm": 0, "kill": 0}
    async with app, trio.open_nursery() as nursery:
        monitor = SeenMonitor.for_stream(redis, stream, KEYS)
        nursery.start_soon(monitor.run)
        alive.extend(start_worker(redis_url, tmp_path, env=ENV) for _ in range(2))
        workers.extend(alive)
        await wait_members(redis, 2)
        producer = Producer(stream, keys=KEYS, interval=INTERVAL)
        nursery.start_soon(producer.run)

        soak_start = trio.current_time()
        for tick, action in enumerate(itertools.cycle(ACTIONS), start=1):
            # The churn's schedule is the injected fault: one change every TICK seconds.
            await trio.sleep_until(soak_start + tick * TICK)
            if trio.current_time() - soak_start >= SOAK:
                break
            counts[action] += 1
            if action == "join":
                worker = start_worker(redis_url, tmp_path, env=ENV)
                alive.append(worker)
                workers.append(worker)
                continue
            victim = alive.pop(0)  # the oldest: it holds partitions
            if action == "sigterm":
                victim.send_signal(signal.SIGTERM)
                left.append(victim)
            else:
                victim.kill()
                at = trio.current_time()
                killed.append((victim, at, await inflight_of(redis, victim.pid, PARTITIONS)))
        soak_end = trio.current_time()
        await producer.stop()
        drained_at = await monitor.wait_processed(producer.sent, within=60)
        recoveries = [
            await monitor.wait_resumed(inflight, at, excluding=worker_id(victim))
            for victim, at, inflight in killed
            if inflight
        ]
        nursery.cancel_scope.cancel()

    exit_codes = [await w.wait_exit(within=10) for w in left]
    result = tally(producer.sent, await seen(redis))
    inflight_total = sum(sum(inflight.values()) for _, _, inflight in killed)
    gaps = monitor.progress_gaps(after=soak_start)
    report = ScenarioReport.from_tally(
        result,
        scenario="churn",
        title="Churn soak: workers joining and leaving every few seconds for a minute",
        injected=(
            f"for {SOAK:.0f}s, every {TICK:.0f}s one change in turn: a worker joins, "
            f"another joins, the oldest leaves (SIGTERM), the oldest is killed (-9): "
            f"{counts['join']} joins, {counts['sigterm']} graceful leaves, "
            f"{counts['kill']} kills, 2 to 4 workers at a time; events sent throughout "
            f"(~{KEYS / INTERVAL:.0f}/s)"
        ),
        duplicate_bound=inflight_total,
        recovery_seconds=max(recoveries) if recoveries else None,
        recovery=(
            "from a kill until every partition the killed worker held was processed "
            "again by another worker (worst of the kills)"
        ),
        duration_seconds=trio.current_time() - began,
        notes=(
            f"backlog drained {drained_at - soak_end:.2f}s after the churn ended; longest "
            f"time any partition went without progress during the soak: "
            f"{max(gaps.values()):.2f}s; graceful leaves exited with {sorted(set(exit_codes))}"
        ),
    )
    record_report(report)
    assert result.sent >= 20_000
    assert result.lost == 0
    assert result.order_violations == 0
    assert result.duplicated <= inflight_total
    assert exit_codes == [0] * len(left)
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()
