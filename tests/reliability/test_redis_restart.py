"""Scenario 3: Redis killed and restarted (AOF on) while workers process."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from streamkit import open_redis
from tests.apps.scenario import make_app
from tests.reliability.harness import ScenarioReport, SeenMonitor, record_report
from tests.reliability.test_kill import KEYS
from tests.scenarios import numbered_events, seen, tally
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

DOWN = 2.0  # longer than lease_ttl (1.5 s): every lease lapses while Redis is away
# Delivered and unacknowledged entries at any moment: partitions x prefetch x batch.
IN_FLIGHT = 8 * 2 * 20
ENV = {
    "SCENARIO_DELAY": "0.1",
    "SCENARIO_BATCH": "20",
    "STREAMKIT_BATCH_SIZE": "20",
}


@pytest.mark.timeout(90)
async def test_redis_restart_with_aof_loses_nothing(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    began = trio.current_time()
    url = private_redis.url
    app, stream = make_app(redis_url=url)
    backlog = numbered_events(KEYS, 250)
    after = numbered_events(KEYS, 50, start=250)
    async with open_redis(url) as redis:
        async with app:
            await stream.send_many(backlog)
        monitor = SeenMonitor.for_stream(redis, stream, KEYS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor.run)
            workers.extend(start_worker(url, tmp_path, env=ENV) for _ in range(2))
            await wait_members(redis, 2)
            await monitor.wait_observed(lambda: len(monitor.distinct) >= len(backlog) // 5)

            private_redis.stop()  # SIGKILL: only what the AOF holds survives
            await trio.sleep(DOWN)  # the injected fault's duration
            await trio.to_thread.run_sync(private_redis.start)
            restarted_at = trio.current_time()
            processed_before = len(monitor.distinct)
            assert processed_before < len(backlog), "the backlog drained before the restart"
            recovery = await monitor.wait_resumed(monitor.partitions(), restarted_at, within=30)

            async with app:  # new events after the restart flow too
                await stream.send_many(after)
            await monitor.wait_processed(backlog + after)
            nursery.cancel_scope.cancel()

        result = tally(backlog + after, await seen(redis))
    report = ScenarioReport.from_tally(
        result,
        scenario="redis-restart",
        title="Redis killed and restarted (AOF, appendfsync always) mid-processing",
        injected=(
            f"SIGKILL of redis-server while 2 workers processed a backlog of "
            f"{len(backlog)} events, restarted on the same port {DOWN:.0f}s later "
            f"(longer than the lease TTL); {len(after)} more events sent after it came back"
        ),
        duplicate_bound=IN_FLIGHT,
        recovery_seconds=recovery,
        recovery="from the restart of redis-server until every partition was processed again",
        duration_seconds=trio.current_time() - began,
        notes=(
            f"{processed_before} of the backlog's events were processed before the "
            f"restart; duplicates can only be events processed and not yet acknowledged "
            f"when the server died: at most partitions x prefetch x batch_size = {IN_FLIGHT}"
        ),
    )
    record_report(report)
    assert result.lost == 0
    assert result.order_violations == 0
    assert result.duplicated <= IN_FLIGHT
    for worker in workers:
        assert worker.process.poll() is None, worker.log()
        assert "Traceback" not in worker.log(), worker.log()
