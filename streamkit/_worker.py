"""The worker: runs an app's processors and background tasks as one task tree.

::

    worker nursery
    ├── leadership            on_leader tasks run while this worker holds the leader lease
    ├── background tasks      task / timer / crontab
    └── executor (one per processor)
        ├── membership        join, heartbeat, reap, watch -> AsyncValue of partitions
        ├── fetcher           one read loop for all owned partitions -> bounded buffers
        └── rebalancer        one cancel scope per owned partition: lease + processor

Why one room (about 610 lines): the worker's task tree, its signals and its watchdog,
as the tree above shows; each branch is a piece of its own.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import os
import signal
import sys
import threading
import time
import uuid
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import attrs
import trio
import trio_util

from . import _keys
from ._background import run_background_task
from ._data_loss import DataLossWatch, watch_data_loss
from ._errors import ConfigError, ProcessorHalted
from ._fetcher import open_fetcher
from ._halts import HaltRecord, read_halt, wait_resumed, write_halt
from ._http_access import check_token
from ._leadership import open_leader_election
from ._locks import LockManager, open_lock_manager
from ._logs import line_for_signal_handler, log_context, worker_name
from ._membership import Membership, open_membership
from ._policies import run_processor
from ._rebalancer import Claim, Rebalancer, open_rebalancer
from ._redis import retry_idempotent, ride_out_refusals
from ._signals import signal_handlers
from ._validate import positive_finite_number
from .jobs._layout import DEFAULT_QUEUE

if TYPE_CHECKING:
    from ._fetcher import Fetcher

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from types import FrameType

    from ._app import App, Processor
    from .jobs import JobWorker

__all__ = ["Executor", "Worker", "run_worker"]

log = logging.getLogger("streamkit.worker")

#: How long the event loop may go without running before the watchdog warns (s).
DEFAULT_BLOCKED_WARNING = 2.0


@attrs.define(eq=False)
class Executor:
    """One processor running in a worker: its membership and rebalancer.

    Attributes:
        halted: ``trio_util.AsyncValue`` of a read-only mapping from each partition
            this worker owns and leaves halted to its halt record.
    """

    processor: Processor
    membership: Membership
    rebalancer: Rebalancer
    halted: trio_util.AsyncValue[Mapping[int, HaltRecord]] = attrs.field(
        factory=lambda: trio_util.AsyncValue(MappingProxyType({}))
    )
    #: The fetcher reading the processor's partitions.
    fetcher: Fetcher[Any] | None = attrs.field(default=None, repr=False)

    def _set_halted(self, partition: int, record: HaltRecord | None) -> None:
        halted = dict(self.halted.value)
        if record is None:
            halted.pop(partition, None)
        else:
            halted[partition] = record
        self.halted.value = MappingProxyType(halted)

    def __repr__(self) -> str:
        return f"<Executor {self.processor.name} member={self.membership.id} {self.rebalancer!r}>"


@attrs.define(eq=False)
class Worker:
    """A running worker, as handed to ``task_status.started()`` by :func:`run_worker`.

    Attributes:
        app: the app it runs.
        executors: one per processor it runs.
        metrics_url: the URL of its Prometheus metrics endpoint, if it serves one (see
            the ``metrics_port`` setting and :doc:`observability`).
    """

    app: App
    executors: list[Executor] = attrs.field(factory=list)
    #: The worker of the app's default job queue, if it serves it.
    jobs: JobWorker | None = None
    #: The workers of the app's job queues it serves, by queue (``"default"``: the one
    #: named after the app).
    job_workers: dict[str, JobWorker] = attrs.field(factory=dict)
    metrics_url: str | None = None
    #: What the worker found vanished under it (data losses per processor).
    data_loss: DataLossWatch | None = None
    _cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _stopping: bool = attrs.field(default=False)
    # Connecting to Redis; cancelled by a signal that arrives before the worker runs.
    _starting: trio.CancelScope = attrs.field(init=False, factory=trio.CancelScope)
    # The worker's nursery while it runs (None before and after).
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)
    _phase: Literal["starting", "running", "stopped"] = attrs.field(init=False, default="starting")

    async def stop(self, *, grace: float | None = None) -> None:
        """Stop gracefully: let every partition finish and acknowledge its current
        event and every running job end (up to ``grace`` seconds, the
        ``grace_period`` setting by default), release the leases, leave the groups,
        put back the jobs still running, and end :func:`run_worker`."""
        if self._stopping:
            return
        self._stopping = True
        log.debug("stopping: draining %d processor(s)", len(self.executors))
        try:
            async with trio.open_nursery() as nursery:
                for executor in self.executors:
                    with log_context(
                        processor=executor.processor.name, member=executor.membership.id
                    ):
                        nursery.start_soon(executor.rebalancer.drain, grace)
                for job_worker in self.job_workers.values():
                    nursery.start_soon(
                        job_worker.drain, self.app.settings.grace_period if grace is None else grace
                    )
        finally:
            # Whatever the drains met, the stop goes on: the clean-up that follows is
            # shielded and time-limited.
            self._cancel_scope.cancel("worker stopped")

    @property
    def stop_requested(self) -> bool:
        """Whether a stop was asked for (:meth:`stop`, or a signal with
        ``handle_signals``): after :func:`run_worker` returns, ``False`` means the
        worker ended on its own, which a supervisor should treat as a failure."""
        return self._stopping

    def stop_now(self) -> None:
        """Stop at once: cancel everything (leases are still released, shielded)."""
        self._cancel_scope.cancel("worker stopped at once")

    def _on_first_signal(self, signum: int) -> None:
        """Act on the first SIGINT / SIGTERM (called in the Trio thread)."""
        name = signal.Signals(signum).name
        if self._nursery is not None:
            log.info("%s: stopping gracefully (again: exit at once)", name)
            self._nursery.start_soon(self.stop)
        elif self._phase == "starting":
            # Still connecting: there is nothing to drain yet.
            log.info("%s: stopping before the worker started", name)
            self._stopping = True
            self._starting.cancel(f"{name} while starting")
        # Otherwise the worker has stopped already and is only cleaning up.


def select_queues(app: App, names: Sequence[str] | None) -> list[str]:
    """The app's job queues to serve: all that have jobs, or those named.

    Error handling:
        :class:`ConfigError` naming an unknown queue and listing the known ones.
    """
    known = app.queue_names()
    if not names:
        return known
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ConfigError(
            "queues", f"unknown job queue {unknown[0]!r} (known: {', '.join(known) or 'none'})"
        )
    return list(dict.fromkeys(names))


def select_processors(app: App, names: Sequence[str] | None) -> list[Processor]:
    """The processors to run: all of the app's, or those named.

    Error handling:
        :class:`ConfigError` naming an unknown processor and listing the known ones.
    """
    if not names:
        return list(app.processors.values())
    unknown = [name for name in names if name not in app.processors]
    if unknown:
        known = ", ".join(app.processors) or "none"
        raise ConfigError("processors", f"unknown processor {unknown[0]!r} (known: {known})")
    return [app.processors[name] for name in names]


async def run_worker(
    app: App,
    *,
    processors: Sequence[str] | None = None,
    handle_signals: bool = False,
    blocked_warning: float | None = DEFAULT_BLOCKED_WARNING,
    concurrency: int | None = None,
    queues: Sequence[str] | None = None,
    task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``app``'s processors and background tasks until stopped.

    With ``handle_signals``, SIGINT and SIGTERM stop the worker gracefully (see
    :meth:`Worker.stop`; while it is still connecting or starting its processors and
    queues, it simply stops, and ``nursery.start()`` gets the worker with
    :attr:`Worker.stop_requested` set), and a second signal, at any time after the
    first, exits the process at once with code 128 + the signal number (130 for
    SIGINT, 143 for SIGTERM), even while synchronous code blocks the event loop.
    Signal handling needs the main thread.

    A watchdog thread warns when the event loop has not run for ``blocked_warning``
    seconds (``None``: no watchdog), naming the processor and partition whose
    synchronous code blocks it: while it is blocked, no lease is renewed and no
    heartbeat sent, so the worker's partitions move away.

    With the ``metrics_port`` setting, the worker serves its Prometheus metrics
    there (:attr:`Worker.metrics_url`; needs the ``metrics`` extra); a port that
    cannot be bound is a :class:`ConfigError`.

    The app's jobs run too, ``concurrency`` at once per queue
    (``settings.job_concurrency`` by default), from the app's job queues named in
    ``queues`` (``"default"`` for the one named after the app; all of them by default).
    A graceful stop takes no more jobs and gives the running ones the grace period (or
    their own ``grace``) to end; those still running then are put back on the queue
    without spending a try. Each queue's worker runs inside the app's
    :meth:`~App.lifespan`, if it has one.

    Cancellation:
        Cancelling stops everything at once; leases are released and the groups left
        (shielded, time-limited), so other workers take over without waiting.

    Error handling:
        :class:`ConfigError` for unknown processors; :class:`RedisUnavailable` when
        Redis stays unreachable for ``connect_give_up_after`` seconds at start (once
        reached, an outage is ridden out, while the processors start too). A
        processor's policy halting stops that partition only (see
        :doc:`policies`): the worker keeps running.
    """
    selected = select_processors(app, processors)
    served = select_queues(app, queues)
    if blocked_warning is not None:
        positive_finite_number.check("blocked_warning", blocked_warning)
    worker = Worker(app)
    started = False
    with (
        _young_collections_spaced(),
        _watch_event_loop(blocked_warning) as watchdog,
        _stop_on_signals(worker, watchdog) if handle_signals else contextlib.nullcontext(),
        worker._starting,  # cancelled only by a signal that arrives while connecting
    ):
        async with app, open_lock_manager(app.redis) as locks:
            with worker._cancel_scope:
                try:
                    async with trio.open_nursery() as nursery:
                        worker._nursery = nursery
                        worker._phase = "running"
                        if selected:  # (it watches processors, and lives as long)
                            worker.data_loss = await nursery.start(
                                watch_data_loss, app, selected, worker_name()
                            )
                        if app.settings.metrics_port is not None:
                            worker.metrics_url = await nursery.start(_serve_metrics, worker)
                        for processor in selected:
                            executor: Executor = await nursery.start(
                                _run_executor, app, processor, locks
                            )
                            worker.executors.append(executor)
                        for queue in served:
                            worker.job_workers[queue] = await nursery.start(
                                functools.partial(
                                    app.job_queues[queue].serve,
                                    concurrency=concurrency or app.settings.job_concurrency,
                                    threads=app.settings.job_threads,
                                )
                            )
                        worker.jobs = worker.job_workers.get(DEFAULT_QUEUE)
                        if app.background:
                            await nursery.start(_run_background, app, locks)
                        log.info(
                            "worker of %s running %s",
                            app.name,
                            ", ".join(
                                [p.name for p in selected]
                                + [
                                    f"{n} job{'s' if n > 1 else ''}"
                                    + ("" if q == DEFAULT_QUEUE else f" of queue {q}")
                                    for q in served
                                    for n in [len(app.job_queues[q].jobs)]
                                ]
                            )
                            or "no processors",
                        )
                        # Everything allocated so far (modules, the app, the pieces)
                        # lives as long as the worker: keep it out of the cyclic
                        # collector's full passes, which otherwise stall every
                        # partition for tens of milliseconds on a big heap.
                        gc.freeze()
                        task_status.started(worker)
                        started = True
                finally:
                    worker._nursery = None
                    worker._phase = "stopped"
    if not started:
        # Stopped while connecting, or while its processors and queues started (a
        # signal, Worker.stop: an exception would have propagated).
        log.info("worker of %s stopped before it started", app.name)
        # nursery.start() gets the worker (with stop_requested set) rather than a
        # RuntimeError for a task that never started: the stop was asked for.
        task_status.started(worker)
        return
    log.info("worker of %s stopped%s", app.name, " cleanly" if worker._stopping else "")


