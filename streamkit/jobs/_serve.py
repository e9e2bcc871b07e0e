"""The worker side of a job queue: claim jobs, run them, renew their leases, finish
them fenced, and enqueue cron ticks.

Task tree of ``serve_jobs`` (one nursery)::

    serve
    ├── claimer (one per shard)   claim script / blocking read -> the executors' channel
    ├── finisher (one per shard)  fenced finish script for the outcomes of ended tries
    ├── renewer                   extends the leases of running jobs; cancels the tries
    │                             that were aborted or taken over
    ├── executors (concurrency)   run one try each at a time, in a cancel scope
    └── cron (one per cron job)   enqueues each tick with a deterministic job id

Cancelling the nursery is a graceful stop: the tries running then are put back on the
queue without spending a try, in a shielded clean-up.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio
from trio_util import AsyncValue

from .._backoff import Backoff
from .._errors import (
    ConfigError,
    EncodeError,
    GroupExists,
    NoSuchGroup,
    OutcomeUnknown,
    RedisUnavailable,
)
from .._groups import open_service_nursery
from .._json_converter import converter
from .._logs import log_context
from .._meter import TIMING, JobMeter
from .._periodic import next_tick
from .._redis import LuaScript, call_once, retry_idempotent, run_blocking
from .._wire import text
from . import _scripts
from ._handle import Job
from ._model import JobCall, JobOptions, dumps

if TYPE_CHECKING:
    from ._handle import QueueLike

__all__ = ["Handlers", "JobWorker", "progress", "serve_jobs"]

log = logging.getLogger("streamkit.jobs")

Handlers = Iterable[Job] | Mapping[str, Callable[..., Any]]

_CLAIM = LuaScript(_scripts.CLAIM_LUA)
_FINISH = LuaScript(_scripts.FINISH_LUA)
_RENEW = LuaScript(_scripts.RENEW_LUA)
_PROGRESS = LuaScript(_scripts.PROGRESS_LUA)
_RECOVER = LuaScript(_scripts.RECOVER_LUA)

#: How often an idle worker looks for jobs of dead workers (seconds): a job whose
#: worker died is taken over within ``lease_ttl`` plus this.
RECLAIM_INTERVAL = 0.5
#: Longest time one blocking read for new jobs waits.
_BLOCK = 2.0

#: The outcomes of tries counted for streamkit.metrics, by the finish script's name
#: for them (a try put back at a stop, "release", is not counted).
_COUNTED_OUTCOMES = {"ok": "succeeded", "retry": "retried", "dead": "dead", "aborted": "aborted"}
#: The job name counted for jobs of a name this worker does not know.
UNKNOWN_JOB = "(unknown)"


@attrs.define(eq=False)
class _Try:
    """One running try of a job."""

    id: str
    shard: int
    token: str
    job: Job | None
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    abort_reason: str | None = None
    taken_over: bool = False
    finished: bool = False
    started: float = attrs.field(factory=time.perf_counter)


_current: contextvars.ContextVar[tuple[JobWorker, _Try]] = contextvars.ContextVar("streamkit_job")


async def progress(fraction: float, message: str = "") -> None:
    """Report the progress of the running job: ``fraction`` from 0 to 1 and a message.

    Shown by :meth:`JobHandle.info` and ``streamkit jobs show``. Fenced: a try that
    was taken over by another worker reports nothing.

    Error handling:
        ``RuntimeError`` outside a job; :class:`~streamkit.ConfigError` for a fraction
        outside 0..1.
    """
    try:
        runner, current = _current.get()
    except LookupError:
        raise RuntimeError("progress() is called from inside a running job") from None
    if not 0 <= fraction <= 1:
        raise ConfigError("fraction", f"must be from 0 to 1, got {fraction!r}")
    keys = runner.queue.shard_keys[current.shard]
    await retry_idempotent(
        _PROGRESS,
        runner.queue.redis,
        keys.keys,
        (keys.base, current.id, current.token, orjson.dumps([fraction, message])),
        what="reporting progress",
    )


def _error(type_: str, message: str, exc: BaseException | None = None) -> bytes:
    tb = "".join(traceback.format_exception(exc)) if exc is not None else ""
    return orjson.dumps({"type": type_, "message": message, "traceback": tb})


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__
    return (
        cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"
    )


def _retry_delay(options: JobOptions, tries: int) -> int:
    """Milliseconds before try ``tries + 1``: the backoff's ``tries``-th delay."""
    backoff = options.backoff
    delay = min(backoff.initial * backoff.factor ** max(tries - 1, 0), backoff.maximum)
    import random

    return max(1, math.ceil(delay * (1 - backoff.jitter * random.random()) * 1000))


