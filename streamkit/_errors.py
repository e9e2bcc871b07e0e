"""The streamkit exception tree: one root, shallow, with data on each error.

Redis client exceptions never escape streamkit: :mod:`streamkit._redis` translates
them here (``raise ... from exc``) so callers catch streamkit errors only.

Errors about Redis name its server. Where the raiser does not have the URL at hand,
they name the server in use (:func:`current_url`): the innermost
:func:`~streamkit.open_redis` of the calling task. That fact lives here, at the bottom
of the package, so that the URL module above may raise :class:`ConfigError`.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "BackendError",
    "ConfigError",
    "DecodeError",
    "EncodeError",
    "GroupExists",
    "JobError",
    "JobFailed",
    "JobNotFound",
    "LateEvent",
    "LockLost",
    "LockNotAcquired",
    "MetadataMismatch",
    "NoSuchGroup",
    "NotConnected",
    "NotLockOwner",
    "NotPermitted",
    "NotReplicated",
    "OutcomeUnknown",
    "ProcessorHalted",
    "RedisUnavailable",
    "ResultNotKept",
    "ServerRefused",
    "StreamkitError",
    "WrongPartition",
]


class StreamkitError(Exception):
    """Root of every error streamkit raises on purpose.

    Every streamkit error pickles (to cross a process pool, say): it is rebuilt from
    the arguments it was made with, whatever its constructor takes.
    """

    _made_with: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        error = super().__new__(cls, *args)
        error._made_with = (args, kwargs)
        return error

    def __reduce__(self) -> tuple[Any, ...]:
        args, kwargs = self._made_with
        return (_rebuild, (type(self), args, kwargs), self.__dict__)


def _rebuild(cls: type[StreamkitError], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Unpickle an error: make it again with its arguments."""
    return cls(*args, **kwargs)


class ConfigError(StreamkitError, ValueError):
    """A setting, option or argument is invalid.

    Attributes:
        setting: the name of the offending setting or argument.
        reason: what is wrong with it (the message after the setting's name).
    """

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.reason = message


# ------------------------------------------------------- the server in use

#: Shown where no URL is known (code using no client from ``open_redis``).
UNKNOWN_URL = "(unknown URL)"

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "streamkit_redis_url", default=None
)
# Masked URLs of the clients open in this process, with how many are open.
_open: dict[str, int] = {}


@contextlib.contextmanager
def using_url(masked: str) -> Iterator[None]:
    """Make ``masked`` (a URL with its password masked) the one :func:`current_url`
    reports while the block runs.

    :func:`~streamkit.open_redis` wraps its client's lifetime in it, so that errors
    raised by code using the client name its server without being told.
    """
    token = _current.set(masked)
    _open[masked] = _open.get(masked, 0) + 1
    try:
        yield
    finally:
        _open[masked] -= 1
        if not _open[masked]:
            del _open[masked]
        with contextlib.suppress(ValueError):  # exited in another context
            _current.reset(token)


def current_url() -> str:
    """The masked URL of the Redis server in use, for messages.

    The one of the innermost :func:`~streamkit.open_redis` of the calling task (or of
    the task that started it), else the only one open in the process, else
    :data:`UNKNOWN_URL`.
    """
    url = _current.get()
    if url is not None:
        return url
    if len(_open) == 1:
        return next(iter(_open))
    return UNKNOWN_URL


def _known(url: str | None) -> str:
    """``url``, or the masked URL of the client in use for ``None`` or the placeholder
    ``"redis"`` (raised where the URL is not at hand)."""
    if url is None or url == "redis":
        return current_url()
    return url


class RedisUnavailable(StreamkitError):
    """Redis could not be reached (refused, timed out, connection dropped).

    Attributes:
        url: the server address, with any password masked.
    """

    def __init__(self, url: str | None, reason: str) -> None:
        url = _known(url)
        super().__init__(f"Redis at {url} is unavailable: {reason}")
        self.url = url
        self.reason = reason