#: The signals that stop a worker run with ``handle_signals``.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


_LIBRARY_DIRS = tuple(
    os.path.dirname(path) + os.sep
    for path in (trio.__file__, attrs.__file__, contextlib.__file__, __file__)
    if path is not None
)


def _blocking_site(frame: FrameType | None) -> str:
    """Name what runs in ``frame`` (a stack of the Trio thread): the processor and
    partition under :func:`run_processor`, and the innermost line of the user's code."""
    user: FrameType | None = None
    where = ""
    while frame is not None:
        code = frame.f_code
        if code is run_processor.__code__:
            feed: Any = frame.f_locals.get("feed")
            keys = getattr(feed, "keys", None)
            if keys is not None:
                where = f"processor {keys.processor!r} on {keys.stream} partition {feed.partition}"
            break
        if user is None and not code.co_filename.startswith(_LIBRARY_DIRS):
            user = frame
        frame = frame.f_back
    if user is not None:
        line = f"{user.f_code.co_filename}:{user.f_lineno} in {user.f_code.co_name}"
        where = f"{where} ({line})" if where else line
    return where or "unknown code"


@attrs.define(eq=False)
class _Watchdog:
    """A thread that notices when the Trio event loop stops running.

    Every ``period`` it asks the loop (``run_sync_soon``) to note the time; when
    the last note is older than ``threshold``, something synchronous holds the loop.
    """

    threshold: float
    _token: trio.lowlevel.TrioToken
    _thread_id: int
    _last_beat: float = attrs.field(factory=time.monotonic)
    _stop: threading.Event = attrs.field(factory=threading.Event)

    def stalled_for(self) -> float:
        """Seconds since the event loop last ran (about 0 while it runs)."""
        return time.monotonic() - self._last_beat

    def _beat(self) -> None:
        self._last_beat = time.monotonic()

    def run(self) -> None:
        period = min(0.25, self.threshold / 4)
        blocked = False
        while not self._stop.wait(period):
            try:
                self._token.run_sync_soon(self._beat)
            except trio.RunFinishedError:
                return
            stalled = self.stalled_for()
            if stalled > self.threshold and not blocked:
                blocked = True
                frame = sys._current_frames().get(self._thread_id)
                log.warning(
                    "the event loop has been blocked for %.1fs by %s: synchronous code "
                    "stops every partition, heartbeat and lease renewal of this worker, "
                    "so its leases lapse; run it with `await trio.to_thread.run_sync(...)`",
                    stalled,
                    _blocking_site(frame),
                )
            elif blocked and stalled <= period * 2:
                blocked = False
                log.warning("the event loop runs again")


