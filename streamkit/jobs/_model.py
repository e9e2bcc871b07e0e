"""The job queue's values: statuses, priorities, job declarations, calls and info (pure)."""

from __future__ import annotations

import difflib
import enum
import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypedDict, TypeVar

import attrs
import orjson

from .._backoff import Backoff
from .._defaults import DEFAULT_JOB_MAX_BYTES
from .._errors import ConfigError, EncodeError
from .._json_converter import converter
from .._keys import validate_name
from .._validate import at_least, non_negative_int, positive_int, positive_number
from ._limits import RateLimit, limit_spec, rate_limit as _as_rate_limit

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence


__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_AFTER",
    "PRIORITIES",
    "JobCall",
    "JobChunk",
    "JobErrorInfo",
    "JobEvent",
    "JobInfo",
    "JobOptions",
    "JobOptionsArgs",
    "JobRef",
    "JobStatus",
    "JobTry",
    "P",
    "Priority",
    "R",
    "Schedule",
    "dumps",
]

#: A job's parameters (``Job[P, R]``).
P = ParamSpec("P")
#: What a job returns (what its coroutine returns, for an ``async def``).
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class TypedJob(Protocol[P, R_co]):
    """What a type checker sees of a declared job (a :class:`~streamkit.jobs.Job`):
    its parameters and what it returns. The clients type their handles by it."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any: ...

    def _returns(self) -> R_co: ...


Priority = Literal["high", "normal", "low"]
#: Priority name -> the number of its ready stream (lower runs first).
PRIORITIES: dict[str, int] = {"high": 0, "normal": 1, "low": 2}

#: Tries after the first, by default (as fennel's ``default_retries``): a try lost
#: with its worker counts, so a job survives a crash or two of its worker.
DEFAULT_RETRIES = 3
#: How long a job's record (and result) is kept after it finished, by default.
DEFAULT_RESULT_TTL = 24 * 3600.0
#: Retry delays by default: 1 s, 2 s, 4 s ... up to 5 minutes, each cut by up to half
#: at random so that jobs that failed together do not retry together.
DEFAULT_RETRY_BACKOFF = Backoff(initial=1.0, maximum=300.0, factor=2.0, jitter=0.5)
#: How long ``job_id=`` dedupes enqueues, by default.
DEFAULT_DEDUPE_WINDOW = 24 * 3600.0
#: The largest encoded arguments, or result, of a job (bytes), by default: 1 MiB, the
#: smallest ``proto-max-bulk-len`` a Redis server accepts, so it fits any server.
DEFAULT_MAX_BYTES = DEFAULT_JOB_MAX_BYTES
#: The most jobs one job may depend on (``after=``): settling them is bounded work.
MAX_AFTER = 1000


def _unstructure(value: object) -> object:
    if attrs.has(type(value)):
        return converter.unstructure(value)
    if isinstance(value, set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def dumps(value: object, what: str) -> bytes:
    """JSON of ``value`` (attrs instances as dicts); :class:`EncodeError` if impossible."""
    try:
        return orjson.dumps(value, default=_unstructure)
    except RecursionError:
        raise EncodeError(f"{what}: nested too deeply") from None
    except Exception as exc:  # orjson's TypeError, or whatever an unstructure hook raised
        try:
            reason = str(exc)
        except Exception:
            reason = f"{type(exc).__name__} whose str() failed"
        if reason == "Dict key must be str":  # orjson's words
            reason = "a dict key that is not a str (a job's arguments are JSON: str keys only)"
        raise EncodeError(f"{what}: {reason}") from None


class JobRef(Protocol):
    """Anything naming a job on a queue shard (a :class:`JobHandle`): a ``queue``
    attribute too (a queue, or its name) says which queue, else it is the enqueuer's."""

    @property
    def id(self) -> str: ...

    @property
    def shard(self) -> int: ...


class JobStatus(enum.StrEnum):
    """Where a job is in its life.

    ``SENT -> EXECUTING -> SUCCESS`` is the happy path; a failed try goes to
    ``RETRY`` (waiting for its next try) or, when its tries ran out, to ``DEAD`` (the
    dead-letter queue). ``SCHEDULED`` jobs wait for their time, ``WAITING`` jobs for
    the jobs they depend on, ``HELD`` jobs for a rate limit, a concurrency limit or
    the end of a pause. ``ABORTED`` and ``EXPIRED`` jobs never finished.
    """

    SCHEDULED = "scheduled"
    WAITING = "waiting"
    HELD = "held"
    SENT = "sent"
    EXECUTING = "executing"
    RETRY = "retry"
    SUCCESS = "success"
    DEAD = "dead"
    ABORTED = "aborted"
    EXPIRED = "expired"

    @property
    def final(self) -> bool:
        """Whether the job is over (no more tries will run)."""
        return self in _FINAL


