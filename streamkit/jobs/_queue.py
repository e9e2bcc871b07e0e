"""The job queue: declare jobs, enqueue them, follow them, manage the dead letters.

Why one room (about 740 lines, a third of them docstrings): :class:`JobQueue` is the
queue's public face, and each of its methods is a few lines that hand over to the
module doing the work (``_plan`` and ``_enqueue``, ``_cron``, ``_inspect``,
``_finish``, ``_serve``); only the waiting for results lives here.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import (
    Mapping,  # noqa: TC003 (isinstance)
)
from typing import TYPE_CHECKING, Any, Unpack, overload

import attrs
import trio

from .._backoff import Backoff
from .._defaults import DEFAULT_JOB_LEASE_TTL, DEFAULT_JOB_MAX_DELIVERIES
from .._errors import ConfigError, JobNotFound, RedisUnavailable
from .._keys import validate_name
from .._lua import script
from .._nurseries import open_service_nursery
from .._redis import (
    LuaScript,
    Redis,
    retry_idempotent,
    run_blocking,
)
from .._validate import positive_int, positive_number
from . import _scripts
from ._cron import (
    ScheduleInfo,
    check_expression,
    check_schedulable,
    cron_decorator,
    decode_schedule,
    read_schedules,
    remove_schedule as drop_schedule,
    set_schedule as store_schedule,
    timezone,
    wall_clock,
)
from ._crontime import next_tick
from ._enqueue import send_plan, send_workflow
from ._events import events_on, follow_events, set_events
from ._finish import settle_all
from ._handle import Job, JobDecorator, JobHandle, WorkflowHandle
from ._inspect import PURGE, REPLAY, QueueCounts, act_on_dead, count_jobs, read_dead_letters
from ._layout import ShardKeys, shard_for
from ._model import (
    DEFAULT_MAX_BYTES,
    JobCall,
    JobEvent,
    JobInfo,
    JobOptions,
    JobOptionsArgs,
    JobStatus,
    P,
    Priority,
    R,
    When,
)
from ._outcome import label
from ._plan import JobIds, Placement, encode_arguments, plan_enqueue
from ._replies import abort_reply, watch_reply
from ._serve import Handlers, JobWorker, serve_jobs
from ._workflow import Workflow, compile_workflow, plan_workflow

if TYPE_CHECKING:
    from collections.abc import (
        AsyncIterator,
        Callable,
        Coroutine,
        Iterable,
        Sequence,
    )
    from contextlib import AbstractAsyncContextManager

    from ._context import JobMiddleware
    from ._handle import QueueLike

__all__ = ["JobQueue", "QueueCounts", "open_job_queue"]

log = logging.getLogger("streamkit.jobs")

_ABORT = LuaScript(script("jobs/abort"))
_WATCH = LuaScript(script("jobs/watch"))
_CONTROL = LuaScript(script("jobs/control"))


@attrs.define(eq=False)
class _Waiters:
    """Result waiters of one shard, woken by one reader of the shard's completions."""

    keys: ShardKeys
    events: dict[str, list[trio.Event]] = attrs.field(factory=dict)
    started: bool = False
    lock: trio.Lock = attrs.field(factory=trio.Lock)

    def wake_all(self) -> None:
        for events in self.events.values():
            for event in events:
                event.set()

    async def run(self, redis: Redis, *, task_status: trio.TaskStatus[None]) -> None:
        last = await retry_idempotent(
            redis.xrevrange, self.keys.done, "+", "-", 1, what="reading job completions"
        )
        cursor = last[0].identifier if last else b"0-0"
        task_status.started()
        backoff = Backoff()
        while True:
            try:
                reply = await run_blocking(
                    redis,
                    lambda r, cursor=cursor: r.xread(  # type: ignore[misc]
                        {self.keys.done: cursor}, count=1000, block=5000
                    ),
                    within=10.0,
                    what="waiting for job results",
                )
            except RedisUnavailable as exc:
                log.warning("waiting for job results: %s; retrying", exc)
                await trio.sleep(next(iter(backoff.delays())))
                self.wake_all()  # re-check every waiter after the outage
                continue
            for entries in (reply or {}).values():
                for entry in entries:
                    cursor = entry.identifier
                    job_id = label(entry.field_values.get(b"id", b""))
                    for event in self.events.get(job_id, ()):
                        event.set()