#: While a worker runs, the cyclic collector's young generation is collected every
#: this many allocations (Python's default: 700). A processor allocates a few objects
#: per event, most of them kept until its batch is committed (a join's buffers, a
#: table's values): the count then climbs by tens of thousands a batch (a join's batch
#: is 8,000 events), and a threshold below that collects every batch, several times,
#: scanning all it holds. At 700 the collector cost a join 15% of its time, at 10,000
#: 6% (121 collections of 1.4 ms in the bench's run), at 50,000 about 1% (12)
#: (docs/performance.md). Garbage cycles wait a little longer to be freed.
YOUNG_COLLECTION_EVERY = 50_000
#: Workers running in this process (the collector is tuned while any does).
_tuned: list[tuple[int, int, int]] = []


@contextlib.contextmanager
def _young_collections_spaced() -> Iterator[None]:
    """Space the collector's young collections (:data:`YOUNG_COLLECTION_EVERY`) while
    the block runs, unless they are spaced further already; the first of overlapping
    blocks sets the thresholds and the last puts back what it found."""
    if not _tuned:
        found = gc.get_threshold()
        gc.set_threshold(max(found[0], YOUNG_COLLECTION_EVERY), *found[1:])
        _tuned.append(found)
    else:
        _tuned.append(_tuned[0])
    try:
        yield
    finally:
        found = _tuned.pop()
        if not _tuned:
            gc.set_threshold(*found)