_FINAL = frozenset({JobStatus.SUCCESS, JobStatus.DEAD, JobStatus.ABORTED, JobStatus.EXPIRED})


@attrs.frozen
class JobErrorInfo:
    """The error that ended a job's try.

    Attributes:
        type: the exception's qualified name, or what ended the try (``"Timeout"``,
            ``"WorkerLost"``, ``"BadInput"``, ``"EncodeError"``, ``"OutcomeRefused"``,
            ``"Aborted"``, ``"DependencyFailed"``).
        message: its message.
        traceback: the formatted traceback, "" if there is none.
    """

    type: str
    message: str
    traceback: str = ""


@attrs.frozen(kw_only=True)
class JobTry:
    """One try of a job, as the job's record keeps it (see :attr:`JobInfo.history`).

    Attributes:
        number: which try it was (1 for the first); a try put back without being
            spent (its worker stopped gracefully) is started again with the same
            number.
        started_at: when it started (the Redis server's clock).
        worker: the worker (consumer) that ran it.
        ended_at: when it ended, or ``None`` while it runs.
        outcome: how it ended: ``"success"``, ``"retry"`` (failed, tried again),
            ``"dead"`` (failed, no try left), ``"aborted"``, ``"released"`` (put back
            when its worker stopped; not spent), ``"lost"`` (its worker died), or
            ``None`` while it runs.
        error_type: the type of the error it failed with, if it failed.
    """

    number: int
    started_at: datetime | None
    worker: str | None
    ended_at: datetime | None = None
    outcome: str | None = None
    error_type: str | None = None


@attrs.frozen(kw_only=True)
class JobInfo:
    """What a queue knows of one job (see :meth:`JobHandle.info`).

    Attributes:
        id: the job's id.
        queue: its queue's name.
        name: its job name (the function that runs it).
        status: where it is in its life.
        args: its positional arguments.
        kwargs: its keyword arguments.
        priority: ``"high"``, ``"normal"`` or ``"low"``.
        tries: times it was started.
        max_tries: times it may be started (retries + 1).
        enqueued_at: when it was enqueued (the Redis server's clock).
        due_at: when a delayed job becomes due, if it was delayed.
        started_at: when its last try started.
        finished_at: when it ended.
        expires_at: when it expires unless started, if it does.
        worker: the worker (consumer) that ran its last try.
        error: the error of its last failed try.
        progress: the fraction its running try reported, from 0 to 1.
        progress_message: the message reported with it.
        progress_value: the value its try reported with
            :meth:`JobContext.progress <streamkit.jobs.JobContext.progress>`, if any.
        lost: times a worker died while running it.
        history: its tries, oldest first: the newest 2 KB or so of them (about 20
            tries) are kept in its record.
        held_by: what holds a ``held`` job back: a rate limit, a concurrency limit
            or a pause, e.g. ``"concurrency 1 of sync_account:acct-7"``.
        limit_key: its limit key, for a job with limits per key.
        headers: the headers it was enqueued with (trace context among them).
        replayed_at: when it was last queued again from the dead letters (its tries
            then began again from 1), if it was.
    """

    id: str
    queue: str
    name: str
    status: JobStatus
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    priority: Priority
    tries: int
    max_tries: int
    enqueued_at: datetime | None
    due_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    expires_at: datetime | None
    worker: str | None
    error: JobErrorInfo | None
    progress: float | None
    progress_message: str | None
    lost: int
    history: tuple[JobTry, ...] = ()
    held_by: str | None = None
    limit_key: str | None = None
    headers: dict[str, str] = attrs.field(factory=dict)
    progress_value: Any = None
    replayed_at: datetime | None = None


@attrs.frozen
class JobChunk:
    """One chunk a job streamed (see :meth:`JobHandle.stream
    <streamkit.jobs.JobHandle.stream>`).

    Attributes:
        value: what the job passed to ``current_job().stream``, as its JSON decodes.
        try_number: the try that streamed it (a retried job's next try streams again
            from its own start).
        id: its entry id in the output stream: pass it as ``after=`` to resume after it.
    """

    value: Any
    try_number: int
    id: str


