"""Scenario 4: Redis unreachable when a worker starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from streamkit import open_redis
from streamkit.testing import free_port, wait_until
from tests.apps.scenario import make_app
from tests.reliability.harness import ScenarioReport, SeenMonitor, record_report
from tests.scenarios import numbered_events, seen, tally
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

KEYS = 32
GIVE_UP = 3.0
DOWN = 2.0


@pytest.mark.timeout(60)
async def test_worker_waits_for_redis_to_come_up(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    began = trio.current_time()
    private_redis.stop()
    worker = start_worker(
        private_redis.url, tmp_path, env={"STREAMKIT_CONNECT_GIVE_UP_AFTER": "30"}
    )
    workers.append(worker)
    # It keeps retrying while the server is down, saying so once (a refused connection
    # leaves no other trace): the log is the behaviour here.
    await wait_until(lambda: "retrying in" in worker.log(), what="the retry warning", within=20)
    await trio.sleep(DOWN)  # the injected fault's duration, counted from the first failure
    assert worker.process.poll() is None
    assert worker.log().count("retrying in") == 1

    await trio.to_thread.run_sync(private_redis.start)
    up_at = trio.current_time()
    app, stream = make_app(redis_url=private_redis.url)
    sent = numbered_events(KEYS, 10)
    async with open_redis(private_redis.url) as redis:
        async with app:
            await stream.send_many(sent)
        monitor = SeenMonitor.for_stream(redis, stream, KEYS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor.run)
            await wait_members(redis, 1)
            recovery = await monitor.wait_processed(sent, within=30) - up_at
            nursery.cancel_scope.cancel()
        result = tally(sent, await seen(redis))
    log = worker.log()
    report = ScenarioReport.from_tally(
        result,
        scenario="redis-down-at-start",
        title="Redis unreachable when a worker starts, then comes up",
        injected=(
            f"a worker started while redis-server was down (connection refused) and "
            f"kept retrying; the server was started {DOWN:.0f}s after its first failure"
        ),
        duplicate_bound=0,
        recovery_seconds=recovery,
        recovery="from the server's start until the worker had processed every event sent",
        duration_seconds=trio.current_time() - began,
        notes=(
            "the first failure is logged, then the outcome, not each attempt: "
            + " / ".join(
                line.split(": ", 1)[1]
                for line in log.splitlines()
                if "retrying in" in line or " back after " in line
            )
        ),
    )
    record_report(report)
    assert (result.lost, result.duplicated, result.order_violations) == (0, 0, 0)
    assert "Traceback" not in log


@pytest.mark.timeout(60)
async def test_worker_gives_up_after_the_configured_time(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}"
    started = trio.current_time()
    worker = start_worker(nowhere, tmp_path, env={"STREAMKIT_CONNECT_GIVE_UP_AFTER": str(GIVE_UP)})
    workers.append(worker)
    code = await worker.wait_exit(within=GIVE_UP + 20)
    elapsed = trio.current_time() - started
    log = worker.log()
    message = log.strip().splitlines()[-1]
    report = ScenarioReport(
        scenario="redis-never-up",
        title="Redis never comes up: the worker gives up",
        injected=(
            f"a worker started against a port nothing listens on, with "
            f"connect_give_up_after={GIVE_UP:.0f}s"
        ),
        sent=0,
        processed=0,
        lost=0,
        duplicated=0,
        duplicate_bound=0,
        order_violations=0,
        recovery_seconds=None,
        recovery="not applicable: the worker must exit, not recover",
        duration_seconds=elapsed,
        notes=(
            f"exited with code {code} after {elapsed:.1f}s (process start included), "
            f"{log.count('retrying in')} logged retry warning, last line: `{message}`"
        ),
    )
    record_report(report)
    assert code == 1
    assert f"Redis at {nowhere} is unavailable" in message
    assert log.count("retrying in") == 1
    assert "gave up after" in message
    assert "Traceback" not in log
    # It gave up after about the configured time (plus interpreter start-up).
    assert GIVE_UP - 0.5 <= elapsed <= GIVE_UP + 10