@contextlib.contextmanager
def _watch_event_loop(threshold: float | None) -> Iterator[_Watchdog | None]:
    if threshold is None:
        yield None
        return
    watchdog = _Watchdog(threshold, trio.lowlevel.current_trio_token(), threading.get_ident())
    thread = threading.Thread(target=watchdog.run, name="streamkit watchdog", daemon=True)
    thread.start()
    try:
        yield watchdog
    finally:
        watchdog._stop.set()
        thread.join(1.0)


@contextlib.contextmanager
def _stop_on_signals(worker: Worker, watchdog: _Watchdog | None = None) -> Iterator[None]:
    """While the block runs, the first SIGINT or SIGTERM stops ``worker`` gracefully
    and a second one exits the process at once, with code 128 + the signal number.

    These are plain Python signal handlers, in place from before the worker connects
    until after its last cleanup: each runs in the main thread the moment its signal
    arrives, so whether a signal is the first or the second is decided then, whatever
    the worker is doing. (A Trio signal receiver would count signals only as a task
    reads them, and give them back to the previous handlers, Python's
    ``KeyboardInterrupt`` for SIGINT, once it is closed.)
    """
    token = trio.lowlevel.current_trio_token()
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        if received:
            _exit_at_once(signum)
        received.append(signum)
        token.run_sync_soon(worker._on_first_signal, signum)
        if watchdog is not None and watchdog.stalled_for() > min(1.0, watchdog.threshold):
            # The loop is blocked (this handler runs in between, in the main thread):
            # say now that the signal was received, in one raw write.
            name = signal.Signals(signum).name
            message = (
                f"streamkit worker: {name}: stopping once the event loop runs again "
                f"(blocked by {_blocking_site(frame)}); send {name} again to exit at once"
            )
            with contextlib.suppress(OSError):
                os.write(2, line_for_signal_handler(message, logger=log.name))

    with signal_handlers(STOP_SIGNALS, handle):
        yield