class OutcomeUnknown(RedisUnavailable):
    """The connection was lost while a command was in flight: it may or may not have run.

    streamkit never sends such a command again on its own unless running it twice is
    harmless (a read, an acknowledgement, an append carrying an idempotency key). When
    you see this error, the command's effect is unknown: check before repeating it.

    Attributes:
        url: the server address, with any password masked.
        reason: what happened to the connection.
    """

    def __init__(self, url: str | None, reason: str) -> None:
        url = _known(url)
        StreamkitError.__init__(
            self,
            f"lost the connection to Redis at {url} while a command was in flight "
            f"({reason}): the command may or may not have run, and was not sent again",
        )
        self.url = url
        self.reason = reason


class ServerRefused(RedisUnavailable):
    """Redis refused a command for a passing reason of its own; the command did not run.

    Redis answers so while it is out of memory (``OOM``, with ``maxmemory`` reached
    under ``maxmemory-policy noeviction``), loading its data set after a restart
    (``LOADING``), busy running a long script (``BUSY``), unable to reach its
    primary (``MASTERDOWN``), a replica after a failover (``READONLY``), without
    enough replicas (``NOREPLICAS``), unable to persist (``MISCONF``), or in a
    cluster reconfiguring itself (``TRYAGAIN``, ``CLUSTERDOWN``). streamkit treats it
    like an outage: components that ride out an unreachable Redis ride this out too,
    and trying again later is safe. A refused Lua script stopped at the refused
    command: streamkit's scripts are safe to run again.

    Attributes:
        url: the server address, with any password masked.
        reason: what the code means, with Redis's own reply.
        code: the refusal's code (``"OOM"``, ``"LOADING"``, ``"READONLY"``, ...).
        what: what the code means, in words (``"out of memory"``).
        hint: what to check or do about it.
    """

    def __init__(self, url: str, code: str, reason: str, *, what: str, hint: str) -> None:
        self.url = url
        self.reason = f"{what} ({code} {reason})"
        StreamkitError.__init__(self, f"Redis at {url} refused the command: {self.reason}; {hint}")
        self.code = code
        self.what = what
        self.hint = hint

    @property
    def out_of_memory(self) -> bool:
        """Whether Redis refused for lack of memory (``OOM``)."""
        return self.code == "OOM"


class NotReplicated(StreamkitError):
    """A write ran on the master, but fewer replicas than asked acknowledged it in time.

    Raised by sends with ``replicas=N`` (``WAIT N timeout`` after the append, on the
    node that took it): the entries *are* in the stream on the master, and may reach
    the replicas later, but a failover before they do would lose them. Sending them
    again would append them twice if they survive; whether to do so is the caller's
    choice (consumers that tolerate duplicates may). Raised too, with none
    acknowledged, when the node became a replica between the write and its ``WAIT``
    (a failover on Redis Cluster): the write ran while it was the master.

    Attributes:
        wanted: the number of replicas asked for.
        acknowledged: the number that acknowledged within the timeout.
        timeout: the timeout, in seconds.
    """

    def __init__(self, wanted: int, acknowledged: int, timeout: float) -> None:
        super().__init__(
            f"the write ran on the master but only {acknowledged} of {wanted} replicas "
            f"acknowledged it within {timeout:g}s: a failover now could lose it"
        )
        self.wanted = wanted
        self.acknowledged = acknowledged
        self.timeout = timeout


class BackendError(StreamkitError):
    """Redis answered a command with an error (wrong type, script error, ...)."""


class GroupExists(BackendError):
    """A consumer group could not be created: it exists already (``BUSYGROUP``)."""


class NoSuchGroup(BackendError):
    """A stream or consumer group a command needs does not exist (``NOGROUP``).

    Also raised for Redis 7's form of the error inside a Lua script, "No such key
    '...' or consumer group '...' in XREADGROUP with GROUP option".
    """


