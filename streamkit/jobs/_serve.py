"""The worker side of a job queue: a :class:`JobWorker` and its task tree.

Task tree of ``serve_jobs`` (one nursery)::

    serve
    ├── claimer (one per shard)      claim script / blocking read -> the handoff
    ├── dispatcher                   wakes idle runners for jobs left waiting in the
    │                                handoff (see jobs/_handoff.py)
    ├── finisher (one per shard)     fenced finish script for the outcomes of ended tries
    ├── settler (one per shard)      settles the dependents of ended jobs left over by the
    │                                scripts that ended them, a bounded number per call
    ├── renewer                      extends the leases of running jobs; cancels the
    │                                tries that were aborted or taken over
    ├── try runners (concurrency)    run one try each at a time, in a cancel scope
    └── schedules                    enqueues each tick of the declared and the runtime
                                     schedules with a job id per tick (one task per
                                     schedule), following the runtime changes

Cancelling the nursery is a graceful stop: the tries running then are put back on the
queue without spending a try, in a shielded clean-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import ConfigError, RedisUnavailable
from .._logs import log_context
from .._meter import JobMeter
from .._nurseries import open_service_nursery
from .._redis import health_of
from ._claim import Claimer, ensure_groups, new_consumer
from ._cron import run_schedules
from ._drain import drain, put_back
from ._finish import Outbox, Settler, emit_relay_for, renew_leases
from ._handle import Job
from ._handoff import Handoff
from ._model import JobOptions
from ._progress import ProgressWriter
from ._run import TryRunner
from ._streaming import ChunkWriter
from ._threads import Threads
from ._tries import Tries

if TYPE_CHECKING:
    from ._handle import QueueLike

__all__ = ["Handlers", "JobWorker", "serve_jobs"]

log = logging.getLogger("streamkit.jobs")

Handlers = Iterable[Job[Any, Any]] | Mapping[str, Callable[..., Any]]

#: Seconds a stop's clean-up (recording outcomes, putting running jobs back) may take
#: (it runs shielded; see docs/jobs.md, "Stopping a worker").
PUT_BACK_WITHIN = 5.0
#: Seconds a lifespan's shut-down code may take at a stop (it runs shielded).
LIFESPAN_SHUTDOWN = 10.0


def _as_jobs(queue: QueueLike, handlers: Handlers | None) -> dict[str, Job[Any, Any]]:
    if handlers is None:
        return dict(queue.jobs)
    if isinstance(handlers, Mapping):
        return {
            name: fn if isinstance(fn, Job) else Job(name, fn, JobOptions(), None, lambda: queue)
            for name, fn in handlers.items()
        }
    return {job.name: job for job in handlers}


@attrs.define(eq=False)
class JobWorker:
    """A running worker of a job queue: what ``await nursery.start(queue.serve)``
    returns.

    Attributes:
        consumer: its name in the queue (host, pid and a random part), shown as the
            ``worker`` of the jobs it runs.
        concurrency: jobs it runs at once.
    """

    queue: QueueLike
    jobs: dict[str, Job[Any, Any]]
    concurrency: int
    threads: int
    consumer: str = attrs.field(factory=new_consumer)
    #: What the worker's lifespan yielded: :attr:`JobContext.state` of its jobs.
    state: Any = None
    # Tries ended, by job and outcome, and their durations (streamkit.metrics).
    _meter: JobMeter = attrs.field(factory=JobMeter)
    _tries: Tries = attrs.field(init=False)
    _outbox: Outbox = attrs.field(init=False)
    _settler: Settler = attrs.field(init=False)
    _claimer: Claimer = attrs.field(init=False)
    _runner: TryRunner = attrs.field(init=False)
    _handoff: Handoff = attrs.field(init=False, factory=Handoff)
    _threads: Threads = attrs.field(init=False)
    _progress: ProgressWriter = attrs.field(init=False)
    _chunks: ChunkWriter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._tries = Tries(self.concurrency)
        self._settler = Settler(self.queue)
        self._outbox = Outbox(
            self.queue,
            self._tries,
            self._meter,
            self._settler,
            emit_relay=emit_relay_for(self.queue),
        )
        self._threads = Threads(
            trio.CapacityLimiter(self.threads),
            frozenset(name.encode() for name, job in self.jobs.items() if not job.is_async),
        )
        self._claimer = Claimer(
            self.queue,
            self.consumer,
            self._tries,
            self._handoff,
            self._settler.wake,
            threads=self._threads,
        )
        self._progress = ProgressWriter(self.queue)
        self._chunks = ChunkWriter(self.queue)
        self._runner = TryRunner(
            self.queue,
            self.jobs,
            self._tries,
            self._outbox,
            self._threads,
            consumer=self.consumer,
            middleware=tuple(self.queue.middleware),
            state=self.state,
            progress_writer=self._progress,
            chunk_writer=self._chunks,
        )

    @property
    def running_jobs(self) -> int:
        """Jobs claimed by this worker and not over yet."""
        return self._tries.held

    @property
    def progress_writes(self) -> int:
        """Progress writes this worker sent (``current_job().progress`` is written at
        most every half second per try)."""
        return self._progress.writes

    async def drain(self, grace: float | None = None) -> bool:
        """Stop taking jobs and wait, up to ``grace`` seconds (``None``: as long as
        it takes), for the running ones to end and their outcomes to be recorded.

        Cancelling :meth:`JobQueue.serve` afterwards puts back the jobs still
        running then, without spending a try.

        Returns:
            whether every running job ended within ``grace`` and had its outcome
            recorded (Redis may be unreachable meanwhile: the wait for the outcomes
            ends with the grace too).
        """
        return await drain(self._claimer, self._tries, self._outbox, grace)

    async def run(self, *, task_status: trio.TaskStatus[JobWorker]) -> None:
        """Run the task tree (see the module) until cancelled, then put back the
        tries still running."""
        for shard in range(self.queue.shards):
            await ensure_groups(self.queue, shard)
        try:
            with log_context(queue=self.queue.name):
                log.debug("serving queue %s as consumer %s", self.queue.name, self.consumer)
                log.info(
                    "serving jobs of queue %s: %s (concurrency %d)",
                    self.queue.name,
                    ", ".join(sorted(self.jobs)),
                    self.concurrency,
                )
                async with open_service_nursery(reason="job worker stopping") as nursery:
                    for _ in range(self.concurrency):
                        nursery.start_soon(self._runner.run, self._handoff)
                    nursery.start_soon(self._handoff.dispatch)
                    nursery.start_soon(self._progress.run)
                    nursery.start_soon(self._chunks.run)
                    nursery.start_soon(renew_leases, self.queue, self.consumer, self._tries)
                    for shard in range(self.queue.shards):
                        nursery.start_soon(self._outbox.finisher, shard)
                        nursery.start_soon(self._settler.settler, shard)
                        nursery.start_soon(self._claimer.run, shard)
                        if self._outbox.emit_relay is not None:
                            nursery.start_soon(self._outbox.emit_relay.relayer, shard)
                    nursery.start_soon(run_schedules, self.queue, self.jobs)
                    task_status.started(self)
                    await trio.sleep_forever()
        finally:
            await self._put_back()

    async def _put_back(self) -> None:
        """The stop's clean-up: record the ended tries' outcomes and put the running
        ones back, shielded, for at most :data:`PUT_BACK_WITHIN` seconds. If Redis
        cannot be reached (or does not answer) meanwhile, say so once: those jobs are
        run again once their leases run out."""
        subject = health_of(self.queue.redis).outage.subject
        failure = f"{subject} did not answer within {PUT_BACK_WITHIN:g}s"
        with trio.CancelScope(shield=True), trio.move_on_after(PUT_BACK_WITHIN):
            try:
                await put_back(self.queue, self.consumer, self._tries, self._outbox)
            except RedisUnavailable as exc:
                failure = str(exc)
            else:
                return
        unrecorded = len(self._tries.running)
        what = (
            f"the outcomes of {unrecorded} job(s) in flight were not recorded: they are run"
            if unrecorded
            else "the jobs claimed and not started are not handed back: they are taken"
        )
        log.warning(
            "stopping: %s; %s again (by another worker, or this one restarted) once their "
            "leases run out, within %gs",
            failure,
            what,
            self.queue.lease_ttl,
        )

    def __repr__(self) -> str:
        return (
            f"<JobWorker {self.consumer} queue={self.queue.name} "
            f"running={self.running_jobs}/{self.concurrency}>"
        )


async def serve_jobs(
    queue: QueueLike,
    handlers: Handlers | None,
    *,
    concurrency: int,
    threads: int,
    state: Any = None,
    task_status: trio.TaskStatus[JobWorker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``queue``'s jobs until cancelled (see :meth:`QueueLike.serve`), inside the
    queue's lifespan if it has one (its yielded value is the jobs' state; ``state`` is
    theirs otherwise)."""
    if concurrency < 1:
        raise ConfigError("concurrency", f"must be a positive integer, got {concurrency!r}")
    jobs = _as_jobs(queue, handlers)
    if not jobs:
        raise ConfigError("handlers", f"queue {queue.name!r} has no jobs to run")
    if queue.lifespan is None:
        await JobWorker(queue, jobs, concurrency, threads, state=state).run(task_status=task_status)
        return
    lifespan = queue.lifespan()
    state = await lifespan.__aenter__()
    try:
        await JobWorker(queue, jobs, concurrency, threads, state=state).run(task_status=task_status)
    finally:
        # A stop is a cancellation: the shut-down code runs as after a normal end,
        # shielded from it, for a bounded time.
        with trio.CancelScope(shield=True), trio.move_on_after(LIFESPAN_SHUTDOWN) as limit:
            await lifespan.__aexit__(None, None, None)
        if limit.cancelled_caught:
            log.warning("stopping: the lifespan's shut-down took over %gs", LIFESPAN_SHUTDOWN)