def _exit_at_once(signum: int) -> NoReturn:
    # The second signal must not wait for anything, not even the shielded lease
    # releases: leases expire by themselves. Nothing here may block or take a lock the
    # interrupted main thread could hold (the logging module's, say): one raw write.
    message = f"streamkit worker: {signal.Signals(signum).name} again: exiting at once"
    with contextlib.suppress(OSError):
        os.write(2, line_for_signal_handler(message, logger=log.name))
    os._exit(128 + signum)


async def _run_executor(
    app: App,
    processor: Processor,
    locks: LockManager,
    *,
    task_status: trio.TaskStatus[Executor] = trio.TASK_STATUS_IGNORED,
) -> None:
    settings = processor.settings
    # Chosen here rather than by open_membership, to be in the log context from the start.
    member_id = settings.member_id or uuid.uuid4().hex
    with log_context(processor=processor.name, member=member_id):
        stream = processor.stream
        keys = processor.keys
        # Refuse to consume a stream whose recorded layout differs from ours: reading
        # the wrong partition count would silently skip partitions.
        # Refused (Redis out of memory, say, for a new stream): wait, saying so, rather
        # than exit; nothing else would drain a full Redis. The worker reached Redis
        # already: an outage now (a restart while it starts its processors) is ridden
        # out as one while they run, not a reason to exit.
        what = f"recording stream {stream.name!r}"
        await retry_idempotent(
            functools.partial(ride_out_refusals, stream.check_metadata, what=what),
            what=what,
            give_up_after=math.inf,
        )

        async with (
            open_membership(
                app.redis,
                keys.group,
                partitions=stream.partition_count,
                member_id=member_id,
                static=settings.member_id is not None,
                heartbeat_interval=settings.heartbeat_interval,
                session_timeout=settings.session_timeout,
                static_grace=settings.static_grace,
                ride_out_outages=True,
            ) as membership,
            open_fetcher(
                app.redis,
                stream.spec,
                group=keys,
                batch_size=settings.batch_size,
                prefetch=settings.prefetch,
                trim_to=stream.settings.partition_size,
            ) as fetcher,
        ):
            executor: Executor | None = None

            async def run(claim: Claim) -> None:
                assert executor is not None
                await _run_partition(app, processor, executor, fetcher, claim)

            async with open_rebalancer(
                membership.partitions,
                locks,
                lock_name=keys.lock_name,
                run=run,
                lease_ttl=settings.lease_ttl,
                grace=settings.grace_period,
            ) as rebalancer:
                executor = Executor(processor, membership, rebalancer, fetcher=fetcher)
                task_status.started(executor)
                await trio.sleep_forever()