def _as_jobs(queue: QueueLike, handlers: Handlers | None) -> dict[str, Job]:
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
    jobs: dict[str, Job]
    concurrency: int
    limiter: trio.CapacityLimiter
    consumer: str = attrs.field(
        factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    running: dict[str, _Try] = attrs.field(factory=dict)
    #: Slots for jobs not taken: ``concurrency`` minus the jobs claimed and not over.
    free: AsyncValue[int] = attrs.field(init=False)
    # One scope per shard's claimer (a scope may be entered once); drain cancels all.
    _claiming: list[trio.CancelScope] = attrs.field(init=False, factory=list)
    _draining: bool = attrs.field(init=False, default=False)
    # Counts the flushes that got their reply (drain waits on it).
    _flushed: AsyncValue[int] = attrs.field(init=False, factory=lambda: AsyncValue(0))
    _outbox: list[list[Any]] = attrs.field(factory=list)
    _outbox_ready: list[trio.Event] = attrs.field(factory=list)
    _send: trio.MemorySendChannel[tuple[int, list[Any]]] | None = None
    _orphans: set[int] = attrs.field(factory=set)
    # Tries ended, by job and outcome, and their durations (streamkit.metrics).
    _meter: JobMeter = attrs.field(factory=JobMeter)

    def __attrs_post_init__(self) -> None:
        self.free = AsyncValue(self.concurrency)
        self._outbox = [[] for _ in range(self.queue.shards)]
        self._outbox_ready = [trio.Event() for _ in range(self.queue.shards)]

    # ------------------------------------------------------------------ set-up

    async def ensure_groups(self, shard: int) -> None:
        keys = self.queue.shard_keys[shard]
        for priority in range(3):
            with contextlib.suppress(GroupExists):
                await retry_idempotent(
                    functools.partial(
                        self.queue.redis.xgroup_create,
                        keys.ready(priority),
                        _scripts.GROUP,
                        "0",
                        mkstream=True,
                    ),
                    what="creating a job queue's consumer group",
                )

    # ------------------------------------------------------------------ claiming

    def _slot_freed(self) -> None:
        self.free.value += 1

    async def _wait_free(self) -> None:
        if self.free.value <= 0:
            await self.free.wait_value(lambda free: free > 0)
            # Let the other tries that end in this same moment free their slots too,
            # so that one claim fetches them all.
            await trio.lowlevel.checkpoint()

    async def claimer(self, shard: int) -> None:
        keys = self.queue.shard_keys[shard]
        lease_ms = math.ceil(self.queue.lease_ttl * 1000)
        next_reclaim = 0.0
        delivered: list[Any] = []
        backoff = Backoff()
        failures = 0
        assert self._send is not None
        while True:
            await self._wait_free()
            want = self.free.value
            now = trio.current_time()
            reclaim = now >= next_reclaim
            if reclaim:
                next_reclaim = now + RECLAIM_INTERVAL
            # Shielded: a stop waits for the reply of a claim sent, so that the jobs it
            # claimed are known, and handed back (see release_all). Bounded: a reply
            # later than a lease is as good as lost.
            claiming = trio.CancelScope(
                shield=True, deadline=trio.current_time() + self.queue.lease_ttl
            )
            try:
                with claiming:
                    reply = await call_once(
                        _CLAIM,
                        self.queue.redis,
                        keys.keys,
                        (
                            keys.base,
                            self.consumer,
                            want,
                            lease_ms,
                            "1" if reclaim else "0",
                            self.queue.max_deliveries,
                            self._tokens(shard) if reclaim else b"{}",
                            *delivered,
                        ),
                        what="claiming jobs",
                    )
                if claiming.cancelled_caught:
                    self._orphans.add(shard)
                    failures += 1
                    if failures == 1:
                        log.warning(
                            "claiming jobs: no answer within %gs; retrying", self.queue.lease_ttl
                        )
                    continue
            except NoSuchGroup:
                await self.ensure_groups(shard)
                continue
            except RedisUnavailable as exc:
                # A lost reply may have claimed jobs: hand them back once Redis answers.
                if isinstance(exc, OutcomeUnknown):
                    self._orphans.add(shard)
                failures += 1
                if failures == 1:
                    log.warning("claiming jobs: %s; retrying", exc)
                await trio.sleep(min(backoff.maximum, backoff.initial * 2**failures))
                continue
            if failures:
                log.debug("claiming jobs again after %d failed attempts", failures)
                failures = 0
            delivered = []
            claimed, next_due, server_now = reply
            if shard in self._orphans:
                # Not the jobs of this reply: this worker is about to run them.
                await self.recover(shard, [text(job[0]) for job in claimed])
            for job in claimed:
                self.free.value -= 1
                self._send.send_nowait((shard, job))
            if claimed or self.free.value <= 0:
                continue
            # Nothing to do: wait on the ready streams until something arrives, the
            # next scheduled job is due, or it is time to look for dead workers' jobs.
            wait = next_reclaim - trio.current_time()
            if next_due >= 0:
                wait = min(wait, (next_due - server_now) / 1000)
            wait = min(wait, _BLOCK)
            if wait <= 0.001:
                continue
            block_ms = max(1, round(wait * 1000))
            streams = {keys.ready(p): ">" for p in range(3)}
            try:
                entries = await run_blocking(
                    self.queue.redis,
                    functools.partial(
                        _read_group,
                        consumer=self.consumer,
                        streams=streams,
                        count=want,
                        block_ms=block_ms,
                    ),
                    within=wait + 5.0,
                    what="waiting for jobs",
                )
            except NoSuchGroup:
                await self.ensure_groups(shard)
                continue
            except RedisUnavailable as exc:
                if isinstance(exc, OutcomeUnknown):
                    self._orphans.add(shard)
                # The client's outage log says the outage; the claim that follows
                # says whether jobs were in flight.
                log.debug("waiting for jobs: %s", exc)
                await trio.sleep(backoff.initial)
                continue
            for stream, items in (entries or {}).items():
                priority = int(text(stream)[-1])
                for item in items:
                    delivered.extend((priority, item.identifier, item.field_values.get(b"id", b"")))

    def _tokens(self, shard: int) -> bytes:
        """The tries this worker runs on ``shard``, as JSON: job id -> token."""
        return orjson.dumps({t.id: t.token for t in self.running.values() if t.shard == shard})

    def _forget(self, job_id: str, token: str) -> None:
        """Drop the try of ``job_id`` with ``token`` from the running ones (not a newer
        try of the same job that this worker claimed again meanwhile)."""
        current = self.running.get(job_id)
        if current is not None and current.token == token:
            del self.running[job_id]

    async def recover(self, shard: int, starting: Sequence[str] = ()) -> None:
        """Hand back jobs claimed by a reply that was lost, without spending a try:
        those this worker holds on ``shard`` and neither runs nor is ``starting``."""
        keys = self.queue.shard_keys[shard]
        running = [t.id for t in self.running.values() if t.shard == shard]
        running.extend(starting)
        try:
            handed_back = await retry_idempotent(
                _RECOVER,
                self.queue.redis,
                keys.keys,
                (keys.base, self.consumer, math.ceil(self.queue.lease_ttl * 1000), *running),
                what="handing back jobs of a lost reply",
            )
        except RedisUnavailable as exc:
            log.warning("handing back jobs of a lost reply: %s; trying again later", exc)
            return
        self._orphans.discard(shard)
        if handed_back:
            log.info("handed back %d job(s) claimed by a reply that was lost", handed_back)

    # ------------------------------------------------------------------ running

    async def executor(self, receive: trio.MemoryReceiveChannel[tuple[int, list[Any]]]) -> None:
        async for shard, claimed in receive:
            try:
                # claimed: [job id, name, ...]; the job is in the log context of its try.
                with log_context(job=text(claimed[1]), job_id=text(claimed[0])):
                    await self._run_try(shard, claimed)
            finally:
                self._slot_freed()

    def _finish(self, current: _Try, outcome: str, data: bytes | str, number: int) -> None:
        current.finished = True
        counted = _COUNTED_OUTCOMES.get(outcome)
        if counted is not None:
            seconds = time.perf_counter() - current.started if TIMING.on else None
            name = current.job.name if current.job is not None else UNKNOWN_JOB
            self._meter.count(name, counted, seconds)
        self._outbox[current.shard].append([current.id, current.token, outcome, data, number])
        self._outbox_ready[current.shard].set()

    async def _run_try(self, shard: int, claimed: list[Any]) -> None:
        job_id, name, raw_args, tries, token = (
            text(claimed[0]),
            text(claimed[1]),
            claimed[2],
            int(claimed[3]),
            text(claimed[4]),
        )
        job = self.jobs.get(name)
        current = _Try(job_id, shard, token, job)
        stale = self.running.get(job_id)
        if stale is not None and not stale.finished:
            # A try of it that was taken over and not noticed yet: the job is ours again.
            stale.taken_over = True
            stale.scope.cancel(reason=f"job {job_id} taken over by another worker")
        self.running[job_id] = current
        if job is None:
            known = ", ".join(sorted(self.jobs)) or "none"
            log.error("job %s: no job named %r in this worker (it knows: %s)", job_id, name, known)
            self._finish(
                current, "dead", _error("BadInput", f"no job named {name!r} (known: {known})"), 0
            )
            return
        try:
            args, kwargs = orjson.loads(raw_args)
            job.check_arguments(args, kwargs)
            args, kwargs = _structure(job, args, kwargs)
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            log.error("job %s (%s): bad arguments: %s", job_id, name, exc)
            self._finish(current, "dead", _error("BadInput", f"bad arguments: {exc}"), 0)
            return
        options = job.options
        token_ = _current.set((self, current))
        try:
            if options.timeout is not None:
                current.scope.relative_deadline = options.timeout
            with current.scope:
                try:
                    if job.is_async:
                        result = await job.fn(*args, **kwargs)
                    else:
                        result = await trio.to_thread.run_sync(
                            functools.partial(job.fn, *args, **kwargs),
                            limiter=self.limiter,
                            abandon_on_cancel=True,
                        )
                except Exception as exc:
                    self._failed(current, job, tries, exc)
                    return
            if current.taken_over:
                log.warning(
                    "job %s (%s): taken over by another worker; its try here ended", job_id, name
                )
                current.finished = True
                self._forget(job_id, token)
                return
            if current.scope.cancelled_caught:
                if current.abort_reason is not None:
                    self._finish(current, "aborted", _error("Aborted", current.abort_reason), 0)
                else:
                    why = f"timed out after {options.timeout:g}s"
                    error = _error("Timeout", why)
                    self._retry_or_die(current, job, tries, error, why=why, retryable=True)
                return
            if options.keep_result:
                try:
                    data = dumps(result, f"the result of job {name}")
                except EncodeError as exc:
                    self._finish(current, "dead", _error("EncodeError", str(exc)), 0)
                    return
                self._finish(current, "ok", data, 1)
            else:
                self._finish(current, "ok", b"", 0)
        finally:
            _current.reset(token_)

    def _failed(self, current: _Try, job: Job, tries: int, exc: Exception) -> None:
        if current.taken_over:
            current.finished = True
            self._forget(current.id, current.token)
            return
        name = _type_name(exc)
        self._retry_or_die(
            current,
            job,
            tries,
            _error(name, str(exc), exc),
            why=f"{name}: {exc}",
            retryable=isinstance(exc, job.options.retry_on),
            exc=exc,
        )

    def _retry_or_die(
        self,
        current: _Try,
        job: Job,
        tries: int,
        error: bytes,
        *,
        why: str,
        retryable: bool,
        exc: Exception | None = None,
    ) -> None:
        """Record a failed try, retried or dead, and log it once: a warning if it is
        retried, an error if the job is dead; with the traceback of ``exc``."""
        max_tries = job.options.retries + 1
        if retryable and tries < max_tries:
            delay = _retry_delay(job.options, tries)
            log.warning(
                "job %s (%s) failed on try %d of %d (%s); retrying in %gs",
                current.id,
                job.name,
                tries,
                max_tries,
                why,
                delay / 1000,
                exc_info=exc,
            )
            self._finish(current, "retry", error, delay)
        else:
            unretried = "" if retryable else ", not retried (not in retry_on)"
            log.error(
                "job %s (%s) failed on try %d of %d (%s)%s; it is dead",
                current.id,
                job.name,
                tries,
                max_tries,
                why,
                unretried,
                exc_info=exc,
            )
            self._finish(current, "dead", error, 0)

    # ------------------------------------------------------------------ finishing

    async def finisher(self, shard: int) -> None:
        failures = 0
        while True:
            await self._outbox_ready[shard].wait()
            try:
                await self.flush(shard)
            except RedisUnavailable as exc:
                # The outcomes stay in the outbox (and their leases renewed): try again.
                failures += 1
                if failures == 1:
                    log.warning("finishing jobs: %s; retrying", exc)
                await trio.sleep(min(2.0, 0.05 * 2**failures))
            else:
                if failures:
                    log.info("finishing jobs again after %d failed attempts", failures)
                failures = 0

    async def flush(self, shard: int) -> None:
        """Send the outcomes of ended tries of ``shard`` in one fenced script.

        Error handling:
            On any error or cancellation the outcomes go back to the outbox, to be
            sent again: safe, since a finish that ran already is refused (fenced)
            the second time.
        """
        batch = self._outbox[shard]
        self._outbox[shard] = []
        self._outbox_ready[shard] = trio.Event()
        if not batch:
            return
        keys = self.queue.shard_keys[shard]
        args: list[Any] = [keys.base, math.ceil(self.queue.lease_ttl * 1000)]
        for item in batch:
            args.extend(item)
        try:
            reply = await retry_idempotent(
                _FINISH, self.queue.redis, keys.keys, args, what="finishing jobs"
            )
        except BaseException:
            self._outbox[shard][:0] = batch
            self._outbox_ready[shard].set()
            raise
        for item, committed in zip(batch, reply, strict=True):
            self._forget(item[0], item[1])
            if not committed and item[2] != "release":
                log.warning(
                    "job %s: not recorded: another worker took it over (this worker's lease "
                    "on it had run out)",
                    item[0],
                )
        self._flushed.value += 1

    # ------------------------------------------------------------------ leases

    async def renewer(self) -> None:
        period = min(self.queue.lease_ttl / 3, 1.0)
        start = trio.current_time()
        while True:
            await trio.sleep_until(next_tick(start, period, trio.current_time()))
            try:
                await self.renew()
            except RedisUnavailable as exc:
                # Every renewal period: the client's outage log says the outage once.
                log.debug("renewing job leases: %s", exc)
            except trio.TooSlowError:
                # Redis hung for a whole lease; the next renewal finds the jobs another
                # worker took over meanwhile, and cancels their tries here.
                log.warning(
                    "renewing job leases: no answer within %gs (lease_ttl)", self.queue.lease_ttl
                )

    async def renew(self) -> None:
        per_shard: dict[int, list[Any]] = {}
        for current in list(self.running.values()):
            per_shard.setdefault(current.shard, []).extend((current.id, current.token))
        for shard, pairs in per_shard.items():
            keys = self.queue.shard_keys[shard]
            with trio.move_on_after(self.queue.lease_ttl / 2) as attempt:
                lost, aborts = await retry_idempotent(
                    _RENEW,
                    self.queue.redis,
                    keys.keys,
                    (keys.base, self.consumer, *pairs),
                    what="renewing job leases",
                    give_up_after=self.queue.lease_ttl / 2,
                )
            if attempt.cancelled_caught:
                log.warning("renewing job leases: no answer from Redis; retrying")
                continue
            for job_id in lost:
                taken = self.running.get(text(job_id))
                if taken is not None and not taken.finished:
                    taken.taken_over = True
                    taken.scope.cancel(reason=f"job {taken.id} taken over by another worker")
            for job_id, reason in aborts:
                aborted = self.running.get(text(job_id))
                if aborted is not None and not aborted.finished and aborted.abort_reason is None:
                    aborted.abort_reason = text(reason)
                    log.info("job %s: aborted (%s)", aborted.id, aborted.abort_reason)
                    aborted.scope.cancel(reason=f"job aborted: {aborted.abort_reason}")

    # ------------------------------------------------------------------ stopping

    @property
    def running_jobs(self) -> int:
        """Jobs claimed by this worker and not over yet."""
        return self.concurrency - int(self.free.value)

    async def drain(self, grace: float | None = None) -> bool:
        """Stop taking jobs and wait, up to ``grace`` seconds (``None``: as long as
        it takes), for the running ones to end and their outcomes to be recorded.

        Cancelling :meth:`JobQueue.serve` afterwards puts back the jobs still
        running then, without spending a try.

        Returns:
            whether every running job ended within ``grace``.
        """
        if not self._draining:
            log.debug("draining: taking no more jobs; %d running", self.running_jobs)
        self._draining = True
        for scope in self._claiming:
            scope.cancel("draining the job worker")
        with trio.move_on_after(math.inf if grace is None else grace):
            await self.free.wait_value(self.concurrency)
            # Every try has ended; wait for their outcomes to be recorded (by the
            # finishers, or here).
            while self.running:
                for shard in range(self.queue.shards):
                    await self.flush(shard)
                if self.running:
                    await self._flushed.wait_transition()
            return True
        log.info("draining: %d jobs still running after %gs", self.running_jobs, grace)
        return False

    async def _claim_until_drained(self, shard: int) -> None:
        scope = trio.CancelScope()
        if self._draining:
            scope.cancel("draining the job worker")
        self._claiming.append(scope)
        with scope:
            await self.claimer(shard)

    async def release_all(self) -> None:
        """Flush ended tries, put the running ones back, and hand back the jobs claimed
        and not started (a graceful stop)."""
        for shard in range(self.queue.shards):
            await self.flush(shard)
        for current in list(self.running.values()):
            if not current.finished:
                self._finish(current, "release", b"", 0)
        for shard in range(self.queue.shards):
            await self.flush(shard)
        # Jobs claimed and not started (left in the executors' channel when the stop
        # came) are held in this worker's name too: hand them back, or they would wait
        # for their leases and then count as lost.
        for shard in range(self.queue.shards):
            keys = self.queue.shard_keys[shard]
            running = [t.id for t in self.running.values() if t.shard == shard]
            await retry_idempotent(
                _RECOVER,
                self.queue.redis,
                keys.keys,
                (keys.base, self.consumer, math.ceil(self.queue.lease_ttl * 1000), *running),
                what="handing back jobs claimed and not started",
            )


async def _read_group(
    redis: Any, *, consumer: str, streams: dict[str, str], count: int, block_ms: int
) -> Any:
    return await redis.xreadgroup(_scripts.GROUP, consumer, streams, count=count, block=block_ms)


def _structure(
    job: Job, args: list[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Arguments annotated with attrs classes (records) become instances again."""
    structured = _structured_params(job)
    if not structured:
        return args, kwargs
    bound = job.signature.bind(*args, **kwargs)
    for name, annotation in structured.items():
        if name in bound.arguments:
            bound.arguments[name] = converter.structure(bound.arguments[name], annotation)
    return list(bound.args), dict(bound.kwargs)


@functools.cache
def _structured_params(job: Job) -> dict[str, type]:
    import typing

    try:
        hints = typing.get_type_hints(job.fn)
    except Exception:
        return {}
    return {
        name: hint
        for name, hint in hints.items()
        if name != "return" and isinstance(hint, type) and attrs.has(hint)
    }


async def _cron(queue: QueueLike, job: Job) -> None:
    """Enqueue each tick of ``job``'s schedule once, with a job id per tick."""
    from croniter import croniter

    schedule = job.schedule
    assert schedule is not None
    now = datetime.now(UTC)
    previous: datetime = croniter(schedule.expression, now).get_prev(datetime)
    late = (now - previous).total_seconds()
    if late <= schedule.misfire_grace:
        await _enqueue_tick(queue, job, previous)
    else:
        handle = queue.handle(_tick_id(job, previous))
        exists = await retry_idempotent(
            queue.redis.exists,
            [queue.shard_keys[handle.shard].job(handle.id)],
            what="checking a cron tick",
        )
        if not exists:
            log.info(
                "cron job %s: skipped the tick of %s, missed while no worker ran "
                "(%.0fs late; misfire_grace is %gs)",
                job.name,
                previous.isoformat(),
                late,
                schedule.misfire_grace,
            )
    tick = croniter(schedule.expression, previous).get_next(datetime)
    while True:
        # Wall-clock times: sleep, then look at the clock again (it may have moved).
        wait = (tick - datetime.now(UTC)).total_seconds()
        if wait > 0:
            await trio.sleep(wait)
            continue
        await _enqueue_tick(queue, job, tick)
        tick = croniter(schedule.expression, tick).get_next(datetime)


def _tick_id(job: Job, tick: datetime) -> str:
    return f"cron:{job.name}:{int(tick.timestamp())}"


async def _enqueue_tick(queue: QueueLike, job: Job, tick: datetime) -> None:
    try:
        await queue.enqueue_calls(job, [JobCall(job_id=_tick_id(job, tick))])
    except RedisUnavailable as exc:
        log.warning("cron job %s: could not enqueue the tick of %s: %s", job.name, tick, exc)
    else:
        log.debug("cron job %s: tick %s", job.name, tick.isoformat())


async def serve_jobs(
    queue: QueueLike,
    handlers: Handlers | None,
    *,
    concurrency: int,
    threads: int,
    task_status: trio.TaskStatus[JobWorker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``queue``'s jobs until cancelled (see :meth:`QueueLike.serve`)."""
    if concurrency < 1:
        raise ConfigError("concurrency", f"must be a positive integer, got {concurrency!r}")
    jobs = _as_jobs(queue, handlers)
    if not jobs:
        raise ConfigError("handlers", f"queue {queue.name!r} has no jobs to run")
    runner = JobWorker(queue, jobs, concurrency, trio.CapacityLimiter(threads))
    for shard in range(queue.shards):
        await runner.ensure_groups(shard)
    send, receive = trio.open_memory_channel[tuple[int, list[Any]]](math.inf)
    runner._send = send
    try:
        with log_context(queue=queue.name):
            log.debug("serving queue %s as consumer %s", queue.name, runner.consumer)
            log.info(
                "serving jobs of queue %s: %s (concurrency %d)",
                queue.name,
                ", ".join(sorted(jobs)),
                concurrency,
            )
            async with open_service_nursery(reason="job worker stopping") as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(runner.executor, receive)
                nursery.start_soon(runner.renewer)
                for shard in range(queue.shards):
                    nursery.start_soon(runner.finisher, shard)
                    nursery.start_soon(runner._claim_until_drained, shard)
                for job in jobs.values():
                    if job.schedule is not None:
                        nursery.start_soon(_cron, queue, job)
                task_status.started(runner)
                await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5.0) as cleanup:
            try:
                await runner.release_all()
            except RedisUnavailable as exc:
                log.warning(
                    "stopping: could not put %d running jobs back (%s); they are taken over "
                    "when their leases run out",
                    len(runner.running),
                    exc,
                )
        if cleanup.cancelled_caught:
            log.warning("stopping: putting running jobs back timed out")
