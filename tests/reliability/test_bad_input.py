"""Scenario 6: poison and malformed events among good ones."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import ProcessorKeys
from streamkit.testing import wait_until
from tests.apps.poison import ATTEMPTS, MAX_DELIVERIES, RETRIES, Job, make_app
from tests.apps.scenario import Numbered
from tests.reliability.harness import ScenarioReport, SeenMonitor, record_report
from tests.scenarios import seen, tally
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

KEYS = 16
PER_KEY = 100
HANDLE = ProcessorKeys(app="poison", stream="jobs", processor="handle")
GROUP = HANDLE.group
DEAD = HANDLE.dead_letter_key
MALFORMED = [{b"data": b"{not json"}, {b"junk": b"\xff\xfe"}, {b"data": b'{"key": 1}'}]
CRASH_LOOPED = 2  # entries a previous consumer was handed 5 times without finishing


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def pending(redis: Redis, keys: list[str]) -> int:
    total = 0
    for key in keys:
        summary: Any = await redis.xpending(key, GROUP)
        total += int(summary.pending)
    return total


@pytest.mark.timeout(60)
async def test_poison_and_malformed_events_among_good_ones(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    began = trio.current_time()
    app, jobs = make_app(redis_url=redis_url)
    good: list[Job] = []
    poison: list[Job] = []
    malformed = 0
    async with app:
        await jobs.check_metadata()
        # Entries that an earlier deployment took and crashed on, again and again.
        first = jobs.key(0)
        await redis.xgroup_create(first, GROUP, "0", mkstream=True)
        looped: list[bytes] = []
        for i in range(CRASH_LOOPED):
            entry_id = await redis.xadd(first, jobs.codec.encode(Job(key="looped", seq=i)))
            assert entry_id is not None
            looped.append(entry_id)
        await redis.xreadgroup(GROUP, "p0", {first: ">"}, count=CRASH_LOOPED)
        await redis.xclaim(first, GROUP, "p0", 0, looped, retrycount=5)

        # Both workers are in before any event is sent: a rebalance in the middle of
        # a poison event's retries would start its retry count again on the new owner.
        workers.extend(
            start_worker(redis_url, tmp_path, app="tests.apps.poison:app") for _ in range(2)
        )
        await wait_members(redis, 2, group=GROUP)
        for seq in range(PER_KEY):
            batch = [Job(key=f"k{k}", seq=seq) for k in range(KEYS)]
            good.extend(batch)
            if seq % 10 == 5:
                bad = Job(key=f"k{seq % KEYS}", seq=10_000 + seq, poison=True)
                poison.append(bad)
                batch.insert(seq % KEYS, bad)
            await jobs.send_many(batch)
            if seq % 10 == 7:
                fields: Any = MALFORMED[malformed % len(MALFORMED)]
                await redis.xadd(jobs.key(seq % jobs.partition_count), fields)
                malformed += 1

    monitor = SeenMonitor(
        redis, {f"k{k}": jobs.partition_of(Job(key=f"k{k}", seq=0)) for k in range(KEYS)}
    )
    sent = [Numbered(key=j.key, seq=j.seq) for j in good]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.run)
        await monitor.wait_processed(sent, within=40)
        expected_dead = len(poison) + malformed + CRASH_LOOPED

        async def dead_lettered() -> bool:
            return await redis.xlen(DEAD) >= expected_dead

        async def all_acknowledged() -> bool:
            return not await pending(redis, [jobs.key(p) for p in range(jobs.partition_count)])

        with trio.fail_after(30):
            await wait_until(dead_lettered, what=f"{expected_dead} dead letters", within=30)
            # Everything, bad input included, ends up acknowledged.
            await wait_until(all_acknowledged, what="nothing pending", within=30)
        nursery.cancel_scope.cancel()

    result = tally(sent, await seen(redis))
    letters = await redis.xrange(DEAD)
    reasons = Counter(_text(entry.field_values[b"dl.reason"]) for entry in letters)
    attempts = Counter(a.decode() for a in await redis.lrange(ATTEMPTS, 0, -1))
    logs = [w.log() for w in workers]
    report = ScenarioReport.from_tally(
        result,
        scenario="bad-input",
        title="Poison and malformed events among good ones",
        injected=(
            f"{len(poison)} poison events (the processor raises on each), {malformed} "
            f"undecodable entries and {CRASH_LOOPED} entries already delivered 5 times "
            f"(a crash loop), mixed into {len(good)} good events; 2 workers; policy "
            f"retry x{RETRIES}, then dead-letter, max_deliveries={MAX_DELIVERIES}"
        ),
        duplicate_bound=0,
        recovery_seconds=None,
        recovery="not applicable: good events are never held up by more than the retries",
        duration_seconds=trio.current_time() - began,
        notes=(
            f"dead letters by reason: {dict(sorted(reasons.items()))}; every poison "
            f"event was tried {RETRIES + 1} times; no worker exited; nothing left pending"
        ),
    )
    record_report(report)
    assert (result.lost, result.duplicated, result.order_violations) == (0, 0, 0)
    assert reasons == {
        "retries exhausted": len(poison),
        "undecodable": malformed,
        "poison": CRASH_LOOPED,
    }
    assert attempts == {f"{j.key}:{j.seq}": RETRIES + 1 for j in poison}
    tracebacks = 0
    for worker, log in zip(workers, logs, strict=True):
        assert worker.process.poll() is None, log
        assert "halting" not in log
        # The only tracebacks are the processor's own, logged once per poison job as
        # its retries end: no crash, nothing of streamkit's.
        for chunk in log.split("Traceback (most recent call last):\n")[1:]:
            ending = next(line for line in chunk.splitlines() if not line.startswith(" "))
            assert ending.startswith("ValueError: poison job "), chunk
            tracebacks += 1
    assert tracebacks == len(poison)