@attrs.frozen
class JobEvent:
    """A state change of a job (see :meth:`JobQueue.events
    <streamkit.jobs.JobQueue.events>`).

    Attributes:
        kind: ``"enqueued"``, ``"started"``, ``"progress"``, ``"retried"``,
            ``"released"`` (put back at a stop), ``"succeeded"``, ``"dead"``,
            ``"aborted"`` or ``"expired"``.
        job_id: the job's id.
        name: its job name.
        at: when it happened (the Redis server's clock).
        detail: what the change carries: the try number for ``started``, the value
            for ``progress``, the error (``{"type", "message", ...}``) for ``retried``
            and ``dead``; ``None`` otherwise.
        shard: the queue shard of the job.
        id: the event's place in its shard's event stream: its entry's id, with ``.N``
            after it for the Nth event of an entry holding several (a script call that
            changes many jobs, a claim or a finish, writes their events as one entry).
        cursor: where a reader was after this event, in every shard: pass it as
            ``after=`` to resume after it.
    """

    kind: str
    job_id: str
    name: str
    at: datetime
    detail: Any
    shard: int
    id: str
    cursor: str


When = timedelta | float | int


def _check_priority(_i: object, _a: object, value: object) -> None:
    if value not in PRIORITIES:
        raise ConfigError("priority", f"must be 'high', 'normal' or 'low', got {value!r}")


@attrs.frozen(kw_only=True)
class JobCall:
    """One job to enqueue with :meth:`Job.enqueue_many`, with options of its own.

    Attributes:
        args: positional arguments of the job.
        kwargs: keyword arguments of the job.
        job_id: makes the enqueue idempotent (see :meth:`Job.enqueue`).
        delay: run no sooner than this long from now.
        at: run no sooner than this time.
        priority: overrides the job's priority.
        expires: give up unless started within this long (or by this time).
        after: jobs that must succeed first.
        headers: text values carried to the job (its :class:`JobContext`), such as
            trace context.
    """

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    job_id: str | None = None
    delay: When | None = None
    at: datetime | None = None
    priority: Priority | None = attrs.field(
        default=None, validator=attrs.validators.optional(_check_priority)
    )
    expires: When | datetime | None = None
    after: Sequence[JobRef | str] = ()
    headers: Mapping[str, str] | None = None


@attrs.frozen(kw_only=True)
class Schedule:
    """A cron schedule of a job (see :meth:`JobQueue.cron`).

    Attributes:
        expression: a crontab expression, e.g. ``"*/5 * * * *"``.
        misfire_grace: a tick missed while no worker ran is still run if it is at most
            this many seconds late; an older one is skipped with a log line.
        tz: the timezone of its times, an IANA name such as ``"Europe/Paris"``
            (``None``: UTC).
    """

    expression: str
    misfire_grace: float = attrs.field(default=60.0, validator=positive_number)
    tz: str | None = None


def _seconds(value: object) -> object:
    """A duration as seconds: a ``timedelta``'s, else the value itself (checked after)."""
    return value.total_seconds() if isinstance(value, timedelta) else value


#: The shortest debounce, max_wait or throttle period (the scripts count in ms).
_MIN_PERIOD = at_least(0.001, finite=True).or_none()


def _check_retry_on(_i: object, _a: object, value: object) -> None:
    if not isinstance(value, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in value
    ):
        raise ConfigError("retry_on", f"must be a tuple of exception types, got {value!r}")


def _check_backoff(_i: object, _a: object, value: object) -> None:
    # Checked here, not at a failure: a worker computes a retry's delay from it.
    if not isinstance(value, Backoff):
        raise ConfigError(
            "backoff",
            f"must be a streamkit.Backoff (Backoff(initial=1.0, maximum=300.0), say), "
            f"got {value!r}",
        )


class JobOptionsArgs(TypedDict, total=False):
    """The options of :meth:`JobQueue.job` as keyword arguments, for typing the
    ``**options`` of its overloads (see :class:`JobOptions` for each)."""

    retries: int
    timeout: float | None
    retry_on: tuple[type[BaseException], ...]
    backoff: Backoff
    priority: Priority
    result_ttl: float
    keep_result: bool
    expires: float | None
    dedupe_window: float
    rate_limit: RateLimit | str | None
    concurrency: int | None
    limit_key: str | Callable[..., Any] | None
    key_rate_limit: RateLimit | str | None
    key_concurrency: int | None
    grace: float | None
    debounce: timedelta | float | None
    max_wait: timedelta | float | None
    key: str | Callable[..., Any] | None
    throttle: timedelta | float | None


class AppJobOptionsArgs(JobOptionsArgs, total=False):
    """The options of :meth:`App.job <streamkit.App.job>`: a queue's, and the app's
    queue the job is routed to."""

    queue: str | None


