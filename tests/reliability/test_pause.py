"""Scenario 2: SIGSTOP a worker for longer than its lease, then SIGCONT it (fencing)."""

from __future__ import annotations

import signal
from collections import Counter
from typing import TYPE_CHECKING

import pytest
import trio

from streamkit.lowlevel import read_membership
from streamkit.testing import wait_until
from tests.apps.scenario import make_app
from tests.reliability.harness import (
    Producer,
    ScenarioReport,
    SeenMonitor,
    inflight_of,
    pending_events,
    record_report,
    worker_id,
)
from tests.reliability.test_kill import BATCH, ENV, KEYS, PARTITIONS, wait_working
from tests.scenarios import seen, tally
from tests.workers import FAST_ENV, SCENARIO_GROUP, start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

LEASE_TTL = float(FAST_ENV["STREAMKIT_LEASE_TTL"])
PAUSE = 4.0  # well past lease_ttl and session_timeout (1.5 s each)


async def wait_log(worker: WorkerProcess, *needles: str, within: float = 20) -> str:
    """Wait until ``worker``'s log contains one of ``needles``; return that one."""
    await wait_until(
        lambda: any(needle in worker.log() for needle in needles),
        what=f"one of {needles} in the log of worker {worker.pid}",
        within=within,
    )
    log = worker.log()
    return next(needle for needle in needles if needle in log)


async def wait_member(redis: Redis, worker: WorkerProcess, *, within: float = 20) -> None:
    """Wait until ``worker`` is a member of the scenario group."""

    async def member() -> bool:
        snapshot = await read_membership(redis, SCENARIO_GROUP)
        return snapshot is not None and worker.pid in {m.pid for m in snapshot.members}

    await wait_until(member, what=f"worker {worker.pid} in the group", within=within)


@pytest.mark.timeout(90)
async def test_sigstop_past_the_lease_is_fenced(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    began = trio.current_time()
    app, stream = make_app(redis_url=redis_url)
    async with app, trio.open_nursery() as nursery:
        monitor = SeenMonitor.for_stream(redis, stream, KEYS)
        nursery.start_soon(monitor.run)
        producer = Producer(stream, keys=KEYS, interval=0.04)
        nursery.start_soon(producer.run)
        workers.extend(start_worker(redis_url, tmp_path, env=ENV) for _ in range(3))
        await wait_members(redis, 3)

        victim = workers[0]
        me = worker_id(victim)
        await wait_working(monitor, redis, victim)
        victim.send_signal(signal.SIGSTOP)
        stopped_at = trio.current_time()
        # Frozen: its partitions' pending entries cannot change until its leases expire.
        inflight = await inflight_of(redis, victim.pid, PARTITIONS)
        assert inflight, "the victim held no partition when it was frozen"
        handed_out = await pending_events(redis, stream, inflight)
        sent_before = {(e.key, e.seq) for e in producer.sent}
        takeover = await monitor.wait_resumed(inflight, stopped_at, excluding=me)
        assert takeover < PAUSE, "the others did not take over while the worker was frozen"

        await trio.sleep_until(stopped_at + PAUSE)  # the injected fault's duration
        seen_before_wake = await redis.llen("scenario:seen")
        victim.send_signal(signal.SIGCONT)
        woke_at = trio.current_time()
        # The stale worker learns that its leases are gone (they ran out while it was
        # frozen, or a renewal, fenced read or acknowledgement is refused; what it logs
        # is the behaviour checked here) and that it was reaped: it rejoins.
        noticed = await wait_log(
            victim, "ran out unnoticed", "the lease ran out", "extension refused",
            "a fenced acknowledgement was refused", "a fenced read was refused",
        )  # fmt: skip
        await wait_member(redis, victim)
        await wait_members(redis, 3)
        assert "rejoining" in victim.log()
        rejoined_after = trio.current_time() - woke_at
        await trio.sleep(1)  # keep sending for a while with the stale worker back
        await producer.stop()
        await monitor.wait_processed(producer.sent)
        nursery.cancel_scope.cancel()

    everything = await seen(redis)
    result = tally(producer.sent, everything)
    counts = Counter(tuple(i.decode().split(":", 2)[:2]) for i in everything)
    # What the stale worker processed after waking, from its old partitions' events
    # sent before it froze: only buffered events, which it must not have acknowledged
    # (the next owner processed them too): duplicates, never skips.
    stale = [
        (key, int(seq))
        for key, seq, worker in (i.decode().split(":", 2) for i in everything[seen_before_wake:])
        if worker == me and (key, int(seq)) in sent_before and monitor.partition_of[key] in inflight
    ]
    for key, seq in stale:
        assert counts[key, str(seq)] >= 2, f"{key}:{seq} was processed only by the stale worker"
    # Only what was in its hands when it froze (one batch per partition): nothing more
    # from its buffers once the lease had run out.
    assert len(stale) <= len(inflight) * BATCH
    # Every entry it had been handed and not acknowledged when it froze was processed
    # by the new owner: none was acknowledged away by the stale worker.
    by_others = {
        (key, int(seq))
        for key, seq, worker in (i.decode().split(":", 2) for i in everything)
        if worker != me
    }
    assert handed_out <= by_others
    inflight_total = sum(inflight.values())
    report = ScenarioReport.from_tally(
        result,
        scenario="sigstop",
        title="SIGSTOP of a worker for longer than its lease, then SIGCONT",
        injected=(
            f"SIGSTOP of one of 3 workers for {PAUSE:.0f}s (lease_ttl {LEASE_TTL}s, "
            f"session_timeout {FAST_ENV['STREAMKIT_SESSION_TIMEOUT']}s), then SIGCONT; "
            f"events sent throughout"
        ),
        duplicate_bound=inflight_total,
        recovery_seconds=takeover,
        recovery=(
            "from the SIGSTOP until every partition the frozen worker held was processed "
            "again by another worker"
        ),
        duration_seconds=trio.current_time() - began,
        notes=(
            f"after SIGCONT the stale worker saw its leases refused ('{noticed}') and "
            f"rejoined the group {rejoined_after:.2f}s after waking. All {len(handed_out)} "
            f"entries it had been handed and not acknowledged when frozen were processed "
            f"by the new owner (none acknowledged away by the stale worker); it processed "
            f"{len(stale)} events after waking (only the batches in its hands when it "
            f"froze; none more from its buffers), each also processed by the new owner "
            f"(duplicates, not skips)"
        ),
    )
    record_report(report)
    assert result.lost == 0
    assert result.order_violations == 0
    assert result.duplicated <= inflight_total
    assert result.duplicated <= PARTITIONS * 2 * BATCH
    assert "Traceback" not in victim.log()
