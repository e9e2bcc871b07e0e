"""What a real ``streamkit worker`` says at INFO: its start and stop in a few short
lines, and an outage of Redis in a few lines whatever the number of partitions.

The bounds, as docs/observability.md states them:

- a worker's start, and its graceful stop, each take at most :data:`HANDFUL` lines at
  INFO, each at most :data:`WIDTH` characters (the README's app: one processor, 8
  partitions);
- a stopped Redis under a running worker takes one warning when it is lost, a
  summary every 30 seconds while it stays lost, and one line when it is back: at
  most 3 lines in an outage's first minute (the warning and the summaries at 30
  and 60 seconds) and 2 a minute after, plus the line of its end, with 16
  partitions as with 1.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import pytest
import trio

from streamkit.testing import wait_until
from tests.apps.scenario import SEEN, make_app
from tests.scenarios import numbered_events
from tests.workers import FAST_ENV, start_worker

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

HANDFUL = 5
WIDTH = 100

#: The README's app, as the quickstart makes it.
SHOP = """\
from datetime import datetime

from streamkit import App, Events, Record

app = App("shop")


class Order(Record):
    order_id: int
    customer: str
    amount: float
    created_at: datetime


orders = app.stream("orders", record=Order, partition_by="customer", partition_count=8)


@app.processor(orders)
async def printer(events: Events[Order]) -> None:
    async for order in events.records():
        print(order.customer, order.amount)
"""


def lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.strip()]


async def test_a_worker_starts_and_stops_in_a_handful_of_short_lines(
    redis_url: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    (tmp_path / "shop.py").write_text(SHOP, encoding="utf-8")
    logs = tmp_path / "logs"
    logs.mkdir()
    worker = start_worker(redis_url, logs, app="shop:app", cwd=tmp_path)
    workers.append(worker)
    await wait_until(
        lambda: "owns partitions 0-7" in worker.log(), what="the partitions owned", within=20
    )
    started = lines(worker.log())
    worker.send_signal(signal.SIGINT)
    assert await worker.wait_exit(within=20) == 0, worker.log()
    stopped = lines(worker.log())[len(started) :]

    for said in (started, stopped):
        assert len(said) <= HANDFUL, "\n".join(said)
        assert all(" INFO " in line for line in said), "\n".join(said)
        too_long = [line for line in said if len(line) > WIDTH]
        assert not too_long, "\n".join(too_long)
    assert any("joined shop.orders.printer" in line for line in started), started
    assert any("worker of shop running printer" in line for line in started), started
    assert any("released partitions 0-7" in line for line in stopped), stopped
    assert stopped[-1].endswith("worker of shop stopped cleanly"), stopped


PARTITIONS = 16
KEYS = 64
#: Past the first summary, due 30 seconds into the outage.
OUTAGE = 35.0


@pytest.mark.timeout(120)
async def test_an_outage_is_said_once_summed_up_and_its_end_said(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # Batches take a while: Redis goes away with events in every partition's hands.
    env = {"SCENARIO_PARTITIONS": str(PARTITIONS), "SCENARIO_DELAY": "0.2", "SCENARIO_BATCH": "5"}
    worker = start_worker(private_redis.url, tmp_path, env=env)
    workers.append(worker)
    await wait_until(
        lambda: f"owns partitions 0-{PARTITIONS - 1}" in worker.log(),
        what="the partitions owned",
        within=20,
    )
    before = len(lines(worker.log()))
    app, stream = make_app(partitions=PARTITIONS, redis_url=private_redis.url)
    async with app:
        await stream.send_many(numbered_events(KEYS, 40))
        await wait_until(lambda: app.redis.llen(SEEN), what="events processed", within=20)

    # Redis goes away under the running worker (its leases lapse, every partition
    # retries, the batches in hand fail), for longer than the first summary's interval.
    await trio.to_thread.run_sync(private_redis.stop)
    await wait_until(
        lambda: "unreachable for 30s" in worker.log(), what="the first summary", within=45
    )
    await trio.sleep(OUTAGE - 30)  # the outage's length: the injected fault
    during = lines(worker.log())[before:]
    await trio.to_thread.run_sync(private_redis.start)
    await wait_until(lambda: " back after " in worker.log(), what="the end said", within=30)
    said = lines(worker.log())[before:]
    end = next(i for i, line in enumerate(said) if " back after " in line)
    outage = said[: end + 1]

    text = "\n".join(outage)
    # One warning when it is lost, one summary (30 s in), one line when it is back:
    # nothing per partition, per retry or per component.
    assert len(during) <= 2, text
    assert len(outage) <= 3, text
    assert f"Redis at {private_redis.url} unreachable: " in outage[0], text
    [summary] = [line for line in outage if "unreachable for 30s" in line]
    assert f"; {PARTITIONS} partitions waiting; retrying" in summary, text
    assert all(" WARNING " in line for line in outage), text
    assert "Traceback" not in worker.log()
    assert worker.process.poll() is None


@pytest.mark.timeout(40)
async def test_a_stop_during_an_outage_says_once_what_was_not_released(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # Redis killed, SIGTERM half a second later: the worker stops in its grace, exits
    # 0, and says once that its partitions were not released (nor their events in hand
    # acknowledged), not that it released them nor that Redis is back.
    grace = float(FAST_ENV["STREAMKIT_GRACE_PERIOD"])
    env = {
        "SCENARIO_PARTITIONS": "4",
        "SCENARIO_DELAY": "1.0",
        "SCENARIO_BATCH": "5",
        "STREAMKIT_LEASE_TTL": "10",  # held through the stop: none lost before it
    }
    worker = start_worker(private_redis.url, tmp_path, env=env)
    workers.append(worker)
    await wait_until(
        lambda: "owns partitions 0-3" in worker.log(), what="the partitions owned", within=20
    )
    app, stream = make_app(partitions=4, redis_url=private_redis.url)
    async with app:
        await stream.send_many(numbered_events(KEYS, 40))
        await wait_until(lambda: app.redis.llen(SEEN), what="events processed", within=20)
    private_redis.stop()  # SIGKILL
    await trio.sleep(0.5)  # the trial's timing: the signal comes during the outage
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit(within=grace + 6) == 0, worker.log()
    log = worker.log()
    assert log.count("not released") == 1, log
    assert f"stopping while Redis at {private_redis.url} is unreachable: partitions 0-3" in log
    assert "released partitions" not in log, log
    assert "back after" not in log, log
    assert "Traceback" not in log, log
