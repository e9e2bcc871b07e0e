"""Scenario 8: a backlog far larger than the trimming threshold."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from tests.apps.scenario import make_app
from tests.reliability.harness import Producer, ScenarioReport, SeenMonitor, record_report
from tests.scenarios import numbered_events, seen, tally
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

KEYS = 32
KEEP = 100  # partition_size: entries kept per partition once processed
ENV = {"SCENARIO_DELAY": "0.05", "SCENARIO_BATCH": "20", "STREAMKIT_BATCH_SIZE": "20"}


@pytest.mark.timeout(60)
async def test_backlog_beyond_the_trimming_threshold_is_never_trimmed(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    began = trio.current_time()
    app, stream = make_app(redis_url=redis_url, partition_size=KEEP)
    backlog = numbered_events(KEYS, 300)
    async with app, trio.open_nursery() as nursery:
        await stream.send_many(backlog)
        longest = max([await redis.xlen(key) for key in stream.partition_keys()])
        assert longest > 10 * KEEP
        monitor = SeenMonitor.for_stream(redis, stream, KEYS)
        nursery.start_soon(monitor.run)
        # Sending goes on (and trims, each time) while one slow worker works through
        # the backlog.
        producer = Producer(stream, keys=KEYS, interval=0.05, next_seq=300)
        nursery.start_soon(producer.run)
        workers.append(start_worker(redis_url, tmp_path, env=ENV))
        await wait_members(redis, 1)
        await monitor.wait_processed(backlog, within=40)
        await producer.stop()
        sent = backlog + producer.sent
        await monitor.wait_processed(sent, within=20)
        # Once everything is acknowledged, the next send trims down to about KEEP.
        await stream.send_many(numbered_events(KEYS, 1, start=10_000))
        lengths = [await redis.xlen(key) for key in stream.partition_keys()]
        nursery.cancel_scope.cancel()

    result = tally(sent, await seen(redis))
    report = ScenarioReport.from_tally(
        result,
        scenario="trimming",
        title="A backlog far beyond the trimming threshold",
        injected=(
            f"partition_size={KEEP} (the trimming threshold); a backlog of {len(backlog)} "
            f"events (up to {longest} per partition, {longest // KEEP}x the threshold) "
            f"sent before any worker ran, and {len(producer.sent)} more sent, each send "
            f"trimming, while one slow worker worked through it"
        ),
        duplicate_bound=0,
        recovery_seconds=None,
        recovery="not applicable",
        duration_seconds=trio.current_time() - began,
        notes=(
            f"no unprocessed event was trimmed; once everything was acknowledged the next "
            f"send trimmed the partitions to {min(lengths)}-{max(lengths)} entries "
            f"(approximate trimming, in whole stream nodes)"
        ),
    )
    record_report(report)
    assert (result.lost, result.duplicated, result.order_violations) == (0, 0, 0)
    # The threshold was in force: processed entries were trimmed away.
    assert max(lengths) < longest
