"""Scenario: Redis reaches maxmemory (noeviction) while workers consume a backlog.

A full Redis refuses every command that may grow memory (``OOM``). It is an outage,
not a crash: a running worker keeps consuming (fenced reads, acknowledgements and
lease extensions are never refused; taking a lease and heartbeats are allowed past
the limit), a worker started meanwhile waits to join instead of exiting, a producer
is refused at once with nothing appended, and once memory is available again the new
worker joins, producers succeed and nothing is lost or reordered.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import pytest
import trio

from streamkit import App, ServerRefused, open_redis
from streamkit.testing import wait_until
from tests.apps.scenario import Numbered
from tests.reliability.full_app import PARTITIONS
from tests.reliability.harness import ScenarioReport, record_report
from tests.scenarios import numbered_events, tally
from tests.workers import SCENARIO_GROUP, start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

APP = "tests.reliability.full_app:app"
KEYS = 16
BACKLOG = 40  # events per key before Redis fills up: 640 in all


def seen_lines(directory: Path) -> list[bytes]:
    """Every worker's ``key:seq:worker`` lines, in the order they were processed."""
    stamped = [
        line.split(" ", 1)
        for path in directory.glob("*.log")
        for line in path.read_text().splitlines()
    ]
    # Stable: a batch's lines share a stamp and keep their order.
    return [rest.encode() for _, rest in sorted(stamped, key=lambda pair: int(pair[0]))]


def processed(directory: Path) -> set[tuple[str, int]]:
    found = set()
    for line in seen_lines(directory):
        key, seq, _ = line.decode().split(":", 2)
        found.add((key, int(seq)))
    return found


async def set_maxmemory(redis: Redis, value: int) -> None:
    await redis.config_set({"maxmemory-policy": "noeviction", "maxmemory": value})


@pytest.mark.timeout(90)
async def test_a_full_redis_is_ridden_out_and_nothing_is_lost(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    began = trio.current_time()
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    env = {"FULL_SEEN_DIR": str(seen_dir), "FULL_DELAY": "0.05"}
    app = App("scenario", redis_url=private_redis.url)
    stream = app.stream("numbered", record=Numbered, partition_by="key", partition_count=PARTITIONS)
    backlog = numbered_events(KEYS, BACKLOG)
    async with open_redis(private_redis.url) as redis, app:
        await stream.send_many(backlog)
        first = start_worker(private_redis.url, tmp_path, app=APP, env=env)
        workers.append(first)
        await wait_members(redis, 1, group=SCENARIO_GROUP)
        await wait_until(
            lambda: len(seen_lines(seen_dir)) >= 40, what="the backlog under way", within=30
        )

        # Redis is full: every command that may grow memory is refused.
        await set_maxmemory(redis, 1)
        full_at = trio.current_time()
        done_while_full = len(seen_lines(seen_dir))
        assert done_while_full < len(backlog)

        # The running worker keeps consuming the backlog to its end.
        await wait_until(
            lambda: {(e.key, e.seq) for e in backlog} <= processed(seen_dir),
            what="the backlog consumed while Redis is full",
            within=40,
        )
        consumed_full = trio.current_time() - full_at

        # A producer is refused at once, with nothing appended.
        lengths = [await redis.xlen(stream.key(p)) for p in range(PARTITIONS)]
        with trio.fail_after(2), pytest.raises(ServerRefused) as refused:
            await stream.send(Numbered(key="k0", seq=BACKLOG))
        assert refused.value.out_of_memory
        assert [await redis.xlen(stream.key(p)) for p in range(PARTITIONS)] == lengths

        # A new worker cannot join yet: it waits, saying why, and does not exit.
        second = start_worker(private_redis.url, tmp_path, app=APP, env=env)
        workers.append(second)
        await wait_until(
            lambda: "joining membership group" in second.log() and "out of memory" in second.log(),
            what="the second worker's warning",
            within=30,
        )
        await trio.sleep(2.0)  # longer than session_timeout (1.5 s): the fault's duration
        assert second.process.poll() is None
        assert first.process.poll() is None

        # Memory is available again: the newcomer joins, producers succeed.
        await set_maxmemory(redis, 0)
        freed_at = trio.current_time()
        await wait_members(redis, 2, group=SCENARIO_GROUP)
        joined_after = trio.current_time() - freed_at
        more = numbered_events(KEYS, 10, start=BACKLOG)
        await stream.send_many(more)
        sent = backlog + more
        expected = {(e.key, e.seq) for e in sent}
        await wait_until(
            lambda: expected <= processed(seen_dir),
            what="every event processed",
            within=30,
        )
        result = tally(sent, seen_lines(seen_dir))

        for worker in (first, second):
            worker.send_signal(signal.SIGTERM)
        codes = [await worker.wait_exit(within=20) for worker in (first, second)]

    logs = first.log() + second.log()
    record_report(
        ScenarioReport.from_tally(
            result,
            scenario="redis-full",
            title="Redis reaches maxmemory (noeviction) during a backlog",
            injected=(
                f"maxmemory set to 1 byte after {done_while_full} of {len(backlog)} backlog "
                f"events were processed; a second worker started while full; memory "
                f"freed again"
            ),
            duplicate_bound=None,
            recovery_seconds=joined_after,
            recovery="from memory freed until the waiting worker had joined",
            duration_seconds=trio.current_time() - began,
            notes=f"the backlog was consumed in {consumed_full:.1f}s while Redis was full",
        )
    )
    assert (result.lost, result.order_violations) == (0, 0)
    assert codes == [0, 0]
    assert "Traceback" not in logs
