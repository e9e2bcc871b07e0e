"""Shared machinery of the reliability scenarios.

* :class:`ScenarioReport` and :func:`record_report`: each scenario's figures, appended
  as one JSON line to the file named by ``STREAMKIT_RELIABILITY_REPORT`` (when set), for
  ``tests/reliability/write_report.py``.
* :class:`Producer`: sends numbered events at a steady pace while faults are injected.
* :class:`SeenMonitor`: follows the ``scenario:seen`` list as the workers append to it,
  remembering when each processing was observed, to measure recovery times; waits on
  what it observed are woken by each new observation.
* :func:`inflight_of`: the entries a worker had delivered and not acknowledged, read
  right after it was killed or frozen: the bound on the duplicates it may cause.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio
import trio_util

from streamkit import RedisUnavailable
from streamkit.lowlevel import redis_errors
from tests.apps.scenario import SEEN, Numbered
from tests.scenarios import Tally, numbered_events
from tests.workers import SCENARIO_GROUP, lock_holders

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection, Iterable

    from streamkit import Redis, Stream
    from tests.workers import WorkerProcess

__all__ = [
    "REPORT_ENV",
    "Producer",
    "ScenarioReport",
    "SeenMonitor",
    "inflight_of",
    "lock_holders",
    "pending_events",
    "record_report",
    "worker_id",
]

REPORT_ENV = "STREAMKIT_RELIABILITY_REPORT"
POLL = 0.02


@attrs.frozen(kw_only=True)
class ScenarioReport:
    """What one scenario did and measured.

    Attributes:
        scenario: a short id (``"kill-9"``), also the test's subject.
        title: a one-line name for the table.
        injected: what fault was injected, how often and for how long.
        sent: events sent.
        processed: processings recorded (duplicates included).
        lost: events sent and never processed (must be 0).
        duplicated: extra processings of events processed before.
        duplicate_bound: the bound the duplicates were asserted against (``None``:
            asserted to be 0, or not applicable).
        order_violations: events processed for the first time before an earlier
            event of their key (must be 0).
        recovery_seconds: the measured recovery time (``None``: not applicable).
        recovery: how the recovery time is defined in this scenario.
        duration_seconds: the scenario's wall-clock time.
        notes: anything else worth reading in the report.
        jobs: jobs enqueued during the scenario (``None``: it ran no jobs).
        jobs_per_second: the pace they were enqueued at.
        job_runs: runs of their functions, repeats included.
        job_reruns: jobs that ran more than once.
        job_rerun_bound: how many jobs the leases allowed to run again: those
            running on a worker when it was cut off (the suite fails beyond them).
    """

    scenario: str
    title: str
    injected: str
    sent: int
    processed: int
    lost: int
    duplicated: int
    duplicate_bound: int | None
    order_violations: int
    recovery_seconds: float | None
    recovery: str
    duration_seconds: float
    notes: str = ""
    jobs: int | None = None
    jobs_per_second: float | None = None
    job_runs: int | None = None
    job_reruns: int | None = None
    job_rerun_bound: int | None = None

    @classmethod
    def from_tally(cls, result: Tally, **fields: Any) -> ScenarioReport:
        return cls(
            sent=result.sent,
            processed=result.processed,
            lost=result.lost,
            duplicated=result.duplicated,
            order_violations=result.order_violations,
            **fields,
        )


def record_report(report: ScenarioReport) -> None:
    """Append ``report`` as a JSON line to ``$STREAMKIT_RELIABILITY_REPORT``, if set."""
    path = os.environ.get(REPORT_ENV)
    line = {
        **attrs.asdict(report),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.system()})",
    }
    print(json.dumps(line))  # shown by pytest -s / on failure, handy when debugging
    if path:
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def worker_id(worker: WorkerProcess) -> str:
    """How ``tests.apps.scenario`` names the worker in ``scenario:seen`` entries."""
    return f"{socket.gethostname()}:{worker.pid}"


# --------------------------------------------------------------------------- producing


@attrs.define(eq=False)
class Producer:
    """Sends ``keys`` numbered events (one per key) every ``interval`` seconds.

    Run it with ``nursery.start_soon(producer.run)``; :meth:`stop` ends it after the
    round under way, so every event in :attr:`sent` was acknowledged by Redis.
    """

    stream: Stream[Numbered]
    keys: int
    interval: float
    limit: int | None = None
    sent: list[Numbered] = attrs.field(factory=list)
    # len(sent), as a watchable.
    _sent_count: trio_util.AsyncValue[int] = attrs.field(factory=lambda: trio_util.AsyncValue(0))
    _next_seq: int = 0
    _stopped: trio.Event = attrs.field(factory=trio.Event)
    _done: trio.Event = attrs.field(factory=trio.Event)
    _sending: trio.Lock = attrs.field(factory=trio.Lock)

    async def run(self) -> None:
        start = trio.current_time()
        try:
            rounds = 0
            while not self._stopped.is_set():
                if self.limit is not None and len(self.sent) >= self.limit:
                    break
                async with self._sending:
                    batch = numbered_events(self.keys, 1, start=self._next_seq)
                    await self.stream.send_many(batch)
                    self._next_seq += 1
                    self.sent.extend(batch)
                    self._sent_count.value = len(self.sent)
                rounds += 1
                with trio.move_on_at(start + rounds * self.interval):
                    await self._stopped.wait()
        finally:
            self._done.set()

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[int]:
        """Hold sending while the block runs; yield how many events were sent so far."""
        async with self._sending:
            yield len(self.sent)

    async def stop(self) -> None:
        """Stop after the round under way and wait for it."""
        self._stopped.set()
        await self._done.wait()

    async def wait_sent(self, count: int, *, within: float = 60) -> None:
        """Wait until ``count`` events were sent, or the producer ended."""
        with trio.fail_after(within):
            await trio_util.wait_any(
                lambda: self._sent_count.wait_value(lambda n: n >= count), self._done.wait
            )


# --------------------------------------------------------------------------- observing


@attrs.frozen
class Observation:
    """One processing of an event, as first observed in ``scenario:seen``."""

    key: str
    seq: int
    worker: str
    at: float  # Trio-clock time of the poll that saw it


@attrs.define(eq=False)
class SeenMonitor:
    """Follows ``scenario:seen`` incrementally; run with ``nursery.start_soon(m.run)``."""

    redis: Redis
    partition_of: dict[str, int]
    #: The stream watched, to find missing events in it when a wait fails.
    stream: Stream[Numbered] | None = None
    observations: list[Observation] = attrs.field(factory=list)
    distinct: set[tuple[str, int]] = attrs.field(factory=set)
    #: len(observations), as a watchable: waits on the observations wait on it.
    observed: trio_util.AsyncValue[int] = attrs.field(factory=lambda: trio_util.AsyncValue(0))
    _offset: int = 0

    @classmethod
    def for_stream(cls, redis: Redis, stream: Stream[Numbered], keys: int) -> SeenMonitor:
        partition_of = {
            f"k{k}": stream.partition_of(Numbered(key=f"k{k}", seq=0)) for k in range(keys)
        }
        return cls(redis, partition_of, stream)

    def partitions(self) -> frozenset[int]:
        """The partitions some key of this monitor lives in."""
        return frozenset(self.partition_of.values())

    async def poll(self) -> None:
        try:
            with redis_errors():
                length = await self.redis.llen(SEEN)
                if length < self._offset:  # the list was deleted (FLUSHALL)
                    self._offset = 0
                if length <= self._offset:
                    return
                items = await self.redis.lrange(SEEN, self._offset, length - 1)
        except RedisUnavailable:  # Redis restarting under us: look again later
            return
        now = trio.current_time()
        self._offset += len(items)
        for item in items:
            text = item.decode() if isinstance(item, bytes) else cast("str", item)
            key, seq_text, worker = text.split(":", 2)
            seq = int(seq_text)
            self.observations.append(Observation(key, seq, worker, now))
            self.distinct.add((key, seq))
        self.observed.value = len(self.observations)

    async def wait_observed(self, predicate: Callable[[], bool], *, within: float = 30) -> None:
        """Wait until ``predicate()``, a condition on the observations, holds."""
        with trio.fail_after(within):
            await self.observed.wait_value(lambda _: predicate())

    async def run(self) -> None:
        # Polls: the list is written by other processes. Observation times are
        # measured from these polls, so they are every POLL seconds.
        while True:
            await self.poll()
            await trio.sleep(POLL)

    def resumed_at(
        self,
        partitions: Collection[int],
        after: float,
        *,
        excluding: str | None = None,
        min_seq: int = 0,
    ) -> float | None:
        """When every one of ``partitions`` had been processed again after ``after``
        (by a worker other than ``excluding``, an event numbered ``min_seq`` or
        later); ``None`` if some has not yet."""
        first: dict[int, float] = {}
        for obs in self.observations:
            if obs.at <= after or obs.worker == excluding or obs.seq < min_seq:
                continue
            p = self.partition_of[obs.key]
            if p in partitions and p not in first:
                first[p] = obs.at
        if not set(partitions) <= set(first):
            return None
        return max(first[p] for p in partitions)

    async def wait_resumed(
        self,
        partitions: Collection[int],
        after: float,
        *,
        excluding: str | None = None,
        within: float = 30,
    ) -> float:
        """Wait until :meth:`resumed_at` is known; return it minus ``after``."""
        await self.wait_observed(
            lambda: self.resumed_at(partitions, after, excluding=excluding) is not None,
            within=within,
        )
        at = self.resumed_at(partitions, after, excluding=excluding)
        assert at is not None
        return at - after

    async def wait_processed(self, sent: Iterable[Numbered], *, within: float = 60) -> float:
        """Wait until every event of ``sent`` was processed; return the time it was seen."""
        expected = {(e.key, e.seq) for e in sent}
        try:
            await self.wait_observed(lambda: expected <= self.distinct, within=within)
        except trio.TooSlowError:
            raise AssertionError(await self.explain_missing(expected)) from None
        return trio.current_time()

    async def explain_missing(self, expected: set[tuple[str, int]]) -> str:
        """What of ``expected`` was never observed, per partition: who processed the
        partition last and when, who holds its lease, and where in Redis the missing
        events are (pending with a consumer, or not yet delivered). The message of a
        failed wait, so that a failure in CI can be read without running it again."""
        missing: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for key, seq in sorted(expected - self.distinct):
            missing[self.partition_of[key]].append((key, seq))
        last: dict[int, Observation] = {}
        for obs in self.observations:
            last[self.partition_of[obs.key]] = obs
        now = trio.current_time()
        holders = await lock_holders(self.redis, max(self.partition_of.values()) + 1)
        lines = [f"{sum(map(len, missing.values()))} of {len(expected)} events unprocessed"]
        for p, events in sorted(missing.items()):
            seen_last = last.get(p)
            by = (
                f"last processed by {seen_last.worker} {now - seen_last.at:.1f}s ago"
                if seen_last
                else "never processed"
            )
            lines.append(
                f"  partition {p} (lease held by pid {holders.get(p)}): {len(events)} "
                f"missing, {events[:6]}; {by}"
            )
            lines.extend(f"    {line}" for line in await self._where(p, set(events)))
        return "\n".join(lines)

    async def _where(self, partition: int, events: set[tuple[str, int]]) -> list[str]:
        key = f"__strm:{{scenario.numbered.{partition}}}"
        groups: Any = await self.redis.xinfo_groups(key)
        said = [f"group {g[b'name']!r}: last delivered {g[b'last-delivered-id']!r}" for g in groups]
        pending: Any = await self.redis.xpending(key, SCENARIO_GROUP, "-", "+", 100_000)
        pel = {entry.identifier: entry for entry in pending}
        entries: Any = await self.redis.xrange(key, "-", "+")
        for entry in entries:
            if self.stream is None:
                break
            fields = cast("dict[bytes, bytes]", entry.field_values)
            record = self.stream.codec.decode(fields, stream=self.stream.name)
            found = (record.key, record.seq)
            if found in events:
                held = pel.get(entry.identifier)
                where = (
                    f"pending with {held.consumer} (delivered {held.delivered}x, "
                    f"idle {held.idle} ms)"
                    if held
                    else "not pending"
                )
                said.append(f"{found} is entry {entry.identifier}, {where}")
        return said

    def progress_gaps(self, *, after: float = -float("inf")) -> dict[int, float]:
        """Per partition, the longest time between two observed first processings."""
        last: dict[int, float] = {}
        gaps: dict[int, float] = defaultdict(float)
        seen: set[tuple[str, int]] = set()
        for obs in self.observations:
            if (obs.key, obs.seq) in seen or obs.at < after:
                continue
            seen.add((obs.key, obs.seq))
            p = self.partition_of[obs.key]
            if p in last:
                gaps[p] = max(gaps[p], obs.at - last[p])
            last[p] = obs.at
        return dict(gaps)


# --------------------------------------------------------------------------- Redis state


async def pending_events(
    redis: Redis, stream: Stream[Numbered], partitions: Collection[int]
) -> set[tuple[str, int]]:
    """The events (key, seq) pending, delivered and unacknowledged, in ``partitions``."""
    found: set[tuple[str, int]] = set()
    for p in partitions:
        key = stream.key(p)
        entries: Any = await redis.xpending(key, SCENARIO_GROUP, "-", "+", 100_000)
        for entry in entries:
            [found_entry] = await redis.xrange(key, entry.identifier, entry.identifier)
            fields = cast("dict[bytes, bytes]", found_entry.field_values)
            record = stream.codec.decode(fields, stream=stream.name)
            found.add((record.key, record.seq))
    return found


async def inflight_of(redis: Redis, pid: int, partitions: int = 8) -> dict[int, int]:
    """Entries delivered and not acknowledged in the partitions ``pid`` holds.

    Read right after the worker was killed or frozen (before its leases expire), this
    counts every event it may have processed without acknowledging: the most it can
    make the next owner process again.
    """
    held = [p for p, holder in (await lock_holders(redis, partitions)).items() if holder == pid]
    pending: dict[int, int] = {}
    for p in held:
        summary: Any = await redis.xpending(f"__strm:{{scenario.numbered.{p}}}", SCENARIO_GROUP)
        pending[p] = int(summary.pending)
    return pending