@attrs.define(eq=False)
class JobQueue:
    """A job queue on Redis: jobs with results and statuses, delays, cron, retries,
    leases renewed while a job runs, dead letters, abort, dedupe and priorities.

    Get one from :func:`open_job_queue`. Declare jobs with :meth:`job` (or
    :meth:`cron`), enqueue them with the declared job's ``delay``/``enqueue``/
    ``enqueue_many``, and run them with ``await nursery.start(queue.serve)``.

    Attributes:
        redis: the client.
        name: the queue's name (namespaces its keys).
        shards: how many shards it is split into.
        lease_ttl: seconds after which a job whose worker stopped renewing its lease
            is taken over by another worker.
        max_deliveries: times a job may lose its worker before it goes dead.
        max_bytes: the largest encoded arguments, or result, of a job, in bytes.
        jobs: the declared jobs, by name.
    """

    redis: Redis
    name: str
    shards: int = attrs.field(default=1, validator=positive_int)
    lease_ttl: float = attrs.field(default=DEFAULT_JOB_LEASE_TTL, validator=positive_number)
    max_deliveries: int = attrs.field(default=DEFAULT_JOB_MAX_DELIVERIES, validator=positive_int)
    max_bytes: int = attrs.field(default=DEFAULT_MAX_BYTES, validator=positive_int)
    jobs: dict[str, Job[Any, Any]] = attrs.field(factory=dict)
    #: Run around each try of its jobs, outermost first (see :meth:`add_middleware`).
    middleware: list[JobMiddleware] = attrs.field(factory=list)
    #: Entered by each worker around its serving (see :meth:`set_lifespan`).
    lifespan: Callable[[], AbstractAsyncContextManager[Any]] | None = None
    shard_keys: list[ShardKeys] = attrs.field(init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _waiters: list[_Waiters] = attrs.field(init=False)
    # New job ids: a random prefix and a counter (a new prefix after fork).
    _new_id: JobIds = attrs.field(init=False, factory=JobIds)
    _placement: Placement = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._placement = Placement(self.shards, self._new_id, self.max_bytes)
        self.shard_keys = [ShardKeys(self.name, s) for s in range(self.shards)]
        self._waiters = [_Waiters(keys) for keys in self.shard_keys]

    # ------------------------------------------------------------------ declaring

    @overload
    def job(  # an async def matches the next one too: this one comes first
        self,
        fn: Callable[P, Coroutine[Any, Any, R]],
        *,
        name: str | None = None,
        **options: Unpack[JobOptionsArgs],
    ) -> Job[P, R]: ...

    @overload
    def job(
        self,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        **options: Unpack[JobOptionsArgs],
    ) -> Job[P, R]: ...

    @overload
    def job(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        **options: Unpack[JobOptionsArgs],
    ) -> JobDecorator: ...

    def job(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        **options: Unpack[JobOptionsArgs],
    ) -> Job[Any, Any] | Callable[[Callable[..., Any]], Job[Any, Any]]:
        """Declare ``fn`` (``async def`` or plain ``def``) as a job of this queue.

        Use as ``@queue.job`` or ``@queue.job(retries=3, timeout=30)``. Plain
        functions run in worker threads, at most ``threads`` at once per worker.

        Args:
            name: the job's name; the function's name by default.
            retries (int): tries after the first when a try fails (3).
            timeout (float | None): seconds a try may run; a try that runs longer is cancelled and
                counts as failed (and is retried if tries are left). No limit by default.
            retry_on (tuple[type[BaseException], ...]): the exception types that are retried; others
                go dead at once (``(Exception,)``).
            backoff (Backoff): delays between tries (exponential, with jitter; by default 1 s
                doubling up to 300 s, jittered by half).
            priority (str): the default priority: ``"high"``, ``"normal"`` (the default) or
                ``"low"``.
            result_ttl (float): seconds a finished job's record and result are kept (a day).
            keep_result (bool): whether its return value is stored (it must be JSON-serialisable);
                ``True`` by default.
            expires (float | None): seconds after enqueueing after which it ends ``expired`` unless
                it started.
            dedupe_window (float): seconds during which ``job_id=`` dedupes enqueues (a day; rounded
                up to whole seconds).
            rate_limit (RateLimit | str | None): at most this many tries of the job start in any
                window, across every worker: a :class:`RateLimit` or a string such as ``"10/s"``.
            concurrency (int | None): at most this many of its jobs run at once, across every
                worker.
            limit_key (str | Callable | None): the key of per-key limits: the name of one of its
                parameters (the argument's value is the key), or a function called with its
                arguments that returns the key (a string or an integer).
            key_rate_limit (RateLimit | str | None): as ``rate_limit``, per limit key.
            key_concurrency (int | None): as ``concurrency``, per limit key.
            grace (float | None): seconds a running job of this kind may take to end when its worker
                stops gracefully, instead of the worker's grace period (longer, say, for a job that
                should finish during a deploy).
            debounce (timedelta | float | None): merge a burst of enqueues of one ``key`` into one
                job, run with the latest arguments this long after the latest enqueue (see the
                jobs guide, "Debounce and throttle"); enqueues return the merged job's handle.
            max_wait (timedelta | float | None): run a debounced burst at most this long after its
                first enqueue (no bound by default).
            key (str | Callable | None): the key of ``debounce`` or ``throttle``: the name of one
                of its parameters, or a function of its arguments returning a string or an
                integer; without it, every enqueue of the job is one key.
            throttle (timedelta | float | None): accept at most one enqueue per ``key`` in this
                period, keeping the first; the others return the kept job's handle.

        Returns:
            the :class:`Job`, which is still callable as the plain function.

        Error handling:
            :class:`~streamkit.ConfigError` for an invalid option; ``TypeError`` for
            an unknown one.
        """
        job_options = JobOptions.taken(options, by="JobQueue.job", routing=False)

        def declare(fn: Callable[..., Any]) -> Job[Any, Any]:
            return self.add(Job(name or fn.__name__, fn, job_options, None, lambda: self))

        return declare if fn is None else declare(fn)

    def cron(
        self,
        expression: str,
        *,
        misfire_grace: float = 60.0,
        tz: str | None = None,
        name: str | None = None,
        **options: Unpack[JobOptionsArgs],
    ) -> JobDecorator:
        """Declare a job that runs at the times of a crontab ``expression``, in the
        timezone ``tz`` (an IANA name such as ``"Europe/Paris"``; UTC by default).

        Each tick runs once across all the workers serving the queue: every worker
        enqueues it with a job id made of the job's name and the tick's time, and the
        dedupe keeps one. A tick missed while no worker ran is run once if it is at
        most ``misfire_grace`` seconds late, and skipped (with a log line) otherwise.
        Daylight-saving changes follow Debian's cron (see the jobs guide).
        ``options`` are those of :meth:`job`.
        """
        return cron_decorator(
            lambda fn: self.job(fn, name=name, **options),
            expression,
            misfire_grace=misfire_grace,
            tz=tz,
        )

    def add_middleware(self, middleware: JobMiddleware) -> JobMiddleware:
        """Run ``middleware`` around each try of the queue's jobs; usable as a decorator.

        A middleware is ``async def middleware(context, call_next)``: it gets the
        try's :class:`JobContext`, runs the try (the next middleware, then the job)
        with ``await call_next()``, and returns its result (or raises). Middleware run
        in the order they were added, the first outermost, inside the job's timeout;
        an exception raised by one fails the try as the job's own would.
        """
        self.middleware.append(middleware)
        return middleware

    def set_lifespan(
        self, fn: Callable[[], AsyncIterator[Any]]
    ) -> Callable[[], AsyncIterator[Any]]:
        """Run the async generator ``fn`` around each worker of this queue; usable as a
        decorator.

        Its code before ``yield`` runs when a worker starts (before it takes any job:
        ``nursery.start(queue.serve)`` returns after it), its code after ``yield``
        when the worker has stopped (its jobs ended or put back; shielded from the
        stop, for at most 10 s): open a database pool
        there, say. The value it yields is :attr:`JobContext.state` of every job the
        worker runs. A queue has one lifespan.

        Error handling:
            :class:`~streamkit.ConfigError` for a second lifespan. An exception raised
            before ``yield`` stops the worker from starting.
        """
        if self.lifespan is not None:
            raise ConfigError("lifespan", f"queue {self.name!r} has a lifespan already")
        self.lifespan = contextlib.asynccontextmanager(fn)
        return fn

    # ------------------------------------------------------------------ schedules

    async def set_schedule(
        self,
        name: str,
        job: Job[Any, Any] | str,
        expression: str,
        *,
        tz: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        misfire_grace: float = 60.0,
    ) -> ScheduleInfo:
        """Add the schedule ``name``, or change it: ``job`` runs with ``args`` and
        ``kwargs`` at the times of the crontab ``expression`` in ``tz`` (UTC by
        default), once per tick across the workers, as for :meth:`cron`.

        Kept in Redis: every worker of the queue that runs ``job`` picks the change
        up within a second, and the schedule outlives the program that set it. A
        schedule added now does not run the ticks before it.

        Error handling:
            :class:`~streamkit.ConfigError` for a bad name, expression or timezone, a
            job the queue does not declare, or one a schedule cannot enqueue (debounced,
            throttled, or a ``limit_key`` that fails on ``args``); ``TypeError`` or
            :class:`~streamkit.EncodeError` for arguments the job does not take or
            that do not encode.
        """
        validate_name("schedule name", name)
        check_expression(expression)
        timezone(tz)
        positive_number.check("misfire_grace", misfire_grace)
        job_name = job if isinstance(job, str) else job.name
        declared = self._declared(job_name)
        kwargs = dict(kwargs or {})
        if declared is not None:
            declared.check_arguments(args, kwargs)
            check_schedulable(declared, args, kwargs, what=f"schedule {name}")
        encode_arguments(job_name, args, kwargs, self.max_bytes)
        info = ScheduleInfo(
            name=name,
            job=job_name,
            expression=expression,
            tz=tz,
            args=tuple(args),
            kwargs=kwargs,
            misfire_grace=misfire_grace,
        )
        await store_schedule(self, info)
        return attrs.evolve(info, next_at=next_tick(expression, timezone(tz), wall_clock()))

    async def remove_schedule(self, name: str) -> bool:
        """Remove the schedule ``name`` added by :meth:`set_schedule` (workers stop
        running it within a second). Returns whether there was one."""
        return await drop_schedule(self, name)

    async def schedules(self) -> list[ScheduleInfo]:
        """The queue's schedules, with when each ticks next: those declared in code
        (:meth:`cron`), then those added at runtime, by name."""
        now = wall_clock()
        declared = [
            ScheduleInfo(
                name=job.name,
                job=job.name,
                expression=job.schedule.expression,
                tz=job.schedule.tz,
                misfire_grace=job.schedule.misfire_grace,
                declared=True,
                next_at=next_tick(job.schedule.expression, timezone(job.schedule.tz), now),
            )
            for job in sorted(self.jobs.values(), key=lambda j: j.name)
            if job.schedule is not None
        ]
        stored = await read_schedules(self)
        runtime = [decode_schedule(name, raw, now) for name, raw in sorted(stored.items())]
        return declared + [info for info in runtime if info is not None]

    # ------------------------------------------------------------------ pausing

    def _declared(self, job_name: str) -> Job[Any, Any] | None:
        """The job ``job_name`` of this queue; ``None`` if the queue knows no jobs (one
        opened by name alone).

        Error handling:
            :class:`~streamkit.ConfigError` if the queue knows its jobs and not this one.
        """
        declared = self.jobs.get(job_name)
        if declared is None and self.jobs:
            known = ", ".join(sorted(self.jobs))
            raise ConfigError(
                "job", f"queue {self.name!r} has no job {job_name!r} (known: {known})"
            )
        return declared

    async def pause(self, job: Job[Any, Any] | str | None = None) -> None:
        """Pause the queue, or one job name: no new try of its jobs starts, on any
        worker, until :meth:`resume`. Nothing fails: jobs queued meanwhile wait (a
        paused job name's jobs as ``held``), and the tries running go on to their end.

        Error handling:
            :class:`~streamkit.ConfigError` for a job name the queue does not declare
            (when it knows its jobs: a typo would pause nothing).
        """
        name = "*" if job is None else job if isinstance(job, str) else job.name
        if name != "*":
            validate_name("job name", name)
            self._declared(name)
        for keys in self.shard_keys:
            await retry_idempotent(
                _CONTROL, self.redis, keys.keys, (keys.base, "pause", name, 0), what="pausing"
            )

    async def resume(self, job: Job[Any, Any] | str | None = None) -> int:
        """Resume the queue, or one job name, paused by :meth:`pause`: its held jobs are
        queued again, in order, in steps of 100. Returns how many were let out.

        Error handling:
            :class:`~streamkit.ConfigError`, as :meth:`pause`, for a job name the queue
            does not declare and that is not paused (a paused name no longer declared
            can still be resumed).
        """
        name = "*" if job is None else job if isinstance(job, str) else job.name
        if name != "*":
            validate_name("job name", name)
            try:
                self._declared(name)
            except ConfigError:
                if name not in await self.paused():
                    raise
        released = 0
        for keys in self.shard_keys:
            left = 1
            while left:
                left, moved = await retry_idempotent(
                    _CONTROL,
                    self.redis,
                    keys.keys,
                    (keys.base, "resume", name, _scripts.UNPARK_BUDGET),
                    what="resuming",
                )
                released += int(moved)
        return released

    async def paused(self) -> list[str]:
        """What is paused: ``"*"`` for the whole queue, and the paused job names."""
        found: set[str] = set()
        for keys in self.shard_keys:
            names = await retry_idempotent(
                self.redis.hkeys, keys.control, what="reading what is paused"
            )
            found.update(label(name) for name in names)
        return sorted(found)

    def add(self, job: Job[P, R]) -> Job[P, R]:
        """Add a declared job (used by ``App`` to bind its jobs to the queue)."""
        if job.name in self.jobs and self.jobs[job.name] is not job:
            raise ConfigError("job name", f"queue {self.name!r} has a job {job.name!r} already")
        self.jobs[job.name] = job
        return job

    # ------------------------------------------------------------------ enqueueing

    def handle(self, job_id: str, *, shard: int | None = None) -> JobHandle[Any]:
        """A handle on job ``job_id``.

        Every job lives on the shard its id maps to (see the key layout), so the
        shard need not be given.
        """
        return JobHandle(self, job_id, shard_for(job_id, self.shards) if shard is None else shard)

    async def enqueue_calls(
        self,
        job: Job[Any, Any],
        calls: Iterable[JobCall | tuple[Any, ...] | Mapping[str, Any]],
        *,
        priority: Priority | None = None,
        delay: When | None = None,
    ) -> list[JobHandle[Any]]:
        """Enqueue ``job`` once per call (see :meth:`Job.enqueue_many`)."""
        # Checked and encoded as every client does (jobs._plan), then sent in bounded
        # calls, a few at a time.
        plan = plan_enqueue(
            job, calls, self._placement, queue=self.name, priority=priority, delay=delay
        )
        placed = await send_plan(self, plan)
        return [JobHandle(self, job_id, shard, added=added) for job_id, shard, added in placed]

    async def enqueue_workflow(self, workflow: Workflow) -> WorkflowHandle:
        """Enqueue a workflow: a :func:`~streamkit.jobs.chain`, a
        :func:`~streamkit.jobs.group`, a :func:`~streamkit.jobs.chord` (or a single
        step), with its failure callbacks.

        Its jobs may be declared on other queues (an app's named queues); the
        dependencies between them are kept by the queues' scripts, on one shard or
        across shards and queues. A workflow without jobs on other queues or shards
        is one script call per 250 jobs.

        Returns:
            a :class:`WorkflowHandle`: await its :meth:`~WorkflowHandle.result`.

        Error handling:
            As :meth:`Job.enqueue`, checked for every job before any is sent.
        """
        jobs = [n.job for n in compile_workflow(workflow)[0] if n.job is not None]
        queues: dict[str, QueueLike] = {self.name: self}
        for job in jobs:
            queue = job.queue if isinstance(job, Job) else self
            queues.setdefault(queue.name, queue)
        plan = plan_workflow(
            workflow,
            queue_of=lambda job: job.queue.name if isinstance(job, Job) else self.name,
            placement=self._placement,
        )
        await send_workflow(self.redis, plan)
        handles: tuple[JobHandle[Any], ...] = tuple(
            JobHandle(queues[place.queue], place.id, place.shard) for place in plan.placed
        )
        return WorkflowHandle(handles[plan.final], handles)

    # ------------------------------------------------------------------ following

    async def _ensure_waiter(self, shard: int) -> _Waiters:
        waiters = self._waiters[shard]
        if not waiters.started:
            async with waiters.lock:
                if not waiters.started:
                    if self._nursery is None:
                        raise ConfigError(
                            "queue", "results are awaited inside `async with open_job_queue(...)`"
                        )
                    await self._nursery.start(waiters.run, self.redis)
                    waiters.started = True
        return waiters

    async def wait_result(self, handle: JobHandle[Any], timeout: float | None) -> Any:  # noqa: ASYNC109
        """Wait for ``handle``'s job to end (see :meth:`JobHandle.result`)."""
        keys = self.shard_keys[handle.shard]
        with trio.fail_after(math.inf if timeout is None else timeout):
            waiters = await self._ensure_waiter(handle.shard)
            event = trio.Event()
            waiters.events.setdefault(handle.id, []).append(event)
            try:
                while True:
                    reply = await retry_idempotent(
                        _WATCH,
                        self.redis,
                        keys.keys,
                        (keys.base, handle.id),
                        what="waiting for a job's result",
                    )
                    final, result = watch_reply(reply, handle.id, self.name)
                    if final:
                        return result
                    await event.wait()
                    event = trio.Event()
                    waiters.events[handle.id] = [
                        e for e in waiters.events.get(handle.id, []) if not e.is_set()
                    ] + [event]
            finally:
                remaining = [e for e in waiters.events.get(handle.id, []) if e is not event]
                if remaining:
                    waiters.events[handle.id] = remaining
                else:
                    waiters.events.pop(handle.id, None)

    async def find(self, job_id: str) -> JobHandle[Any]:
        """The handle of job ``job_id``, looking on every shard.

        Error handling:
            :class:`~streamkit.jobs.JobNotFound` if no shard has it.
        """
        home = shard_for(job_id, self.shards)
        for shard in [home, *(s for s in range(self.shards) if s != home)]:
            exists = await retry_idempotent(
                self.redis.exists, [self.shard_keys[shard].job(job_id)], what="finding a job"
            )
            if exists:
                return JobHandle(self, job_id, shard)
        raise JobNotFound(job_id, self.name)

    async def info(self, job_id: str) -> JobInfo:
        """What the queue knows of job ``job_id`` (see :meth:`JobHandle.info`)."""
        return await (await self.find(job_id)).info()

    async def abort(
        self, job_id: str, reason: str = "aborted", *, shard: int | None = None
    ) -> JobStatus:
        """Abort job ``job_id`` (see :meth:`JobHandle.abort`)."""
        handle = await self.find(job_id) if shard is None else JobHandle(self, job_id, shard)
        keys = self.shard_keys[handle.shard]
        outcome, unsettled = await retry_idempotent(
            _ABORT,
            self.redis,
            keys.keys,
            (keys.base, job_id, reason),
            what="aborting a job",
        )
        if unsettled:
            await settle_all(self, handle.shard)
        return abort_reply(outcome, job_id, self.name)

    # ------------------------------------------------------------------ inspecting

    async def events(
        self, *, after: str | None = None, follow: bool = True
    ) -> AsyncIterator[JobEvent]:
        """The state changes of the queue's jobs, from any process: each a
        :class:`JobEvent` (enqueued, started, progress, retried, released, succeeded,
        dead, aborted, expired), in the order they happened per shard.

        Usage: ``async for event in queue.events(): print(event.kind, event.job_id)``.

        Args:
            after: a :attr:`JobEvent.cursor`: resume after that event (a reader that
                restarts). From the oldest event kept by default (each shard keeps
                about 10,000).
            follow: wait for new events once the kept ones are read, until cancelled
                (``False``: stop there).

        Error handling:
            :class:`~streamkit.ConfigError` for a cursor of another queue.
        """
        async for event in follow_events(self.redis, self.shard_keys, after=after, follow=follow):
            yield event

    async def set_events(self, on: bool) -> None:
        """Turn the queue's job events on (the default) or off, for every producer and
        worker: off, its scripts append none (see the jobs guide for what they cost)."""
        await set_events(self.redis, self.shard_keys, on)

    async def events_enabled(self) -> bool:
        """Whether the queue's job events are on."""
        return await events_on(self.redis, self.shard_keys[0])

    async def counts(self) -> QueueCounts:
        """How many jobs the queue holds, by status, priority and job name."""
        return await count_jobs(self)

    async def dead_letters(self, *, limit: int | None = None) -> list[JobInfo]:
        """The jobs in the dead-letter queue, oldest first, with their errors."""
        return await read_dead_letters(self, limit)

    async def replay(
        self,
        ids: Sequence[str] | None = None,
        *,
        on_progress: Callable[[int, int], object] | None = None,
    ) -> list[str]:
        """Queue dead jobs again with their tries reset; all of them by default.

        Args:
            ids: the jobs to replay; every dead job by default.
            on_progress: called after each step (up to 200 jobs, one round trip) with
                how many jobs the step went through and how many it replayed, e.g.
                to drive a progress bar.

        Returns:
            the ids queued again (ids that were not dead are skipped).
        """
        return await act_on_dead(self, REPLAY, ids, "replaying dead jobs", on_progress)

    async def purge(
        self,
        ids: Sequence[str] | None = None,
        *,
        on_progress: Callable[[int, int], object] | None = None,
    ) -> list[str]:
        """Delete dead jobs and their records; all of them by default.

        Args:
            ids: the jobs to purge; every dead job by default.
            on_progress: as for :meth:`replay`.

        Returns:
            the ids deleted.
        """
        return await act_on_dead(self, PURGE, ids, "purging dead jobs", on_progress)

    # ------------------------------------------------------------------ running

    async def serve(
        self,
        handlers: Handlers | None = None,
        *,
        concurrency: int = 32,
        threads: int = 32,
        state: Any = None,
        task_status: trio.TaskStatus[JobWorker] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run jobs of this queue until cancelled: ``await nursery.start(queue.serve)``.

        Args:
            handlers: the jobs to run: declared :class:`Job` objects, or a mapping of
                job name to function; all the queue's declared jobs by default.
            concurrency: jobs run at once by this worker.
            threads: worker threads for plain (non-async) job functions.
            state: :attr:`JobContext.state` of the jobs it runs, for a queue without
                a lifespan (see :meth:`set_lifespan`).

        ``nursery.start`` returns the running :class:`JobWorker`; its
        :meth:`~JobWorker.drain` stops taking jobs and waits for the running ones.

        Cancellation:
            Cancelling stops claiming jobs; the tries running then are cancelled and
            put back on the queue without spending a try, for another worker.
        """

        await serve_jobs(
            self,
            handlers,
            concurrency=concurrency,
            threads=threads,
            state=state,
            task_status=task_status,
        )

    def __repr__(self) -> str:
        return f"<JobQueue {self.name} shards={self.shards} jobs={sorted(self.jobs)}>"


@contextlib.asynccontextmanager
async def open_job_queue(
    redis: Redis,
    name: str,
    *,
    shards: int = 1,
    lease_ttl: float = DEFAULT_JOB_LEASE_TTL,
    max_deliveries: int = DEFAULT_JOB_MAX_DELIVERIES,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> AsyncIterator[JobQueue]:
    """Open the job queue ``name`` on ``redis``.

    Args:
        redis: a client from :func:`streamkit.open_redis`.
        name: the queue's name: letters, digits, ``_`` and ``-``.
        shards: how many shards to split the queue into (each a Redis Cluster slot
            of its own). Every producer and worker of a queue must agree on it.
        lease_ttl: seconds after which a job whose worker stopped renewing its lease
            (killed, paused, cut off) is taken over by another worker.
        max_deliveries: times a job may lose its worker before it goes dead.
        max_bytes: the largest encoded arguments, or result, of a job (1 MiB by
            default; no more than the server's ``proto-max-bulk-len``): larger
            arguments are refused at enqueue, and a job with a larger result ends
            dead.

    The block owns the queue's background work (the reader that wakes result
    waiters); jobs run where :meth:`JobQueue.serve` is started.
    """
    queue = JobQueue(
        redis,
        name,
        shards=shards,
        lease_ttl=lease_ttl,
        max_deliveries=max_deliveries,
        max_bytes=max_bytes,
    )
    async with open_service_nursery(reason=f"job queue {name} closing") as nursery:
        queue._nursery = nursery
        try:
            yield queue
        finally:
            queue._nursery = None