class NotPermitted(BackendError):
    """Redis refused a command by its access control list (``NOPERM``): the user the
    connection logged in as may not run it, or may not touch one of its keys.

    The message names the command (also one run inside a streamkit script) and the ACL
    rule that would allow it; ``docs/security.md`` lists what each role needs.

    Attributes:
        url: the server address, with any password masked.
        kind: what the user may not use: ``"command"``, ``"key"`` or ``"channel"``.
        command: the command, as ACL rules name it (``"xadd"``, ``"xinfo|groups"``),
            or ``None`` where it could not be told.
        user: the user's name where Redis gave it, else ``None``.
    """

    def __init__(
        self,
        url: str,
        kind: str,
        command: str | None,
        *,
        user: str | None = None,
        in_script: bool = False,
    ) -> None:
        who = f"user {user!r}" if user else "the user of this connection"
        where = " in a streamkit script" if in_script else ""
        grant = f"ACL SETUSER {user or '<user>'}"
        if kind == "command" and command is not None:
            problem = f"{who} may not run '{command}'{where} (NOPERM)"
            fix = f"grant it with {grant} +{command}"
        elif kind == "command":
            problem = f"{who} may not run a command{where} (NOPERM)"
            fix = "the server's ACL LOG names it"
        else:
            of = f" of '{command}'" if command is not None else ""
            problem = f"{who} may not access a {kind}{of}{where} (NOPERM)"
            fix = f"the user's {kind} patterns must cover the app's {kind}s"
        super().__init__(
            f"Redis at {url} refused the command: {problem}; {fix} "
            f"(docs/security.md lists what each role needs)"
        )
        self.url = url
        self.kind = kind
        self.command = command
        self.user = user


class EncodeError(StreamkitError, ValueError):
    """A record could not be encoded for a stream."""


class DecodeError(StreamkitError):
    """An entry of a stream could not be decoded into its record type.

    Attributes:
        stream: the stream's name.
        partition: the partition number, or ``None`` where it is not known.
        entry_id: the Redis entry id, or ``None`` where it is not known.
        reason: what was wrong with the entry.
    """

    def __init__(
        self,
        reason: str,
        *,
        stream: str,
        partition: int | None = None,
        entry_id: str | None = None,
    ) -> None:
        where = stream
        if partition is not None:
            where += f" partition {partition}"
        if entry_id is not None:
            where += f" entry {entry_id}"
        super().__init__(f"cannot decode {where}: {reason}")
        self.stream = stream
        self.partition = partition
        self.entry_id = entry_id
        self.reason = reason


class WrongPartition(StreamkitError):
    """A processor wrote a table key that belongs to another partition.

    A table is partitioned like its stream, and a partition's processor may only write
    its own partition's keys: only they are in its hash slot, under its lease.

    Attributes:
        table: the table's name.
        key: the key.
        partition: the partition the key belongs to.
        processing: the partition being processed.
    """

    def __init__(self, table: str, key: object, partition: int, processing: int) -> None:
        super().__init__(
            f"table {table!r}: key {key!r} belongs to partition {partition}, but this "
            f"processor is processing partition {processing}; a processor writes only "
            f"the keys of its own partition (partition the stream by the table's key)"
        )
        self.table = table
        self.key = key
        self.partition = partition
        self.processing = processing


class LateEvent(StreamkitError):
    """An event arrived for windows that had closed (past their end plus the grace).

    Raised by ``WindowedTable.update`` under ``late="dead_letter"``; the exception
    policy then dead-letters the event, whatever its action.

    Attributes:
        table: the windowed table.
        key: the event's key.
        watermark: the partition's watermark (ms since the epoch) when it arrived.
    """

    def __init__(self, table: str, key: object, watermark: int) -> None:
        super().__init__(
            f"windowed table {table!r}: a late event for key {key!r} (every window it "
            f"falls in closed; watermark {watermark} ms)"
        )
        self.table = table
        self.key = key
        self.watermark = watermark


class MetadataMismatch(StreamkitError):
    """A stream is used with settings that differ from those recorded in Redis.

    Raised instead of silently writing events to the wrong partitions or in a
    format the stream's consumers cannot read.

    Attributes:
        stream: the stream's name.
        field: the setting that disagrees (``partition_count``, ``record``, ...).
        recorded: the value recorded in Redis.
        given: the value this process uses.
    """

    def __init__(self, stream: str, field: str, recorded: object, given: object) -> None:
        super().__init__(
            f"stream {stream!r} was created with {field}={recorded} but this process "
            f"uses {field}={given}; use the recorded value, or delete the stream and "
            f"all its events with `streamkit delete-stream MODULE:STREAM` to recreate it"
        )
        self.stream = stream
        self.field = field
        self.recorded = recorded
        self.given = given


