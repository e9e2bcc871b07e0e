"""A handle on one enqueued job: its status, result, info, and abort."""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import TYPE_CHECKING, Any, Generic, Protocol, cast, overload

import attrs

from .._errors import ConfigError, JobNotFound
from .._keys import validate_name
from .._redis import redis_errors, retry_idempotent, run_blocking
from ._arguments import check_argument_types
from ._model import (
    JobCall,
    JobChunk,
    JobInfo,
    JobOptions,
    JobRef,
    JobStatus,
    P,
    Priority,
    R,
    Schedule,
    When,
)
from ._replies import (
    decode_history,
    decode_info,
    decode_output,
    info_reply,
    outcome,
    progress_value,
    status_reply,
)
from ._workflow import Step

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
    from contextlib import AbstractAsyncContextManager
    from datetime import datetime

    from .._redis import Redis
    from ._context import JobMiddleware
    from ._layout import ShardKeys

#: How long a reader of a job's output waits for a chunk before it looks at the job (ms).
OUTPUT_BLOCK_MS = 1000

__all__ = [
    "OUTPUT_BLOCK_MS",
    "Job",
    "JobDecorator",
    "JobHandle",
    "QueueLike",
    "WorkflowHandle",
    "decode_history",
    "decode_info",
    "outcome",
]


class QueueLike(Protocol):
    """What jobs and handles need of their queue (a :class:`JobQueue`)."""

    name: str
    redis: Redis
    shards: int
    lease_ttl: float
    max_deliveries: int
    max_bytes: int
    shard_keys: list[ShardKeys]
    jobs: dict[str, Job[Any, Any]]
    middleware: list[JobMiddleware]
    lifespan: Callable[[], AbstractAsyncContextManager[Any]] | None

    def handle(self, job_id: str, *, shard: int | None = None) -> JobHandle[Any]: ...

    async def find(self, job_id: str) -> JobHandle[Any]: ...

    async def enqueue_calls(
        self,
        job: Job[Any, Any],
        calls: Iterable[JobCall | tuple[Any, ...] | Mapping[str, Any]],
        *,
        priority: Priority | None = None,
        delay: When | None = None,
    ) -> list[JobHandle[Any]]: ...

    async def wait_result(self, handle: JobHandle[Any], timeout: float | None) -> Any: ...  # noqa: ASYNC109

    async def abort(
        self, job_id: str, reason: str = "aborted", *, shard: int | None = None
    ) -> JobStatus: ...


