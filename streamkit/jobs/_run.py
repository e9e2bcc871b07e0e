"""Running a try of a claimed job: decode its arguments, call its function in the
runner's lane (an ``async def`` on the event loop, a plain ``def`` in a thread), and
turn how it ended into an outcome for the outbox.

The try runners, ``concurrency`` tasks, share the channel of claimed jobs; each runs
one try at a time, in a cancel scope its tries share until one is cancelled
(:class:`~._tries.Lane`). :func:`progress` is what a running job calls to report.
"""

from __future__ import annotations

import functools
import logging
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from .._backoff import jitter_draw
from .._errors import ConfigError, EncodeError, StreamkitError
from .._logs import log_context
from .._lua import script
from .._redis import LuaScript, retry_idempotent
from .._wire import text
from ._arguments import BadArguments, decode_arguments
from ._context import JobContext, running
from ._model import dumps
from ._outcome import MAX_MESSAGE, Failure, Retry, Verdict, decide, describe, label
from ._trace import job_span, tracing
from ._tries import Lane, Try

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ._context import JobMiddleware
    from ._finish import Outbox
    from ._handle import Job, QueueLike
    from ._handoff import Handoff
    from ._progress import ProgressWriter
    from ._streaming import ChunkWriter
    from ._threads import Reserved, Threads
    from ._tries import Tries

__all__ = ["TryRunner", "progress"]

log = logging.getLogger("streamkit.jobs")

_PROGRESS = LuaScript(script("jobs/progress"))


async def progress(fraction: float, message: str = "") -> None:
    """Report the progress of the running job: ``fraction`` from 0 to 1 and a message.

    Shown by :meth:`JobHandle.info` and ``streamkit jobs show``. Fenced: a try that
    was taken over by another worker reports nothing. The message is cut to its first
    8,000 characters.

    Error handling:
        ``RuntimeError`` outside a job; :class:`~streamkit.ConfigError` for a fraction
        outside 0..1.
    """
    try:
        queue, current, _ = running.get()
    except LookupError:
        raise RuntimeError("progress() is called from inside a running job") from None
    if not 0 <= fraction <= 1:
        raise ConfigError("fraction", f"must be from 0 to 1, got {fraction!r}")
    keys = queue.shard_keys[current.shard]
    await retry_idempotent(
        _PROGRESS,
        queue.redis,
        keys.keys,
        (keys.base, current.id, current.token, orjson.dumps([fraction, message[:MAX_MESSAGE]])),
        what="reporting progress",
    )


#: Where Trio's own code lives: an interrupt raised there is Trio's, not a job's.
_TRIO = os.path.dirname(trio.__file__) + os.sep