class NotConnected(StreamkitError):
    """An app was used before ``async with app:`` connected it to Redis.

    Attributes:
        app: the app's name.
    """

    def __init__(self, app: str) -> None:
        super().__init__(
            f"app {app!r} is not connected to Redis: use it inside `async with app:` "
            f"(the worker does this for you)"
        )
        self.app = app


class LockNotAcquired(StreamkitError):
    """A lock was held by someone else for the whole time we were willing to wait."""

    def __init__(self, name: str) -> None:
        super().__init__(f"lock {name!r} is held by another owner")
        self.name = name


class NotLockOwner(StreamkitError):
    """An extend or release was refused because the lease is no longer ours.

    Attributes:
        name: the lock's name.
        holder_token: the fencing token of the lease that holds the lock now, if one
            does (``None``: it expired or was deleted).
    """

    def __init__(self, name: str, *, holder_token: int | None = None) -> None:
        super().__init__(f"lease on {name!r} is no longer held by this owner")
        self.name = name
        self.holder_token = holder_token


class LockLost(StreamkitError):
    """A held lease was lost: it expired, or the lock changed hands.

    Attributes:
        name: the lock's name.
        reason: why the lease counts as lost.
    """

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"lease on {name!r} lost: {reason}")
        self.name = name
        self.reason = reason


class ProcessorHalted(StreamkitError):
    """A processor failed and its exception policy said to halt.

    The failing events stay pending, so the partition resumes at them once the
    cause is fixed. The processor's exception, if any, is chained as ``__cause__``.

    Attributes:
        stream: the stream's name.
        partition: the partition number.
        entry_ids: the ids of the events being processed when it failed (may be empty).
        reason: why the policy halted.
    """

    def __init__(
        self, reason: str, *, stream: str, partition: int, entry_ids: tuple[str, ...] = ()
    ) -> None:
        where = f"{stream} partition {partition}"
        if entry_ids:
            shown = ", ".join(entry_ids[:3]) + (", ..." if len(entry_ids) > 3 else "")
            where += f" at {shown}"
        super().__init__(f"processor halted on {where}: {reason}")
        self.stream = stream
        self.partition = partition
        self.entry_ids = entry_ids
        self.reason = reason


class JobError(StreamkitError):
    """A job's result could not be had.

    Attributes:
        job_id: the job's id.
    """

    def __init__(self, job_id: str, message: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobFailed(JobError):
    """The job ended without a result: dead (its tries ran out, or bad input),
    aborted, or expired before it started.

    Attributes:
        job_id: the job's id.
        status: ``"dead"``, ``"aborted"`` or ``"expired"``.
        error_type: the name of the exception the job's last try raised (its
            qualified name, e.g. ``"ValueError"``, ``"myapp.errors.Bounce"``), or what
            ended it (``"Timeout"``, ``"Aborted"``, ``"WorkerLost"``,
            ``"DependencyFailed"``, ``"BadInput"``, ``"Expired"``).
        message: that exception's message.
        traceback: the formatted traceback of the last try, as text ("" if none).
    """

    def __init__(
        self, job_id: str, status: str, error_type: str, message: str, traceback: str = ""
    ) -> None:
        text = f"job {job_id} ended {status}: {error_type}"
        if message:
            text += f": {message}"
        super().__init__(job_id, text)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.traceback = traceback


class JobNotFound(JobError):
    """No record of the job: it was never enqueued on this queue, or it finished
    longer ago than its ``result_ttl`` and its record expired.

    Attributes:
        queue: the queue it was looked for on (for several, the first).
    """

    def __init__(self, job_id: str, queue: str, *, hint: str = "") -> None:
        super().__init__(
            job_id,
            f"no job {job_id!r} on queue {queue!r}: never enqueued there, or it finished "
            f"longer ago than its result_ttl and its record expired{hint}",
        )
        self.queue = queue


class ResultNotKept(JobError):
    """The job succeeded, but it was declared with ``keep_result=False``."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            job_id, f"job {job_id} succeeded, but its result was not kept (keep_result=False)"
        )