class JobDecorator(Protocol):
    """What ``@queue.job(...)`` and ``@app.job(...)`` return: a decorator that keeps
    the function's types in the :class:`Job` it makes."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Job[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Job[P, R]: ...


@attrs.frozen
class JobHandle(Generic[R]):
    """A job on a queue, by id: ask for its status, result or info, or abort it.

    Handles are cheap values: get one for any id with :meth:`JobQueue.handle`. A
    handle from a declared job's ``delay`` is typed with the job's return type:
    ``JobHandle[R]``, whose :meth:`result` returns ``R`` in a type checker.

    Attributes:
        queue: the queue the job is on.
        id: the job's id.
        shard: the queue shard it lives on.
        added: whether the enqueue that returned it added the job: ``False`` when
            it merged into a debounced job of its key or was dropped by a throttle
            (the handle is then that job's), or when its ``job_id`` named a job that
            was there already (a duplicate: the handle is that job's); ``True`` for
            every other handle.
    """

    queue: QueueLike = attrs.field(repr=False)
    id: str
    shard: int
    added: bool = attrs.field(default=True, eq=False, repr=False, kw_only=True)

    @property
    def _key(self) -> str:
        return self.queue.shard_keys[self.shard].job(self.id)

    async def status(self) -> JobStatus:
        """Where the job is now.

        Error handling:
            :class:`~streamkit.jobs.JobNotFound` if there is no record of it.
        """
        with redis_errors():
            value = await retry_idempotent(
                self.queue.redis.hget, self._key, "status", what="reading a job's status"
            )
        return status_reply(value, self.id, self.queue.name)

    async def info(self) -> JobInfo:
        """Everything the queue records of the job: tries, times, worker, error, progress.

        Error handling:
            :class:`~streamkit.jobs.JobNotFound` if there is no record of it.
        """
        fields = cast(
            "dict[bytes, bytes]",
            await retry_idempotent(self.queue.redis.hgetall, self._key, what="reading a job"),
        )
        return info_reply(fields, self.id, self.queue.name)

    async def progress(self) -> Any:
        """The newest progress the job reported with :meth:`JobContext.progress
        <streamkit.jobs.JobContext.progress>` (``None`` if none yet), as written by
        its worker at most every half second while it runs, and last before its
        outcome.

        Error handling:
            :class:`~streamkit.jobs.JobNotFound` if there is no record of it.
        """
        with redis_errors():
            status, raw = await retry_idempotent(
                self.queue.redis.hmget, self._key, ["status", "pv"], what="reading a job's progress"
            )
        status_reply(status, self.id, self.queue.name)  # JobNotFound without a record
        return progress_value(raw)

    async def stream(self, *, after: str | None = None) -> AsyncIterator[JobChunk]:
        """The chunks the job streams with :meth:`JobContext.stream
        <streamkit.jobs.JobContext.stream>`, in order, as they come: from the start
        (a reader that starts late gets them all, the newest 10,000), or after the chunk
        whose :attr:`~JobChunk.id` is ``after`` (to resume). It ends with the job: when
        the job succeeded, the iteration stops; when it ended dead, aborted or expired,
        it raises :class:`~streamkit.jobs.JobFailed`, as :meth:`result` does. A retried
        job's next try streams again from its own start (see
        :attr:`JobChunk.try_number`).

        Usage: ``async for chunk in handle.stream(): print(chunk.value)``.

        Error handling:
            :class:`~streamkit.jobs.JobNotFound` if there is no record of the job;
            :class:`~streamkit.jobs.JobFailed` at the end of a job that failed.
        """
        key = self.queue.shard_keys[self.shard].output(self.id)
        cursor = after or "0-0"
        while True:
            reply: Any = await run_blocking(
                self.queue.redis,
                lambda r, cursor=cursor: r.xread(  # type: ignore[misc]
                    {key: cursor}, count=500, block=OUTPUT_BLOCK_MS
                ),
                within=OUTPUT_BLOCK_MS / 1000 + 10,
                what="reading a job's streamed output",
            )
            entries = [
                (entry.identifier, entry.field_values)
                for stream_entries in (reply or {}).values()
                for entry in stream_entries
            ]
            chunks, end = decode_output(entries)
            for chunk in chunks:
                cursor = chunk.id
                yield chunk
            if end is None and not entries:
                status = await self.status()  # JobNotFound without a record
                if status.final:
                    # Ended by a script that ends no output (expired, aborted while
                    # queued): whatever came before it was read above.
                    end = status.value
            if end is not None:
                if end != JobStatus.SUCCESS.value:
                    await self.result(timeout=10)  # raises JobFailed
                return

    async def result(self, timeout: float | None = None) -> R:  # noqa: ASYNC109 (the familiar API)
        """Wait until the job is over and return its result.

        Waiting does not poll: the queue's one reader per shard is woken when an
        awaited job ends. A result stays collectable for the job's ``result_ttl``
        after it ended, so a late caller gets it too.

        Args:
            timeout: give up after this many seconds (``None``: wait as long as it
                takes).

        Error handling:
            :class:`~streamkit.jobs.JobFailed` if it ended dead, aborted or expired
            (with the original exception's type, message and traceback text);
            :class:`~streamkit.jobs.JobNotFound` at once if there is no record of it
            (never enqueued, or its record expired); :class:`~streamkit.jobs.ResultNotKept`
            if its job keeps no results; ``trio.TooSlowError`` after ``timeout``.
        """
        result: R = await self.queue.wait_result(self, timeout)
        return result

    async def abort(self, reason: str = "aborted") -> JobStatus:
        """Abort the job: a queued job ends ``aborted`` at once; a running job's try
        is cancelled by its worker (within a second) and ends ``aborted``.

        Returns:
            the job's status after the call: ``ABORTED``, ``EXECUTING`` (its worker
            cancels it shortly), or the final status it had already reached.

        Error handling:
            :class:`~streamkit.jobs.JobNotFound` if there is no record of it.
        """
        return await self.queue.abort(self.id, reason, shard=self.shard)


@attrs.frozen
class WorkflowHandle:
    """A workflow on its queues (what :meth:`JobQueue.enqueue_workflow` returns): its
    result is its last job's, awaited like a job's.

    Attributes:
        final: the job whose result is the workflow's (a chain's last step, a
            chord's callback, a group's gather node).
        jobs: every job of the workflow, dependencies first.
    """

    final: JobHandle[Any]
    jobs: tuple[JobHandle[Any], ...]

    @property
    def id(self) -> str:
        """The id of its final job."""
        return self.final.id

    async def result(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 (the familiar API)
        """Wait until the workflow is over and return its result (see
        :meth:`JobHandle.result`).

        Error handling:
            :class:`~streamkit.jobs.JobFailed` if a job of it failed: the final job
            ends dead with the error type ``DependencyFailed`` and a message naming
            the job that failed first and why (or with its own error, if it is the
            one that failed); ``trio.TooSlowError`` after ``timeout``.
        """
        return await self.final.result(timeout)

    async def status(self) -> JobStatus:
        """Where its final job is now."""
        return await self.final.status()

    async def abort(self, reason: str = "aborted") -> JobStatus:
        """Abort every job of the workflow that is not over; returns the final job's
        status after the call (its dependents end dead as the aborted jobs end)."""
        for handle in self.jobs:
            if handle is not self.final:
                with contextlib.suppress(JobNotFound):
                    await handle.abort(reason)
        return await self.final.abort(reason)


def _positional_range(signature: inspect.Signature) -> tuple[float, float]:
    """How many positional arguments alone bind, as (least, most); (1, 0) if a
    required keyword-only parameter means they never do."""
    low, high = 0, 0.0
    for param in signature.parameters.values():
        if param.kind is param.VAR_POSITIONAL:
            high = math.inf
        elif param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            high += 1
            if param.default is param.empty:
                low += 1
        elif param.kind is param.KEYWORD_ONLY and param.default is param.empty:
            return (1, 0)
    return (low, high)


@attrs.define(eq=False)
class Job(Generic[P, R]):
    """A function declared as a job of a queue (by :meth:`JobQueue.job` or ``App.job``).

    Calling it calls the function itself; :meth:`delay`, :meth:`enqueue` and
    :meth:`enqueue_many` enqueue it to run on a worker.

    Typed ``Job[P, R]``, ``P`` the function's parameters and ``R`` what it returns
    (what its coroutine returns, for an ``async def``): a type checker checks the
    arguments of :meth:`delay` and types the handle's ``result()`` as ``R``.

    Attributes:
        name: the job's name, unique in its queue.
        fn: the function (``async def`` or plain ``def``, run in a thread).
        options: retries, timeout and the other options it was declared with.
        schedule: its cron schedule, for a cron job.
    """

    name: str
    fn: Callable[P, Any]
    options: JobOptions
    schedule: Schedule | None
    _queue: Callable[[], QueueLike]
    signature: inspect.Signature = attrs.field(init=False)
    is_async: bool = attrs.field(init=False)
    _positional: tuple[float, float] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        validate_name("job name", self.name)
        self.signature = inspect.signature(self.fn)
        self._positional = _positional_range(self.signature)
        self.is_async = inspect.iscoroutinefunction(self.fn)
        if inspect.isasyncgenfunction(self.fn) or inspect.isgeneratorfunction(self.fn):
            raise ConfigError(self.name, "a job must be a function, not a generator")
        key = self.options.limit_key
        if isinstance(key, str) and key not in self.signature.parameters:
            raise ConfigError(
                "limit_key", f"job {self.name} has no parameter {key!r} to take its limit key from"
            )
        key = self.options.key
        if isinstance(key, str) and key not in self.signature.parameters:
            raise ConfigError(
                "key", f"job {self.name} has no parameter {key!r} to take its key from"
            )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        return self.fn(*args, **kwargs)

    def check_arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise ``TypeError`` unless the function accepts these arguments, each of the
        type its annotation declares (checked as a record's fields are: its JSON, as
        stored, must structure back into the annotation; see the jobs guide).

        Every enqueue checks its calls here, before anything is sent.
        """
        self.check_arity(args, kwargs)
        check_argument_types(self, args, kwargs)

    def check_arity(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise ``TypeError`` unless the function's signature binds these arguments."""
        low, high = self._positional
        if not kwargs and low <= len(args) <= high:
            return
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"job {self.name}: {exc}") from None

    @property
    def queue(self) -> QueueLike:
        """The queue the job is declared on (for an app's job, the one it is routed
        to; the app must be connected)."""
        return self._queue()

    def _returns(self) -> R:
        """What the job returns, for type checkers only (see :class:`TypedJob`)."""
        raise TypeError("Job._returns is for type checkers")

    def step(self, *args: Any, **kwargs: Any) -> Step:
        """This job called with these arguments, as a step of a workflow (see
        :func:`~streamkit.jobs.chain`): in a chain, all but the first step get the
        previous step's result as one more argument, first."""
        return Step(self, JobCall(args=args, kwargs=kwargs))

    def bind_arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
        """The arguments by parameter name, defaults applied (``TypeError`` if the
        function does not accept them)."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    async def delay(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        """Enqueue the job with these arguments, with its declared options.

        Error handling:
            ``TypeError`` if the function does not accept the arguments;
            :class:`~streamkit.EncodeError` if they are not JSON-serialisable.
        """
        handles: list[JobHandle[R]] = await self._queue().enqueue_calls(
            self, [JobCall(args=args, kwargs=kwargs)]
        )
        return handles[0]

    async def enqueue(
        self,
        *args: Any,
        job_id: str | None = None,
        delay: When | None = None,
        at: datetime | None = None,
        priority: Priority | None = None,
        expires: When | datetime | None = None,
        after: Sequence[JobRef | str] = (),
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> JobHandle[R]:
        """Enqueue the job with these arguments and options.

        Args:
            *args: the function's positional arguments.
            job_id: an id of your own, making the enqueue idempotent: while a job with
                this id is queued or running, and for ``dedupe_window`` seconds after
                it was enqueued, enqueueing it again returns the existing job instead
                of adding one (concurrent enqueues included). Without it, the job gets
                a random id.
            delay: run no sooner than this long from now (a ``timedelta`` or seconds,
                ``>= 0``; 0: now).
            at: run no sooner than this (timezone-aware) time.
            priority: ``"high"``, ``"normal"`` or ``"low"``; the job's by default.
            expires: end as ``expired`` unless started within this long (or by this
                time); the job's ``expires`` by default.
            after: jobs that must all succeed before this one runs: handles (of jobs
                on any shard of this queue or of another queue on the same Redis) or
                ids (of jobs of this queue); if one ends dead, aborted or expired, this
                one ends dead.
            headers: text values the job sees in its :class:`JobContext` (the
                enqueuer's trace context is added to them when it traces with
                OpenTelemetry).
            **kwargs: the function's keyword arguments.

        Returns:
            the handle of the job that runs for this call: the new job, or for a job
            declared with ``debounce=`` or ``throttle=`` the one of its key that took
            the call (:attr:`JobHandle.added` is then ``False``).

        Error handling:
            ``TypeError`` if the function does not accept the arguments;
            :class:`~streamkit.EncodeError` if they are not JSON-serialisable;
            :class:`~streamkit.ConfigError` for bad options (for a debounced or
            throttled job: ``job_id``, ``after``, and ``delay`` or ``at`` of a
            debounced one).
        """
        call = JobCall(
            args=args,
            kwargs=kwargs,
            job_id=job_id,
            delay=delay,
            at=at,
            priority=priority,
            expires=expires,
            after=after,
            headers=headers,
        )
        handles: list[JobHandle[R]] = await self._queue().enqueue_calls(self, [call])
        return handles[0]

    async def enqueue_many(
        self,
        calls: Any,
        *,
        priority: Priority | None = None,
        delay: When | None = None,
    ) -> list[JobHandle[R]]:
        """Enqueue many jobs at once, pipelined: far faster than one at a time.

        Args:
            calls: an iterable of a tuple (positional arguments), a mapping (keyword
                arguments) or a :class:`JobCall` (arguments and options) per job.
            priority: the priority of the calls that do not name one.
            delay: the delay of the calls that do not name one.

        Error handling:
            As :meth:`enqueue`, checked for every call before any is sent.
        """
        queue = self._queue()
        return list(await queue.enqueue_calls(self, calls, priority=priority, delay=delay))

    def __repr__(self) -> str:
        return f"<Job {self.name}>"
