"""Scenario 7: keys deleted under running workers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from streamkit.lowlevel import membership_keys, read_membership
from streamkit.testing import wait_until
from tests.apps.scenario import make_app
from tests.reliability.harness import (
    Producer,
    ScenarioReport,
    SeenMonitor,
    lock_holders,
    record_report,
)
from tests.reliability.test_kill import ENV, KEYS, PARTITIONS, wait_working
from tests.scenarios import seen, tally
from tests.workers import SCENARIO_GROUP, start_worker, wait_members

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess


async def flushall(redis: Redis) -> None:
    await redis.flushall()


async def delete_membership(redis: Redis) -> None:
    await redis.delete([membership_keys(SCENARIO_GROUP).state])


async def delete_locks(redis: Redis) -> None:
    await redis.delete(await redis.keys("__lock:{scenario.numbered.*}.record"))


async def delete_heartbeats(redis: Redis) -> None:
    await redis.delete(await redis.keys(f"__beat:{{{SCENARIO_GROUP}}}:*"))


async def delete_partition(redis: Redis) -> None:
    await redis.delete(["__strm:{scenario.numbered.0}"])


# id, what is deleted, how, whether it destroys events (then only events sent after
# the deletion are counted), and what "recovered" means besides processing going on.
CASES: list[tuple[str, str, Callable[[Redis], Awaitable[None]], bool]] = [
    ("flushall", "FLUSHALL", flushall, True),
    ("membership", "DEL of the group's membership state (`__memb`)", delete_membership, False),
    ("locks", "DEL of every partition lock (`__lock`)", delete_locks, False),
    ("heartbeats", "DEL of every member's heartbeat (`__beat`)", delete_heartbeats, False),
    ("partition", "DEL of a partition's stream and consumer group", delete_partition, True),
]
# How the workers find out, for the report.
HOW = {
    "flushall": (
        "leases are refused at the next read, acknowledgement or renewal and taken "
        "again, consumer groups re-created, and the members rejoin at their next "
        "heartbeat, which finds the group's state gone"
    ),
    "membership": "the members rejoin at their next heartbeat, which finds the state gone",
    "locks": "each lease is refused at the next fenced read, ack or renewal and taken again",
    "heartbeats": "the next heartbeat (every 0.1 s) writes them again before anyone is reaped",
    "partition": "the next fenced read finds no group and re-creates it",
}


async def coordination_restored(redis: Redis, pids: set[int]) -> bool:
    """The group lists exactly the live workers and assigns every partition, and every
    partition's lease is held by one of them."""
    snapshot = await read_membership(redis, SCENARIO_GROUP)
    if snapshot is None or {m.pid for m in snapshot.members} != pids:
        return False
    assigned = sorted(p for ps in snapshot.assignment.members.values() for p in ps)
    if assigned != list(range(PARTITIONS)):
        return False
    holders = await lock_holders(redis, PARTITIONS)
    return all(holder in pids for holder in holders.values())


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("case", "what", "delete", "destructive"), CASES, ids=[c[0] for c in CASES]
)
async def test_deleted_keys_are_recovered(
    case: str,
    what: str,
    delete: Callable[[Redis], Awaitable[None]],
    destructive: bool,
    redis_url: str,
    redis: Redis,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    began = trio.current_time()
    app, stream = make_app(redis_url=redis_url)
    async with app, trio.open_nursery() as nursery:
        monitor = SeenMonitor.for_stream(redis, stream, KEYS)
        nursery.start_soon(monitor.run)
        producer = Producer(stream, keys=KEYS, interval=0.04)
        nursery.start_soon(producer.run)
        workers.extend(start_worker(redis_url, tmp_path, env=ENV) for _ in range(2))
        await wait_members(redis, 2)
        await wait_working(monitor, redis, workers[0])
        await wait_working(monitor, redis, workers[1])

        async with producer.paused() as sent_before:
            await delete(redis)
            deleted_at = trio.current_time()
        next_seq = producer.sent[-1].seq + 1
        pids = {w.pid for w in workers}
        # Recovered: the coordination state is whole again and events sent after the
        # deletion are processed in every partition. Or a worker exits with a clear
        # error. Never a silent hang.

        async def recovered() -> bool:
            exited = [w for w in workers if w.process.poll() is not None]
            assert not exited, f"a worker exited: {exited[0].log()[-2000:]}"
            resumed = monitor.resumed_at(range(PARTITIONS), deleted_at, min_seq=next_seq)
            return resumed is not None and await coordination_restored(redis, pids)

        await wait_until(
            recovered,
            what="coordination restored and every partition resumed",
            within=20,
            interval=0.05,
        )
        recovery = trio.current_time() - deleted_at
        resumed_at = monitor.resumed_at(range(PARTITIONS), deleted_at, min_seq=next_seq)
        assert resumed_at is not None
        resumed = resumed_at - deleted_at
        await producer.stop()
        counted = producer.sent[sent_before:] if destructive else producer.sent
        await monitor.wait_processed(counted, within=20)
        nursery.cancel_scope.cancel()

    expected = {(e.key, e.seq) for e in counted}
    everything = [
        item
        for item in await seen(redis)
        if tuple(item.decode().split(":", 2)[:2]) in {(k, str(s)) for k, s in expected}
    ]
    result = tally(counted, everything)
    report = ScenarioReport.from_tally(
        result,
        scenario=f"deleted-keys: {case}",
        title=f"Keys deleted under running workers: {what}",
        injected=f"{what} under 2 running workers, events sent throughout",
        duplicate_bound=PARTITIONS * 2 * 20,
        recovery_seconds=recovery,
        recovery=(
            "from the deletion until the group listed both workers again, every partition "
            "was assigned and leased by one of them, and events sent after the deletion "
            "were processed in every partition"
        ),
        duration_seconds=trio.current_time() - began,
        notes=(
            f"{HOW[case]}; events sent after the deletion were being processed in every "
            f"partition {resumed:.2f}s after it; "
            + (
                "counted: the events sent after the deletion (it destroyed the earlier ones)"
                if destructive
                else "counted: every event sent, before and after the deletion"
            )
        ),
    )
    record_report(report)
    assert result.lost == 0
    assert result.order_violations == 0
    assert result.duplicated <= PARTITIONS * 2 * 20
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()