def cancels(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation (``trio.Cancelled``, or a group holding one):
    the try's lane's, or the worker's."""
    if isinstance(exc, trio.Cancelled):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(trio.Cancelled) is not None


def interrupts(exc: BaseException) -> bool:
    """Whether ``exc`` is Trio's, not the job's: a ``KeyboardInterrupt`` from a real
    SIGINT (raised by Trio's signal handler in whatever code ran), or the
    ``GeneratorExit`` of the runner's coroutine being closed (thrown in where it
    awaited, in Trio). Those end the worker; the same raised by a job fail its try."""
    if not isinstance(exc, KeyboardInterrupt | GeneratorExit):
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(_TRIO)


def retried(exc: BaseException, retry_on: tuple[type[BaseException], ...]) -> bool:
    """Whether ``retry_on`` retries ``exc``: an instance of one of its types, or an
    exception outside ``Exception`` (``SystemExit``, ``KeyboardInterrupt``) when it
    retries every ``Exception`` (the default): such a try fails as any other."""
    if isinstance(exc, retry_on):
        return True
    return not isinstance(exc, Exception) and any(issubclass(Exception, t) for t in retry_on)


@attrs.define(eq=False)
class TryRunner:
    """Runs the tries of claimed jobs and puts their outcomes in the outbox."""

    queue: QueueLike
    jobs: dict[str, Job[Any, Any]]
    tries: Tries
    outbox: Outbox
    threads: Threads
    consumer: str = ""
    #: Run around each try, outermost first.
    middleware: Sequence[JobMiddleware] = ()
    #: What the worker's lifespan yielded (:attr:`JobContext.state`).
    state: Any = None
    #: Writes the progress the tries report (rate-limited).
    progress_writer: ProgressWriter | None = None
    #: Writes the chunks the tries stream.
    chunk_writer: ChunkWriter | None = None

    async def run(self, handoff: Handoff) -> None:
        """Run the tries of the jobs handed over, one at a time, until cancelled."""
        while True:
            lane = Lane()
            with lane.scope:
                taker = handoff.taker()
                while True:
                    shard, claimed = await taker.next()
                    reserved = self.threads.reserved_for(claimed)
                    try:
                        # claimed: [job id, name, ...]; the job is in the log context
                        # of its try.
                        with log_context(job=label(claimed[1]), job_id=label(claimed[0])):
                            try:
                                await self.run_try(lane, shard, claimed, reserved)
                            except Exception as exc:
                                self._crashed(claimed, exc)
                    finally:
                        if reserved is not None:
                            reserved.release_unused()
                        self.tries.give_slot()
            # The lane was cancelled, for the try it ran (or for one that had just
            # ended: then for nothing); the next tries run in a new one.
            interrupted = lane.interrupted
            if interrupted is not None and interrupted.job is not None:
                with log_context(job=interrupted.job.name, job_id=interrupted.id):
                    self._interrupted(interrupted, interrupted.job)

    def _interrupted(self, current: Try, job: Job[Any, Any]) -> None:
        """Record how a try cancelled while it ran ended: aborted, back to the queue (its
        grace ran out at a stop), timed out, or nothing (taken over)."""
        if current.taken_over:
            log.warning(
                "job %s (%s): taken over by another worker; its try here ended",
                current.id,
                job.name,
            )
            current.finished = True
            self.tries.forget(current.id, current.token)
        elif current.abort_reason is not None:
            failure = Failure("Aborted", current.abort_reason)
            self.outbox.put(current, "aborted", failure.encode(), 0)
        elif current.stopping:
            # its grace ran out at a graceful stop: back to the queue, not spent
            self.outbox.put(current, "release", b"", 0)
        else:
            why = f"timed out after {job.options.timeout:g}s"
            self._failed(current, job, current.try_number, Failure("Timeout", why))

    def _crashed(self, claimed: list[Any], exc: Exception) -> None:
        """Running a try raised past the job's own function (a value nothing foresaw,
        or a bug here): the try fails, the worker goes on."""
        job_id = label(claimed[0])
        log.error("job %s: running its try failed: %s", job_id, describe(exc), exc_info=exc)
        current = self.tries.running.get(job_id)
        if current is None or current.finished:
            return  # not started: its lease runs out, and it is taken over
        if current.job is None:
            self.outbox.put(current, "dead", Failure.of(exc).encode(), 0)
        else:
            self._failed(current, current.job, int(claimed[3]), Failure.of(exc))

    async def run_try(
        self, lane: Lane, shard: int, claimed: list[Any], reserved: Reserved | None = None
    ) -> None:
        """Run one try of a claimed job in ``lane``, and put its outcome in the outbox
        (the runner does, if the lane is cancelled while it runs); a ``def`` job in the
        thread ``reserved`` for it at its claim."""
        raw_args, tries, token = claimed[2], int(claimed[3]), text(claimed[4])
        try:
            job_id, name = text(claimed[0]), text(claimed[1])
        except UnicodeDecodeError:
            # Written by something other than streamkit: recorded under its own bytes.
            log.error("job %s: its id or name is not UTF-8; it is dead", label(claimed[0]))
            failure = Failure("BadInput", "its id or name is not UTF-8")
            self.outbox.put_unheld(shard, claimed[0], token, "dead", failure.encode())
            return
        job = self.jobs.get(name)
        current = Try(
            job_id,
            shard,
            token,
            job,
            tries,
            progress_writer=self.progress_writer,
            chunk_writer=self.chunk_writer,
            thread=reserved,
        )
        self.tries.start(current)
        if job is None:
            known = ", ".join(sorted(self.jobs)) or "none"
            log.error("job %s: no job named %r in this worker (it knows: %s)", job_id, name, known)
            failure = Failure("BadInput", f"no job named {name!r} (known: {known})")
            self.outbox.put(current, "dead", failure.encode(), 0)
            return
        try:
            args, kwargs = decode_arguments(job, raw_args)
        except BadArguments as exc:
            log.error("job %s (%s): bad arguments: %s", job_id, name, exc)
            failure = Failure("BadInput", f"bad arguments: {exc}")
            self.outbox.put(current, "dead", failure.encode(), 0)
            return
        options = job.options
        made: list[JobContext] = []

        def context() -> JobContext:
            # made when asked for (current_job(), middleware, a span): most jobs never do
            if not made:
                made.append(self._context(job, job_id, tries, claimed))
            return made[0]

        reset = running.set((self.queue, current, context))
        try:
            lane.begin(current, options.timeout)
            try:
                if self.middleware or tracing(claimed[7]):
                    with job_span(name, job_id, self.queue.name, tries, context().headers):
                        result = await self._call(job, current, context(), args, kwargs)
                elif job.is_async:
                    result = await job.fn(*args, **kwargs)
                else:
                    result = await self._in_thread(job, current, args, kwargs)
            except BaseException as exc:
                if cancels(exc):
                    # The lane's, or the worker's: the runner records the outcome if the
                    # lane catches it.
                    lane.interrupted = current
                    raise
                if interrupts(exc):
                    raise
                # Anything else the job raised, SystemExit and KeyboardInterrupt too,
                # fails its try: never the worker (every worker would take it again).
                if current.taken_over:
                    current.finished = True
                    self.tries.forget(current.id, current.token)
                    return
                await self._flush_reports(current)
                unretried = None if retried(exc, job.options.retry_on) else "not in retry_on"
                self._failed(current, job, tries, Failure.of(exc, unretried=unretried), exc)
                return
            finally:
                lane.end()
            if current.taken_over:
                log.warning(
                    "job %s (%s): taken over by another worker; its try here ended", job_id, name
                )
                current.finished = True
                self.tries.forget(job_id, token)
                return
            await self._flush_reports(current)
            if current.emitted:
                try:
                    await self.outbox.check_streams(current)
                except StreamkitError as exc:
                    self._failed(current, job, tries, Failure.of(exc), exc)
                    return
            if options.keep_result:
                try:
                    data = self._encode_result(name, result)
                except EncodeError as exc:
                    log.error("job %s (%s): %s; it is dead", job_id, name, exc)
                    self.outbox.put(current, "dead", Failure("EncodeError", str(exc)).encode(), 0)
                    return
                self.outbox.put(current, "ok", data, 1)
            else:
                self.outbox.put(current, "ok", b"", 0)
        finally:
            running.reset(reset)

    async def _flush_reports(self, current: Try) -> None:
        """Write the chunks ``current`` streamed, and put its newest progress (to go
        with its outcome, in the same finish call), before its outcome."""
        if current.chunks and self.chunk_writer is not None:
            await self.chunk_writer.flush(current)
        if current.progress is not None and self.progress_writer is not None:
            value = self.progress_writer.take(current)
            if value is not None:
                self.outbox.put_progress(current, value)

    async def _in_thread(
        self, job: Job[Any, Any], current: Try, args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        """Run a plain ``def`` job in one of the worker's threads: the one taken for it
        at its claim (see :mod:`~streamkit.jobs._threads`)."""
        limiter: Any = self.threads.limiter if current.thread is None else current.thread
        return await trio.to_thread.run_sync(
            functools.partial(job.fn, *args, **kwargs),
            limiter=limiter,
            abandon_on_cancel=True,
        )

    def _context(
        self, job: Job[Any, Any], job_id: str, tries: int, claimed: list[Any]
    ) -> JobContext:
        """The :class:`JobContext` of a claimed job's try (claimed: the claim script's
        ``{id, name, args, tries, token, priority, enqueued_ms, headers}``)."""
        enqueued, raw_headers = int(claimed[6] or 0), claimed[7]
        headers: dict[str, str] = {}
        if raw_headers:
            try:
                decoded = orjson.loads(raw_headers)
            except orjson.JSONDecodeError:
                decoded = None
            if isinstance(decoded, dict):
                headers = {str(k): str(v) for k, v in decoded.items()}
        return JobContext(
            id=job_id,
            name=job.name,
            queue=self.queue.name,
            try_number=tries,
            max_tries=job.options.retries + 1,
            enqueued_at=datetime.fromtimestamp(enqueued / 1000, UTC) if enqueued else None,
            headers=headers,
            worker=self.consumer,
            state=self.state,
        )

    async def _call(
        self,
        job: Job[Any, Any],
        current: Try,
        context: JobContext,
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run the job's function through the middleware, outermost first."""

        async def call() -> Any:
            if job.is_async:
                return await job.fn(*args, **kwargs)
            return await self._in_thread(job, current, args, kwargs)

        chain: Callable[[], Awaitable[Any]] = call
        for middleware in reversed(self.middleware):
            chain = functools.partial(middleware, context, chain)
        return await chain()

    def _encode_result(self, name: str, result: Any) -> bytes:
        """The JSON of a job's result, if the queue's ``max_bytes`` allows it.

        Error handling:
            :class:`EncodeError` if it does not encode, or is too big.
        """
        data = dumps(result, f"the result of job {name}")
        if len(data) > self.queue.max_bytes:
            raise EncodeError(
                f"the result of job {name}: {len(data):,} bytes encoded, over the queue's "
                f"limit of {self.queue.max_bytes:,} (max_bytes)"
            )
        return data

    def _failed(
        self,
        current: Try,
        job: Job[Any, Any],
        tries: int,
        failure: Failure,
        exc: BaseException | None = None,
    ) -> None:
        """Record a failed try, retried or dead by :func:`decide`, and log it once: a
        warning if it is retried, an error if the job is dead; with the traceback of
        ``exc``."""
        try:
            verdict = decide(job.options, tries, failure, jitter_draw())
        except Exception as error:  # a backoff that computes no delay: no retry, not a crash
            why = f"its retry's delay could not be computed: {describe(error)}"
            log.error("job %s (%s): %s", current.id, job.name, why, exc_info=error)
            failure = attrs.evolve(failure, unretried=why)
            verdict = Verdict("dead")
        max_tries = job.options.retries + 1
        if verdict.outcome == "retry" and isinstance(exc, Retry):
            log.info(
                "job %s (%s) asked to be retried on try %d of %d; retrying in %gs",
                current.id,
                job.name,
                tries,
                max_tries,
                verdict.delay_ms / 1000,
            )
            self.outbox.put(current, "retry", failure.encode(), verdict.delay_ms)
        elif verdict.outcome == "retry":
            log.warning(
                "job %s (%s) failed on try %d of %d (%s); retrying in %gs",
                current.id,
                job.name,
                tries,
                max_tries,
                failure.why,
                verdict.delay_ms / 1000,
                exc_info=exc,
            )
            self.outbox.put(current, "retry", failure.encode(), verdict.delay_ms)
        else:
            unretried = "" if failure.unretried is None else f", not retried ({failure.unretried})"
            log.error(
                "job %s (%s) failed on try %d of %d (%s)%s; it is dead",
                current.id,
                job.name,
                tries,
                max_tries,
                failure.why,
                unretried,
                exc_info=exc,
            )
            self.outbox.put(current, "dead", failure.encode(), 0)