@attrs.frozen(kw_only=True)
class JobOptions:
    """How a job runs. See :meth:`JobQueue.job` for each option."""

    retries: int = attrs.field(default=DEFAULT_RETRIES, validator=non_negative_int)
    timeout: float | None = attrs.field(default=None, validator=positive_number.or_none())
    retry_on: tuple[type[BaseException], ...] = attrs.field(
        default=(Exception,), validator=_check_retry_on
    )
    backoff: Backoff = attrs.field(default=DEFAULT_RETRY_BACKOFF, validator=_check_backoff)
    priority: Priority = attrs.field(default="normal", validator=_check_priority)
    result_ttl: float = attrs.field(default=DEFAULT_RESULT_TTL, validator=positive_number)
    keep_result: bool = True
    expires: float | None = attrs.field(default=None, validator=positive_number.or_none())
    dedupe_window: int = attrs.field(
        default=int(DEFAULT_DEDUPE_WINDOW), converter=math.ceil, validator=positive_int
    )
    rate_limit: RateLimit | None = attrs.field(default=None, converter=_as_rate_limit)
    concurrency: int | None = attrs.field(default=None, validator=positive_int.or_none())
    limit_key: str | Callable[..., Any] | None = attrs.field(default=None)
    key_rate_limit: RateLimit | None = attrs.field(default=None, converter=_as_rate_limit)
    key_concurrency: int | None = attrs.field(default=None, validator=positive_int.or_none())
    queue: str | None = attrs.field(default=None)
    grace: float | None = attrs.field(default=None, validator=positive_number.or_none())
    debounce: float | None = attrs.field(default=None, converter=_seconds, validator=_MIN_PERIOD)
    max_wait: float | None = attrs.field(default=None, converter=_seconds, validator=_MIN_PERIOD)
    key: str | Callable[..., Any] | None = attrs.field(default=None)
    throttle: float | None = attrs.field(default=None, converter=_seconds, validator=_MIN_PERIOD)
    #: The job record's ``lim`` field (see :func:`~streamkit.jobs._limits.limit_spec`).
    limits: str = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        keyed = self.key_rate_limit is not None or self.key_concurrency is not None
        if keyed and self.limit_key is None:
            raise ConfigError("limit_key", "key_rate_limit and key_concurrency need a limit_key")
        if self.limit_key is not None and not keyed:
            raise ConfigError("limit_key", "needs key_rate_limit or key_concurrency")
        if self.limit_key is not None and not (
            isinstance(self.limit_key, str) or callable(self.limit_key)
        ):
            raise ConfigError(
                "limit_key", f"must be a parameter name or a function, got {self.limit_key!r}"
            )
        if self.queue is not None:
            validate_name("queue", self.queue)
        self._check_coalescing()
        object.__setattr__(
            self,
            "limits",
            limit_spec(
                self.rate_limit, self.concurrency, self.key_rate_limit, self.key_concurrency
            ),
        )

    def _check_coalescing(self) -> None:
        if self.debounce is not None and self.throttle is not None:
            raise ConfigError("debounce", "a job is debounced or throttled, not both")
        if self.max_wait is not None:
            if self.debounce is None:
                raise ConfigError("max_wait", "bounds a debounce: give debounce= too")
            if self.max_wait < self.debounce:
                raise ConfigError(
                    "max_wait",
                    f"must be at least the debounce ({self.debounce:g} s), got {self.max_wait:g}",
                )
        if self.key is not None:
            if self.coalesced is None:
                raise ConfigError("key", "is the key of debounce= or throttle=: give one of them")
            if not (isinstance(self.key, str) or callable(self.key)):
                raise ConfigError(
                    "key", f"must be a parameter name or a function, got {self.key!r}"
                )
        if self.coalesced is not None and self.limit_key is not None:
            raise ConfigError(
                "limit_key",
                "a debounced or throttled job cannot have per-key limits (its key places it)",
            )

    @property
    def coalesced(self) -> str | None:
        """``"debounce"`` or ``"throttle"`` for a job declared so, else ``None``."""
        if self.debounce is not None:
            return "debounce"
        return "throttle" if self.throttle is not None else None

    @classmethod
    def taken(cls, options: Mapping[str, Any], *, by: str, routing: bool) -> JobOptions:
        """The options a user gave ``by`` (``"App.job"``, say), checked: an unknown
        one is a ``TypeError`` naming ``by`` and the options meant, if some are close;
        ``queue`` is known where ``routing`` (an App's jobs, not a queue's)."""
        known = [a.name for a in attrs.fields(cls) if a.init and (routing or a.name != "queue")]
        for name in options:
            if name not in known:
                close = " or ".join(map(repr, difflib.get_close_matches(name, known, n=2)))
                hint = f"; did you mean {close}?" if close else ""
                raise TypeError(f"{by}() got an unexpected keyword argument {name!r}{hint}")
        return cls(**options)

    @property
    def limited_by_name(self) -> bool:
        """Whether a limit of the job's name applies (its jobs then share one shard)."""
        return self.rate_limit is not None or self.concurrency is not None