async def _serve_metrics(
    worker: Worker, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the worker's Prometheus metrics on the ``metrics_port`` setting."""
    settings = worker.app.settings
    assert settings.metrics_port is not None
    try:
        from .metrics import serve_metrics
    except ImportError as exc:
        raise ConfigError("metrics_port", str(exc)) from None
    check_token("metrics_token", settings.metrics_token)
    await serve_metrics(
        worker,
        host=settings.metrics_host,
        port=settings.metrics_port,
        refresh_interval=settings.metrics_refresh_interval,
        token=settings.metrics_token,
        task_status=task_status,
    )


#: The worker's name in halt records and logs: the host and process id.
WORKER_NAME = worker_name()


async def _run_partition(
    app: App, processor: Processor, executor: Executor, fetcher: Fetcher[Any], claim: Claim
) -> None:
    """Run the processor on one owned partition; a halt stops this partition only.

    The halt is a property of the partition, recorded in Redis: the lease is kept
    (the partition does not hop to another worker, to halt there too), and an owner
    that finds the record, this worker or the next one after a rebalance, waits
    until ``streamkit resume`` deletes it, then runs the processor again from the
    halted events (still pending: the feed reads them again first).
    """
    keys = processor.keys
    partition = claim.partition
    announced = False
    while True:
        record = await read_halt(app.redis, keys, partition)
        if record is not None:
            if not announced:
                log.warning(
                    "%s partition %d is %s; it stays halted (lease kept) until %s",
                    keys.group,
                    partition,
                    record.describe(),
                    _resume_command(app, processor, partition),
                )
            executor._set_halted(partition, record)
            try:
                resumed = await wait_resumed(app.redis, keys, partition, claim.draining)
            finally:
                executor._set_halted(partition, None)
            if not resumed:
                return  # moved away or stopping: the next owner finds the record
            announced = False
        try:
            async with fetcher.partition(partition, claim.held) as feed:
                await run_processor(
                    processor.fn,
                    feed,
                    processor.policy,
                    redis=app.redis,
                    draining=claim.draining,
                    middleware=processor.middleware,
                    ack_batch=processor.settings.batch_size,
                    tables=processor.tables,
                    outputs=processor.outputs,
                    jobs=processor.jobs,
                    state_cache_size=processor.settings.state_cache_size,
                    state_replicas=processor.settings.state_replicas,
                )
            return
        except ProcessorHalted as halted:
            # The policy logged the processor's exception with its traceback, as an
            # error: this says what follows, without repeating it.
            await write_halt(app.redis, keys, halted, worker=WORKER_NAME)
            log.warning(
                "%s partition %d halted: its events stay pending and it keeps its lease; "
                "the other partitions go on; fix the cause, then %s (--skip to skip the "
                "event)",
                keys.group,
                partition,
                _resume_command(app, processor, partition),
            )
            announced = True


def _resume_command(app: App, processor: Processor, partition: int) -> str:
    """The command that resumes ``processor`` on a halted ``partition``."""
    return f"`streamkit resume {_app_hint(app)} {processor.name} --partition {partition}`"


def _app_hint(app: App) -> str:
    """``MODULE:APP`` for the commands the worker suggests: where the app is a
    module's global (found only when a partition halts, so the search is cheap)."""
    for name, module in list(sys.modules.items()):
        if name == "__main__" or name.startswith(("streamkit", "_")):
            continue
        for attribute, value in list(getattr(module, "__dict__", {}).items()):
            if value is app:
                return f"{name}:{attribute}"
    return "MODULE:APP"


async def _run_background(
    app: App, locks: LockManager, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    everywhere = [task for task in app.background if not task.on_leader]
    on_leader = [task for task in app.background if task.on_leader]
    async with trio.open_nursery() as nursery:
        for task in everywhere:
            nursery.start_soon(run_background_task, task, name=f"background {task.name}")
        if on_leader:
            election: Any = await nursery.start(_campaign, app, locks)
            for task in on_leader:
                nursery.start_soon(
                    election.run_while_leader, run_background_task, task, name=f"leader {task.name}"
                )
        task_status.started()


async def _campaign(
    app: App, locks: LockManager, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
) -> None:
    async with open_leader_election(
        locks, _keys.leader_lock_name(app.name), ttl=app.settings.lease_ttl
    ) as election:
        task_status.started(election)
        await trio.sleep_forever()
