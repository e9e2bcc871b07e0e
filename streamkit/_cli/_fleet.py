"""A snapshot of an app's fleet: processors, partitions, workers and the job queue.

What ``streamkit status`` (and its ``--watch`` view) and ``streamkit dashboard`` show,
gathered in a few pipelined round trips (see :func:`take_snapshot`). Decide purely,
then do I/O: the rates come from two snapshots by a pure function
(:func:`fleet_rates`), and :func:`fleet_json` is the one JSON form of a snapshot that
the command's ``--json`` and the dashboard's ``/api/status`` print.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import JobNotFound, StreamkitError
from .._nurseries import meaningful_leaf
from .._periodic import next_tick
from .._state_late import total_late, windowed_names
from .._urls import mask_url
from ..jobs import JobInfo, JobStatus, JobTry, QueueCounts
from ..jobs._inspect import merge_counts
from ._admin import MemberStatus, PartitionStatus, lease_owner_name, read_processor

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Iterable

    from .._app import App, Processor
    from .._data_loss import DataLossRecord
    from .._replay import ResetRecord
    from ..jobs import JobQueue

__all__ = [
    "COUNT_NAMES",
    "FleetRates",
    "FleetSample",
    "FleetSnapshot",
    "ProcessorSnapshot",
    "QueueSnapshot",
    "counts_by_name",
    "counts_json",
    "fleet_json",
    "fleet_rates",
    "fleet_samples",
    "job_history",
    "job_json",
    "partition_worker",
    "take_snapshot",
    "worker_names",
]

#: A job status -> the name of its count (as in :class:`~streamkit.jobs.QueueCounts`).
COUNT_NAMES: dict[JobStatus, str] = {
    JobStatus.SENT: "queued",
    JobStatus.SCHEDULED: "scheduled",
    JobStatus.WAITING: "waiting",
    JobStatus.HELD: "held",
    JobStatus.EXECUTING: "running",
    JobStatus.RETRY: "retrying",
    JobStatus.DEAD: "dead",
    JobStatus.SUCCESS: "succeeded",
    JobStatus.ABORTED: "aborted",
    JobStatus.EXPIRED: "expired",
}


@attrs.frozen(kw_only=True)
class ProcessorSnapshot:
    """One processor as seen in Redis.

    Attributes:
        name: the processor's name.
        stream: the name of the stream it consumes.
        members: the members of its group (the workers running it).
        partitions: its partitions, in order.
        ever_run: whether a worker ever joined its group (with no member now, the
            last one left), rather than none ran it yet.
        tables: the names of the tables it writes (their sizes are per partition).
        data_loss: the last data loss a worker found for it, if any.
        last_reset: its last reset, if any (kept a week).
        windows: the names of the windowed tables among them (their late events are
            per partition).
    """

    name: str
    stream: str
    members: tuple[MemberStatus, ...]
    partitions: tuple[PartitionStatus, ...]
    ever_run: bool = True
    tables: tuple[str, ...] = ()
    data_loss: DataLossRecord | None = None
    last_reset: ResetRecord | None = None
    windows: tuple[str, ...] = ()

    @property
    def lag(self) -> int | None:
        """Entries not yet processed, over all partitions (``None`` if one is unknown)."""
        lags = [p.lag for p in self.partitions]
        return None if any(lag is None for lag in lags) else sum(lag or 0 for lag in lags)

    @property
    def pending(self) -> int:
        """Entries delivered and not yet acknowledged, over all partitions."""
        return sum(p.pending for p in self.partitions)

    @property
    def late(self) -> int:
        """Late window events dropped (or dead-lettered) so far, over all partitions."""
        return sum(total_late(p.late) for p in self.partitions)


@attrs.frozen(kw_only=True)
class QueueSnapshot:
    """The app's job queue as seen in Redis.

    Attributes:
        name: the queue's name (the app's).
        shards: its shard count.
        declared: the names of the jobs the app declares.
        counts: its jobs by status, priority and name.
    """

    name: str
    shards: int
    declared: tuple[str, ...]
    counts: QueueCounts


@attrs.frozen(kw_only=True)
class FleetSnapshot:
    """Everything the status view and the dashboard show, taken at one moment.

    Attributes:
        app: the app's name.
        redis_url: the Redis URL, its password masked.
        taken_at: when the snapshot was taken (this machine's clock).
        clock: ``time.monotonic()`` then, for rates between two snapshots.
        processors: each processor of the app.
        jobs: the app's job queue, or ``None`` if it declares no jobs.
    """

    app: str
    redis_url: str
    taken_at: datetime
    clock: float
    processors: tuple[ProcessorSnapshot, ...]
    jobs: QueueSnapshot | None


@attrs.frozen(kw_only=True)
class FleetRates:
    """Rates between two snapshots (see :func:`fleet_rates`).

    Attributes:
        seconds: the time between the snapshots.
        partitions: events delivered per second, by (processor, partition); a
            partition whose rate cannot be told is absent.
        processors: events delivered per second, by processor: the sum over its
            partitions with a rate; absent if none has one.
        jobs: jobs succeeded per second, or ``None``.
    """

    seconds: float = 0.0
    partitions: dict[tuple[str, int], float] = attrs.field(factory=dict)
    processors: dict[str, float] = attrs.field(factory=dict)
    jobs: float | None = None


NO_RATES = FleetRates()


def fleet_rates(before: FleetSnapshot | None, after: FleetSnapshot) -> FleetRates:
    """The rates between ``before`` and ``after`` (pure).

    A partition's rate is the growth of its group's ``entries-read`` counter (events
    delivered to the processor) over the time between the snapshots. It has none
    when either reading is unknown, or when the counter went back (the processor
    was reset meanwhile). The job rate is the growth of the succeeded total.
    """
    if before is None:
        return NO_RATES
    seconds = after.clock - before.clock
    if seconds <= 0:
        return NO_RATES
    earlier = {
        (processor.name, p.partition): p.entries_read
        for processor in before.processors
        for p in processor.partitions
    }
    partitions: dict[tuple[str, int], float] = {}
    processors: dict[str, float] = {}
    for processor in after.processors:
        for p in processor.partitions:
            key = (processor.name, p.partition)
            then = earlier.get(key)
            if then is None or p.entries_read is None or p.entries_read < then:
                continue
            rate = (p.entries_read - then) / seconds
            partitions[key] = rate
            processors[processor.name] = processors.get(processor.name, 0.0) + rate
    jobs = None
    if before.jobs is not None and after.jobs is not None:
        done = after.jobs.counts.succeeded - before.jobs.counts.succeeded
        jobs = done / seconds if done >= 0 else None
    return FleetRates(seconds=seconds, partitions=partitions, processors=processors, jobs=jobs)


async def app_job_counts(app: App) -> QueueCounts:
    """The counts of every job queue of ``app`` (its own and its named ones, see
    ``@app.job(queue=...)``) as one: each job name's row is its own queue's."""
    return merge_counts([await queue.counts() for queue in app.job_queues.values()])


async def app_job_queue_of(app: App, job_id: str) -> JobQueue:
    """The queue of ``app`` that holds job ``job_id`` (its own, or the named one the
    job was routed to); the app's own if none does (its ``JobNotFound`` says so)."""
    for queue in app.job_queues.values():
        if queue is app.job_queue:
            continue
        try:
            await queue.handle(job_id).status()
        except JobNotFound:
            continue
        return queue
    return app.job_queue


async def take_snapshot(app: App, *, clock: Callable[[], float] = time.monotonic) -> FleetSnapshot:
    """Read what the status view shows of ``app`` (inside ``async with app:``).

    The processors and the job queue are read at the same time, each in a few
    pipelined round trips (see :func:`~streamkit._cli._admin.read_processor`).

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    processors: dict[str, ProcessorSnapshot] = {}
    counts: list[QueueCounts] = []

    async def read(processor: Processor) -> None:
        reading = await read_processor(app, processor)
        processors[processor.name] = ProcessorSnapshot(
            name=processor.name,
            stream=processor.stream.name,
            members=tuple(reading.members),
            partitions=tuple(reading.partitions),
            ever_run=reading.ever_run,
            tables=tuple(table.name for table in processor.tables),
            data_loss=reading.data_loss,
            last_reset=reading.last_reset,
            windows=tuple(windowed_names(processor.tables)),
        )

    async def count() -> None:
        counts.append(await app_job_counts(app))

    taken_at = datetime.now(UTC)
    started = clock()
    try:
        async with trio.open_nursery() as nursery:
            for processor in app.processors.values():
                nursery.start_soon(read, processor)
            if app.jobs:
                nursery.start_soon(count)
    except BaseExceptionGroup as group:
        # One error (Redis unreachable: every reader saw the same server), not a group.
        raise meaningful_leaf(group) from None
    jobs = None
    if counts:
        jobs = QueueSnapshot(
            name=app.job_queue.name,
            shards=app.job_queue.shards,
            declared=tuple(app.jobs),
            counts=counts[0],
        )
    return FleetSnapshot(
        app=app.name,
        redis_url=mask_url(app.settings.redis_url),
        taken_at=taken_at,
        clock=started,
        processors=tuple(processors[name] for name in app.processors),
        jobs=jobs,
    )


@attrs.frozen(kw_only=True)
class FleetSample:
    """One reading of :func:`fleet_samples`.

    Attributes:
        snapshot: the newest snapshot (the previous one if this reading failed), or
            ``None`` if no reading succeeded yet.
        rates: the rates since the previous snapshot.
        error: why this reading failed (Redis unreachable), or ``None``.
    """

    snapshot: FleetSnapshot | None
    rates: FleetRates
    error: str | None = None


async def fleet_samples(app: App, *, interval: float) -> AsyncGenerator[FleetSample, None]:
    """A snapshot of ``app`` and its rates every ``interval`` seconds, forever.

    Readings are taken at ``start + k * interval`` (a slow one skips the ticks it
    overlapped). A reading that fails is yielded with its error and the previous
    snapshot, and the next tick tries again: a watch outlives a Redis restart.
    """
    previous: FleetSnapshot | None = None
    start = trio.current_time()
    while True:
        try:
            snapshot = await take_snapshot(app)
        except StreamkitError as exc:
            yield FleetSample(snapshot=previous, rates=NO_RATES, error=str(exc))
        else:
            yield FleetSample(snapshot=snapshot, rates=fleet_rates(previous, snapshot))
            previous = snapshot
        await trio.sleep_until(next_tick(start, interval, trio.current_time()))


def worker_names(members: Iterable[MemberStatus]) -> dict[str, str]:
    """Member id, and lease owner ``host:pid``, -> the name shown for that worker."""
    members = list(members)
    names = {m.id: m.name for m in members}
    names.update({f"{m.host}:{m.pid}": m.name for m in members if m.host})
    return names


def partition_worker(row: PartitionStatus, names: dict[str, str]) -> str:
    """Who processes a partition: the lease holder, and where it moves if it does."""
    holder = (
        names.get(lease_owner_name(row.owner), lease_owner_name(row.owner)) if row.owner else None
    )
    assigned = names.get(row.assigned_to, row.assigned_to) if row.assigned_to else None
    if holder and assigned and holder != assigned:
        return f"{holder} → {assigned}"
    if holder:
        return holder
    if assigned:
        return f"waits for {assigned}"
    return "-"


def counts_by_name(counts: QueueCounts, declared: Iterable[str]) -> dict[str, dict[str, int]]:
    """Job name -> count name -> jobs, every count present; declared jobs included."""
    names = sorted({*counts.by_name, *declared})
    result: dict[str, dict[str, int]] = {}
    for name in names:
        per_status = counts.by_name.get(name, {})
        result[name] = {count: per_status.get(status, 0) for status, count in COUNT_NAMES.items()}
    return result


def counts_json(counts: QueueCounts) -> dict[str, Any]:
    """A queue's counts by status (``queued`` by priority), as JSON."""
    return {
        "queued": dict(counts.queued),
        "scheduled": counts.scheduled,
        "waiting": counts.waiting,
        "running": counts.running,
        "retrying": counts.retrying,
        "held": counts.held,
        "dead": counts.dead,
        "succeeded": counts.succeeded,
        "aborted": counts.aborted,
        "expired": counts.expired,
        "pending": counts.pending,
    }


def iso(moment: datetime | None, timespec: str = "seconds") -> str | None:
    return moment.isoformat(timespec=timespec) if moment is not None else None


#: How a try ended, as a job's history says it.
TRY_OUTCOMES = {
    "success": "succeeded",
    "retry": "failed; tried again",
    "dead": "failed; no try left",
    "aborted": "aborted",
    "released": "put back when its worker stopped (not spent)",
    "lost": "lost: its worker died",
}


def job_history(info: JobInfo) -> list[tuple[datetime | None, str]]:
    """A job's life so far, oldest first (pure): enqueued, due, each try's start
    and end (from :attr:`~streamkit.jobs.JobInfo.history`), and how it ended.

    A record written before tries were kept has no history of tries: its last try
    is told from the record's times. An event without a time has ``None``.
    """
    events: list[tuple[datetime | None, str]] = []
    if info.enqueued_at is not None:
        events.append((info.enqueued_at, f"enqueued ({info.priority} priority)"))
    if info.due_at is not None:
        events.append((info.due_at, "due (delayed until then)"))
    if info.replayed_at is not None:
        events.append((info.replayed_at, "replayed from the dead letters (tries begin again)"))
    tries = info.history
    if not tries and info.started_at is not None:
        tries = (JobTry(number=info.tries, started_at=info.started_at, worker=info.worker),)
    for attempt in tries:
        of = f"try {attempt.number} of {info.max_tries}"
        if attempt.started_at is not None:
            where = f" on {attempt.worker}" if attempt.worker else ""
            events.append((attempt.started_at, f"{of} started{where}"))
        if attempt.outcome is not None:
            how = TRY_OUTCOMES.get(attempt.outcome, attempt.outcome)
            error = f" ({attempt.error_type})" if attempt.error_type else ""
            events.append((attempt.ended_at, f"{of} {how}{error}"))
    error = f": {info.error.type}: {info.error.message}" if info.error is not None else ""
    if info.finished_at is not None:
        ended = error if info.status is not JobStatus.SUCCESS else ""
        events.append((info.finished_at, f"ended {info.status.value}{ended}"))
    elif info.status is JobStatus.RETRY and not info.history:
        events.append((None, f"try {info.tries} failed{error}; waiting for the next try"))
    elif info.status is JobStatus.RETRY:
        events.append((None, f"waiting for try {info.tries + 1}{error}"))
    timed = sorted(
        [(at, what) for at, what in events if at is not None], key=lambda event: event[0]
    )
    return [*timed, *((at, what) for at, what in events if at is None)]


def job_json(info: JobInfo) -> dict[str, Any]:
    """What a queue knows of one job, as JSON (``jobs show --json``, ``/api/jobs/ID``):
    its tries (``history``) and, in words, its ``timeline`` (see :func:`job_history`)."""
    data = attrs.asdict(info)
    for field in (
        "enqueued_at",
        "due_at",
        "started_at",
        "finished_at",
        "expires_at",
        "replayed_at",
    ):
        data[field] = iso(data[field], "milliseconds")
    data["status"] = info.status.value
    data["history"] = [
        {
            **attrs.asdict(attempt),
            "started_at": iso(attempt.started_at, "milliseconds"),
            "ended_at": iso(attempt.ended_at, "milliseconds"),
        }
        for attempt in info.history
    ]
    data["timeline"] = [
        {"at": iso(at, "milliseconds"), "text": what} for at, what in job_history(info)
    ]
    return data


def _rate(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def fleet_json(snapshot: FleetSnapshot, rates: FleetRates = NO_RATES) -> dict[str, Any]:
    """The snapshot (and the rates, events/s) as JSON: what ``--json`` and
    ``/api/status`` print."""
    processors = []
    for processor in snapshot.processors:
        names = worker_names(processor.members)
        processors.append(
            {
                "processor": processor.name,
                "stream": processor.stream,
                "lag": processor.lag,
                "pending": processor.pending,
                "late": processor.late if processor.windows else None,
                "rate": _rate(rates.processors.get(processor.name)),
                "data_loss": None
                if processor.data_loss is None
                else {
                    "at": iso(processor.data_loss.at),
                    "what": processor.data_loss.what,
                    "worker": processor.data_loss.by,
                },
                "last_reset": None
                if processor.last_reset is None
                else {
                    "at": iso(processor.last_reset.at),
                    "where": processor.last_reset.where,
                    "partitions": processor.last_reset.partitions,
                    "state": processor.last_reset.state,
                    "gone": processor.last_reset.gone,
                },
                "workers": [
                    {**attrs.asdict(m), "joined_at": iso(m.joined_at)} for m in processor.members
                ],
                "partitions": [
                    {
                        "partition": row.partition,
                        "worker": names.get(lease_owner_name(row.owner)) if row.owner else None,
                        "shown_as": partition_worker(row, names),
                        "lease_owner": row.owner,
                        "assigned_to": names.get(row.assigned_to) if row.assigned_to else None,
                        "assigned_member_id": row.assigned_to,
                        "entries": row.length,
                        "lag": row.lag,
                        "pending": row.pending,
                        "entries_read": row.entries_read,
                        "reads_after": row.reads_after,
                        "tables": dict(row.tables),
                        "late": dict(row.late),
                        "buffered": dict(row.buffered),
                        "rate": _rate(rates.partitions.get((processor.name, row.partition))),
                        "last_event_at": iso(row.last_event_at),
                        "halted": None
                        if row.halted is None
                        else {
                            "error_type": row.halted.error_type,
                            "error": row.halted.error,
                            "entry_ids": list(row.halted.entry_ids),
                            "since": iso(row.halted.since),
                            "worker": row.halted.worker,
                        },
                    }
                    for row in processor.partitions
                ],
            }
        )
    jobs = None
    if snapshot.jobs is not None:
        queue = snapshot.jobs
        jobs = {
            "queue": queue.name,
            "shards": queue.shards,
            "counts": counts_json(queue.counts),
            "by_name": counts_by_name(queue.counts, queue.declared),
            "rate": _rate(rates.jobs),
        }
    return {
        "app": snapshot.app,
        "redis_url": snapshot.redis_url,
        "taken_at": iso(snapshot.taken_at, "milliseconds"),
        "interval": round(rates.seconds, 3) if rates.seconds else None,
        "processors": processors,
        "jobs": jobs,
    }
