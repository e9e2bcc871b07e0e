"""The one Redis layer: builds clients, owns their connections, decides retries, translates errors.

Every other module talks to Redis through a client from :func:`open_redis` and wraps
its commands in :func:`redis_errors`, so no coredis exception reaches users.

Connections. A client from :func:`open_redis` has two connection pools:

* the *shared* pool carries simple commands (``GET``, ``EVALSHA``, ``XADD``, ...),
  multiplexed: many tasks' commands are in flight on one connection at once. Cancelling
  such a command never touches the connection; its reply is read and dropped.
* *dedicated* connections carry every command that holds a connection for its whole
  run: blocking commands (``XREAD``, ``XREADGROUP``, ``BLPOP``, ``BLMOVE``,
  ``BZPOPMIN``, ...), pipelines and transactions. While such a command runs, its
  connection carries nothing else. Cancelling it discards that connection (the server
  may still be blocked on it) and frees its slot; no other command is touched.

coredis 6.9 sends blocking commands over the shared pool and, when one is cancelled,
drops a connection that other tasks' commands may be in flight on, and never gives the
pool slot back (after 64 cancellations the pool is empty and every command waits
forever). :class:`_Pool` fixes the slot accounting; :class:`_Client` routes
connection-holding commands to the dedicated pool. See ``docs/redis.md``.

Retries. coredis is told never to retry (its default re-sends a command whose
connection was lost, although Redis may have run it). A lost connection surfaces as
:class:`~streamkit.OutcomeUnknown` when the command may have reached Redis, as plain
:class:`~streamkit.RedisUnavailable` when it surely did not. Retrying is decided here:
:func:`retry_idempotent` for operations that may run twice (reads, acknowledgements,
idempotent scripts), :func:`call_once` for the others (retried only while they surely
never reached Redis).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import re
import socket
import ssl
import time
import urllib.parse
import weakref
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import attrs
import coredis
import coredis.exceptions
import trio
from coredis.connection import BaseConnection
from coredis.pool import ConnectionPool
from coredis.retry import NoRetryPolicy

from ._backoff import Backoff, retry_unavailable
from ._errors import (
    BackendError,
    ConfigError,
    GroupExists,
    NoSuchGroup,
    OutcomeUnknown,
    RedisUnavailable,
    ServerRefused,
    StreamkitError,
)
from ._groups import leaves
from ._urls import current_url, mask_url, using_url

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

    from coredis.commands import CommandRequest
    from coredis.patterns.pipeline import Pipeline

__all__ = [
    "Redis",
    "RedisStatistics",
    "as_unavailable",
    "call_once",
    "mask_url",
    "open_redis",
    "redis_errors",
    "redis_statistics",
    "retry_idempotent",
    "run_blocking",
]

Redis: TypeAlias = "coredis.Redis[bytes]"

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_CONNECT_TIMEOUT = 2.0
# Slots of each pool (shared and dedicated). Connections are opened lazily, when a
# command finds no idle one: a pool holds as many as were ever in use at once.
DEFAULT_MAX_CONNECTIONS = 64
# How long retry_idempotent (and the producer's idempotent append) keep retrying.
DEFAULT_RETRY_FOR = 5.0
# Command-level retries start fast: a lost connection is usually replaced at once.
RETRY_BACKOFF = Backoff(initial=0.02, maximum=0.5)
# Seconds after a lost connection was reported during which further losses are only
# counted (and logged at debug level).
LOSS_REPORT_INTERVAL = 10.0

log = logging.getLogger("streamkit.redis")

# coredis ConnectionErrors raised before the command was handed to a connection: the
# connection could not be opened, was found broken when the command was queued, or no
# pool slot came free in time.
_NOT_SENT_MESSAGES = (
    "Unable to establish a connection",
    "Connection not usable",
    "Connection pool exhausted",
)

# Errors meaning the connection was lost (or never answered) with the command in flight.
_LOST = (
    coredis.exceptions.ConnectionError,
    ConnectionError,
    TimeoutError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)


def _cancelled_in(exc: BaseException | None, depth: int = 0) -> bool:
    if exc is None or depth > 10:
        return False
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup) and any(
        _cancelled_in(e, depth + 1) for e in exc.exceptions
    ):
        return True
    return _cancelled_in(exc.__cause__ or exc.__context__, depth + 1)


class _NoCancelledConnectNoise(logging.Filter):
    """Drops coredis's ERROR record for a connection attempt that was cancelled.

    coredis logs "Connection attempt failed unexpectedly!" with a traceback when the
    command that opens a connection is cancelled during the handshake: nothing failed.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            return not _cancelled_in(record.exc_info[1])
        return True


if not any(isinstance(f, _NoCancelledConnectNoise) for f in logging.getLogger("coredis").filters):
    logging.getLogger("coredis").addFilter(_NoCancelledConnectNoise())


# ----------------------------------------------------------------------------- errors


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _not_sent(exc: BaseException) -> bool:
    return isinstance(exc, coredis.exceptions.ConnectionError) and str(exc).startswith(
        _NOT_SENT_MESSAGES
    )


def _group_error(exc: coredis.exceptions.RedisError) -> BackendError | None:
    text = str(exc)
    if isinstance(exc, coredis.exceptions.StreamDuplicateConsumerGroupError) or (
        "BUSYGROUP" in text
    ):
        return GroupExists(text)
    # Redis 7 reports a missing group inside a script as "No such key '...' or consumer
    # group '...' in XREADGROUP with GROUP option"; coredis keeps the NOGROUP code as
    # the exception's type only.
    if isinstance(exc, coredis.exceptions.StreamConsumerGroupError) or (
        "NOGROUP" in text or ("No such key" in text and "consumer group" in text)
    ):
        return NoSuchGroup(text)
    return None


# Replies by which Redis refuses a command for a passing reason of its own: the command
# did not run (a script stopped at the refused command), and it may succeed later. Each
# code: what it means, and what to check.
_REFUSALS: dict[str, tuple[str, str]] = {
    "OOM": (
        "out of memory",
        "raise maxmemory or free memory; appends then trim what consumers have processed",
    ),
    "LOADING": ("loading its data set", "wait until the server has loaded its data"),
    "BUSY": (
        "busy running a script or function",
        "wait for it to end, or stop it with SCRIPT KILL / FUNCTION KILL",
    ),
    "MASTERDOWN": (
        "a replica that lost its primary",
        "check the primary and replication, or point streamkit at the primary",
    ),
    "READONLY": (
        "a read-only replica",
        "point streamkit at the primary (after a failover, the old primary is a replica)",
    ),
    "NOREPLICAS": ("not enough replicas to write", "check the replicas (min-replicas-to-write)"),
    "MISCONF": ("unable to persist to disk", "check the Redis server's disk and its log"),
    "TRYAGAIN": ("moving a cluster slot", "wait for the resharding to end"),
    "CLUSTERDOWN": ("a cluster that is down", "check the cluster's state"),
    "UNBLOCKED": (
        "a blocking command unblocked by a role change",
        "check for a failover, and that streamkit points at the primary",
    ),
    "MAXCLIENTS": (
        "too many clients",
        "raise the server's maxclients, or run fewer clients (max_connections)",
    ),
}

# coredis strips these codes from the message and says them by the exception's type.
_REFUSAL_TYPES: tuple[tuple[type[BaseException], str], ...] = (
    (coredis.exceptions.BusyLoadingError, "LOADING"),
    (coredis.exceptions.ReadOnlyError, "READONLY"),
    (coredis.exceptions.TryAgainError, "TRYAGAIN"),
    (coredis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (coredis.exceptions.UnblockedError, "UNBLOCKED"),
)

# coredis prefixes an error of a pipeline's command with the command.
_PIPELINE_PREFIX = re.compile(r"^Command # \d+ \(.*?\) of pipeline caused error: ", re.DOTALL)


def _refusal(exc: BaseException, url: str) -> ServerRefused | None:
    """``exc`` as :class:`ServerRefused` if it is one of Redis's passing refusals."""
    if not isinstance(exc, coredis.exceptions.RedisError):
        return None
    text = _PIPELINE_PREFIX.sub("", str(exc), count=1).strip()
    code = next((c for t, c in _REFUSAL_TYPES if isinstance(exc, t)), None)
    if code is None:
        if isinstance(exc, coredis.exceptions.ConnectionError) and text.startswith(
            "max number of clients reached"
        ):
            code = "MAXCLIENTS"
        else:
            first, _, rest = text.partition(" ")
            if first not in _REFUSALS:
                return None
            code, text = first, rest
    elif text.startswith(code + " "):
        text = text[len(code) + 1 :]
    what, hint = _REFUSALS[code]
    return ServerRefused(mask_url(url), code, text.rstrip(". ") or code, what=what, hint=hint)


def _translate(exc: BaseException, url: str) -> StreamkitError | None:
    if isinstance(exc, StreamkitError):
        return exc
    masked = mask_url(url)
    refused = _refusal(exc, url)
    if refused is not None:
        # Redis refused the command (out of memory, loading, a replica, ...): it did
        # not run, and may succeed later.
        return refused
    if _not_sent(exc):
        return RedisUnavailable(masked, _reason(exc))
    if isinstance(exc, _LOST):
        return OutcomeUnknown(masked, _reason(exc))
    if isinstance(exc, coredis.exceptions.AuthenticationError):
        return RedisUnavailable(masked, f"authentication failed: {exc}")
    if isinstance(exc, coredis.exceptions.RedisError):
        return _group_error(exc) or BackendError(str(exc))
    if isinstance(exc, BaseExceptionGroup):
        # coredis runs its pool in a task group, so a dropped connection can arrive
        # wrapped in a group. Unwrap it when every leaf is a Redis error.
        translated = [_translate(e, url) for e in exc.exceptions]
        if translated and all(leaf is not None for leaf in translated):
            return translated[0]
    return None


def as_unavailable(exc: BaseException, url: str | None = None) -> RedisUnavailable | None:
    """``exc`` as :class:`RedisUnavailable` if it says Redis cannot be reached, else ``None``.

    For errors raised by code that uses the client directly (a processor calling
    ``app.redis``), where coredis exceptions are not translated: a streamkit
    :class:`RedisUnavailable`, a coredis connection error or a passing refusal by the
    server (out of memory, loading, a read-only replica, ...: :class:`ServerRefused`),
    alone or in an exception group of them, as :class:`OutcomeUnknown` where the
    command may have run. Built-in ``ConnectionError`` / ``TimeoutError`` do not count here: user code
    raises those for its own reasons.
    """
    if isinstance(exc, RedisUnavailable):
        return exc
    if url is None:
        url = current_url()
    refused = _refusal(exc, url)
    if refused is not None:
        return refused
    if isinstance(exc, coredis.exceptions.ConnectionError):
        translated = _translate(exc, url)
        assert isinstance(translated, RedisUnavailable)
        return translated
    if isinstance(exc, BaseExceptionGroup):
        found = [as_unavailable(e, url) for e in exc.exceptions]
        if found and all(leaf is not None for leaf in found):
            return found[0]
    return None


@contextlib.contextmanager
def _unwrapped_group() -> Iterator[None]:
    """Re-raise a lone exception that coredis's pool task group wrapped in a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        found = leaves(group)
        if len(found) != 1:
            raise
        raise found[0] from None


@contextlib.contextmanager
def redis_errors(url: str | None = None) -> Iterator[None]:
    """Translate Redis client errors raised in the block into streamkit errors.

    Messages name ``url`` (masked), by default the URL of the client in use: the
    innermost :func:`open_redis` of the calling task (see
    :func:`streamkit._urls.current_url`).

    Error handling:
        :class:`OutcomeUnknown` when the connection was lost with a command in flight
        (it may have run); :class:`RedisUnavailable` when Redis could not be reached,
        :class:`ServerRefused` (a subclass) when it refused to run the command for a
        passing reason (out of memory, loading, a replica, ...): it did not run; :class:`GroupExists` /
        :class:`NoSuchGroup` for ``BUSYGROUP`` / ``NOGROUP`` replies;
        :class:`BackendError` for other errors Redis replied with. Anything else
        passes through untouched.
    """
    try:
        yield
    except BaseException as exc:
        translated = _translate(exc, current_url() if url is None else url)
        if translated is None or translated is exc:
            raise
        raise translated from exc


# ---------------------------------------------------------------------------- retries


async def retry_idempotent(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    what: str,
    give_up_after: float = DEFAULT_RETRY_FOR,
    backoff: Backoff = RETRY_BACKOFF,
) -> T:
    """Await ``fn(*args)``, retrying while Redis is unavailable; for idempotent operations.

    Use it only where running the operation twice is harmless: reads, acknowledgements,
    scripts that check before they write. It is retried also when the connection was
    lost with it in flight (it may have run already).

    Error handling:
        Errors are translated as by :func:`redis_errors`. The last
        :class:`RedisUnavailable` is re-raised once ``give_up_after`` seconds passed;
        other errors are raised at once.
    """
    return await _retry_loop(
        fn, args, idempotent=True, what=what, give_up_after=give_up_after, backoff=backoff
    )


async def call_once(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    what: str,
    give_up_after: float = DEFAULT_RETRY_FOR,
    backoff: Backoff = RETRY_BACKOFF,
) -> T:
    """Await ``fn(*args)`` for an operation that must not run twice (INCR, XADD, ...).

    It is retried only while it surely never reached Redis (no connection could be
    opened, or Redis refused it while loading its data).

    Error handling:
        :class:`OutcomeUnknown`, at once, when the connection was lost with the
        operation in flight: it may or may not have run, and is not sent again. The
        last :class:`RedisUnavailable` once ``give_up_after`` seconds passed. Other
        errors as by :func:`redis_errors`.
    """
    return await _retry_loop(
        fn, args, idempotent=False, what=what, give_up_after=give_up_after, backoff=backoff
    )


async def _retry_loop(
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    *,
    idempotent: bool,
    what: str,
    give_up_after: float,
    backoff: Backoff,
) -> T:
    deadline = trio.current_time() + give_up_after
    for attempt, delay in enumerate(backoff.delays(), start=1):
        try:
            with redis_errors():
                return await fn(*args)
        except RedisUnavailable as exc:
            if isinstance(exc, OutcomeUnknown) and not idempotent:
                raise
            if trio.current_time() + delay > deadline:
                raise
            log.debug("%s: %s (attempt %d, retrying in %.2fs)", what, exc.reason, attempt, delay)
        await trio.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


@attrs.frozen
class LuaScript:
    """A Lua script, run by its SHA1 digest (``EVALSHA``), loaded on first need.

    coredis's own ``Script`` wraps each call in three request objects, which
    normalise every argument three times: noticeable for a fenced acknowledgement
    carrying hundreds of ids. This sends one ``EVALSHA`` and, only if the server
    does not know the script yet (a new or restarted server), loads it and sends the
    call once more: safe, since a refused ``EVALSHA`` ran nothing.

    Attributes:
        source: the script's Lua source.
        sha: its SHA1 digest.
    """

    source: str
    sha: str = attrs.field(init=False)

    @sha.default
    def _sha(self) -> str:
        return hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(
        self, redis: Redis, *, keys: Sequence[str | bytes], args: Sequence[Any]
    ) -> Any:
        """Run the script on ``redis``; errors are coredis's (wrap in :func:`redis_errors`)."""
        try:
            return await redis.evalsha(self.sha, keys=keys, args=args)
        except coredis.exceptions.NoScriptError:
            await redis.script_load(self.source)
            return await redis.evalsha(self.sha, keys=keys, args=args)


async def run_blocking(
    redis: Redis,
    fn: Callable[[Redis], Awaitable[T]],
    *,
    within: float,
    what: str,
) -> T:
    """Await one blocking command, ``fn(redis)``, on a connection of its own.

    ``fn`` sends one blocking command (``XREAD ... BLOCK``, ``XREADGROUP ... BLOCK``,
    ``BLMOVE``, ``BZPOPMIN``, ...) through ``redis``, e.g.
    ``lambda r: r.xread({key: last_id}, count=1, block=1000)``. A client from
    :func:`open_redis` sends every blocking command on a dedicated connection, which
    carries nothing else while the command runs.

    ``within`` is the client-side deadline: the command's own block time plus a
    margin for a slow server.

    Cancellation:
        Cancelling discards the command's dedicated connection (the server may still
        be blocked on it) and frees its slot; no other command is touched.

    Error handling:
        :class:`ConfigError` if ``redis`` did not come from :func:`open_redis` (it
        would block on a shared connection). :class:`RedisUnavailable` if there is no
        answer within ``within`` seconds or Redis cannot be reached; :class:`OutcomeUnknown`
        if the connection was lost meanwhile (for a plain ``XREAD`` that is harmless:
        read again); other errors as by :func:`redis_errors`.
    """
    if not isinstance(redis, _Client):
        raise ConfigError("redis", "blocking commands need a client from streamkit.open_redis")
    try:
        with redis_errors(redis._health.url), trio.fail_after(within):
            return await fn(redis)
    except trio.TooSlowError as exc:
        raise RedisUnavailable(
            redis._health.url, f"{what} got no answer within {within:g}s"
        ) from exc


# ------------------------------------------------------------------------ connections


@attrs.frozen
class RedisStatistics:
    """A snapshot of a client's connections (see :func:`redis_statistics`).

    Attributes:
        shared_connections: open connections of the shared (multiplexed) pool.
        dedicated_connections: open dedicated connections, idle or running a command.
        dedicated_in_use: dedicated connections running a command now.
        discarded: dedicated connections thrown away because the command on them was
            cancelled or timed out (their state was unknown).
        lost: connections lost unexpectedly (server closed or killed them, network).
        reconnects: times a connection was opened again after one was lost.
    """

    shared_connections: int
    dedicated_connections: int
    dedicated_in_use: int
    discarded: int
    lost: int
    reconnects: int


@attrs.define(eq=False)
class _Health:
    """What happened to a client's connections; reports losses and recoveries.

    A lost connection is logged as a warning, and so is the next connection opened
    after it. Losses within :data:`LOSS_REPORT_INTERVAL` of a reported one are logged
    at debug level only, and counted in the next warning: a flapping network does not
    flood the log.
    """

    url: str
    lost: int = 0
    discarded: int = 0
    reconnects: int = 0
    _down_since: float | None = None
    _reported_at: float = -math.inf
    _reported_down: bool = False
    _unreported: int = 0

    def established(self) -> None:
        if self._down_since is None:
            return
        self.reconnects += 1
        if self._reported_down:
            log.warning(
                "reconnected to Redis at %s (%.2fs after a connection was lost)",
                self.url,
                time.monotonic() - self._down_since,
            )
        else:
            log.debug("reconnected to Redis at %s", self.url)
        self._down_since = None
        self._reported_down = False

    def ended(self, connection: BaseConnection, *, dedicated: bool) -> None:
        error = connection._last_error
        if error is None:
            # Closed on purpose: discarded after a cancelled command, or shut down.
            if connection._terminated and dedicated:
                self.discarded += 1
                log.debug("discarded a dedicated connection to Redis at %s", self.url)
            return
        self.lost += 1
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        if now - self._reported_at < LOSS_REPORT_INTERVAL or self._reported_down:
            self._unreported += 1
            log.debug("lost a connection to Redis at %s: %s", self.url, _reason(error))
            return
        more = f" ({self._unreported} more lost since the last report)" if self._unreported else ""
        log.warning(
            "lost a connection to Redis at %s (%s)%s; commands in flight on it have an "
            "unknown outcome and are not sent again; reconnecting",
            self.url,
            _reason(error),
            more,
        )
        self._reported_at = now
        self._reported_down = True
        self._unreported = 0


class _Pool(ConnectionPool[BaseConnection]):
    """coredis's pool with its slot accounting fixed, and connection events reported.

    coredis 6.9 loses a slot whenever a leased connection ends unusable (a cancelled
    blocking command invalidates its connection, then ``release`` drops it without
    returning the slot) and when the task getting a connection is cancelled while the
    connection is being opened. Here every slot taken is given back, whatever happens.
    """

    _health: _Health
    _dedicated: bool
    _established: weakref.WeakSet[BaseConnection]

    def _setup(self, health: _Health, *, dedicated: bool) -> None:
        self._health = health
        self._dedicated = dedicated
        self._established = weakref.WeakSet()

    async def get_connection(self, **_: Any) -> BaseConnection:
        try:
            with trio.fail_after(math.inf if self.timeout is None else self.timeout):
                connection = await self._get_connection()
        except trio.TooSlowError as exc:
            raise coredis.exceptions.ConnectionError(
                f"Connection pool exhausted: no free connection within {self.timeout}s"
            ) from exc
        self.statistics.connection_leased(connection)
        return connection

    async def _get_connection(self) -> BaseConnection:
        connection = await self._available_connections.get()
        # The slot is ours now: give it back if anything below fails or is cancelled.
        try:
            if connection is None or not connection.reusable:
                if connection is not None:
                    connection.invalidate()
                connection = None
                fresh = await self._construct_connection()
                error = await self.task_group.start(self._run_connection, fresh)
                if error is not None:
                    # coredis turns the cancellation of a connection being opened into
                    # a ConnectionError: let the cancellation win.
                    await trio.lowlevel.checkpoint_if_cancelled()
                    raise error
                connection = fresh
                self.statistics.connection_created(connection)
                self._online_connections.add(connection)
                self._established.add(connection)
                self._health.established()
        except BaseException:
            if connection is None:
                self._available_connections.append_nowait(None)
            else:
                self._available_connections.put_nowait(connection)
            raise
        return connection

    def release(self, connection: BaseConnection) -> None:
        self.statistics.connection_released(connection)
        if connection.usable:
            self._available_connections.put_nowait(connection)
        else:
            # Cancelled mid-command (coredis invalidated it) or lost: the slot comes back
            # empty; the next command opens a fresh connection.
            connection.invalidate()
            self._available_connections.append_nowait(None)

    async def _run_connection(
        self,
        connection: BaseConnection,
        *,
        task_status: trio.TaskStatus[Exception | None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await connection.run(task_status=task_status)
        except coredis.exceptions.RedisError as error:
            # Raised only before the connection was ready: report it to get_connection.
            task_status.started(error)
        finally:
            self._online_connections.discard(connection)
            if connection in self._available_connections:
                self._available_connections.remove(connection)
                self._available_connections.append_nowait(None)
            if connection in self._established:
                self._health.ended(connection, dedicated=self._dedicated)


class _Client(coredis.Redis[bytes]):
    """A coredis client that runs connection-holding commands on dedicated connections."""

    _dedicated: coredis.Redis[bytes]
    _health: _Health

    async def execute_command(self, command: CommandRequest[R]) -> R:
        if command.blocking:
            return await self._dedicated.execute_command(command)
        return await super().execute_command(command)

    def pipeline(
        self,
        transaction: bool = True,
        *,
        raise_on_error: bool = True,
        timeout: float | None = None,
    ) -> Pipeline[bytes]:
        return self._dedicated.pipeline(transaction, raise_on_error=raise_on_error, timeout=timeout)


def redis_statistics(redis: Redis) -> RedisStatistics:
    """A snapshot of the connections of ``redis``, a client from :func:`open_redis`.

    Error handling:
        :class:`ConfigError` for a client that did not come from :func:`open_redis`.
    """
    if not isinstance(redis, _Client):
        raise ConfigError("redis", "statistics need a client from streamkit.open_redis")
    shared = redis.connection_pool
    dedicated = redis._dedicated.connection_pool
    assert isinstance(shared, _Pool)
    assert isinstance(dedicated, _Pool)
    in_use = dedicated.max_connections - len(dedicated._available_connections)
    health = redis._health
    return RedisStatistics(
        shared_connections=len(shared._online_connections),
        dedicated_connections=len(dedicated._online_connections),
        dedicated_in_use=in_use,
        discarded=health.discarded,
        lost=health.lost,
        reconnects=health.reconnects,
    )


SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(url: object, *, setting: str = "redis_url") -> None:
    """Check that ``url`` is a Redis URL streamkit can use.

    ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS) or
    ``unix:///path/to/socket[?db=N]``; a password holding ``@``, ``/``, ``:`` and the
    like must be percent-encoded (``%40``, ``%2F``, ``%3A``).

    Error handling:
        :class:`ConfigError` naming ``setting``, with the masked URL and what to
        write instead: no scheme (``127.0.0.1:6379``: use ``redis://127.0.0.1:6379``),
        another scheme, no host, a port that is not a number, or a path that is not
        a database number (``redis://host/abc``).
    """
    if not isinstance(url, str):
        raise ConfigError(setting, f"must be a redis:// URL, got {url!r}")
    masked = mask_url(url)
    if "://" not in url:
        raise ConfigError(
            setting,
            f"{masked!r} is not a URL; write redis://{masked} (rediss:// for TLS, "
            f"unix:///path for a socket)",
        )
    scheme = url.partition("://")[0].lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            setting, f"{masked!r}: expected redis://, rediss:// or unix://, not {scheme}://"
        )
    parts = urllib.parse.urlsplit(url)
    if scheme == "unix":
        if not parts.path:
            raise ConfigError(setting, f"{masked!r}: expected unix:///path/to/socket")
        return
    rest = url.partition("://")[2]
    if "@" in parts.path or "@" in parts.query or "@" in parts.fragment:
        raise ConfigError(
            setting,
            f"{masked!r}: the password holds a character that ends it early; "
            f"percent-encode it (@ as %40, / as %2F, : as %3A, ? as %3F, # as %23)",
        )
    if not parts.hostname and not rest.startswith("/"):
        raise ConfigError(setting, f"{masked!r}: no host; expected redis://host[:port][/db]")
    try:
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError:
        raise ConfigError(
            setting,
            f"{masked!r}: the port is not a number; expected redis://host[:port][/db] "
            f"(percent-encode a password holding ':')",
        ) from None
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ConfigError(
            setting,
            f"{masked!r}: the path must be a database number (redis://host:6379/0), got /{path}",
        )


def _pool_from_url(
    url: str, connect_timeout: float, max_connections: int, health: _Health, *, dedicated: bool
) -> _Pool:
    # from_url builds the class it is called on; its overloads do not say so.
    # decode_components: a percent-encoded password (%40 for @, ...) is decoded.
    pool = cast(
        "_Pool",
        _Pool.from_url(
            url,
            decode_components=True,
            connect_timeout=connect_timeout,
            decode_responses=False,
            max_connections=max_connections,
        ),
    )
    pool._setup(health, dedicated=dedicated)
    return pool


def _client_from_url(url: str, connect_timeout: float, max_connections: int) -> _Client:
    check_redis_url(url)
    health = _Health(mask_url(url))
    try:
        shared = _pool_from_url(url, connect_timeout, max_connections, health, dedicated=False)
        dedicated = _pool_from_url(url, connect_timeout, max_connections, health, dedicated=True)
    except ValueError as exc:
        raise ConfigError("redis_url", f"{mask_url(url)!r}: {exc}") from exc
    # No retries in coredis: a command whose connection was lost may have run.
    client = _Client(connection_pool=shared, decode_responses=False, retry_policy=NoRetryPolicy())
    client._dedicated = coredis.Redis(
        connection_pool=dedicated, decode_responses=False, retry_policy=NoRetryPolicy()
    )
    client._health = health
    return client


@contextlib.asynccontextmanager
async def open_redis(
    url: str,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    give_up_after: float | None = 0.0,
    backoff: Backoff | None = None,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> AsyncIterator[Redis]:
    """Connect to Redis at ``url`` and yield a client; close it on exit.

    ``url`` is ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` for TLS
    (``?ssl_cert_reqs=none`` and friends as query arguments) or
    ``unix:///path/to/socket?db=0``.

    The server is pinged before the client is yielded. While it cannot be reached,
    connecting is retried with exponential backoff, logging each failure, for up to
    ``give_up_after`` seconds (``None``: forever; ``0``: a single attempt).

    Simple commands share (multiplex) connections; blocking commands, pipelines and
    transactions each run on a connection of their own while they run, so cancelling
    one never disturbs another command. ``max_connections`` bounds each of the two
    pools; connections are opened only when needed. The client never sends a command
    again by itself: see :func:`retry_idempotent` and :func:`call_once`.

    Error handling:
        :class:`ConfigError` for a malformed URL; :class:`RedisUnavailable` once the
        server stayed unreachable for ``give_up_after`` seconds.
    """
    masked = mask_url(url)
    backoff = backoff or Backoff()
    client = _client_from_url(url, connect_timeout, max_connections)

    async def ping() -> None:
        try:
            with trio.fail_after(max(connect_timeout, 0.1) * 2):
                await client.ping()
        except trio.TooSlowError as exc:
            raise RedisUnavailable(masked, "timed out") from exc
        except BaseException as exc:
            permanent = _permanent_failure(exc, url)
            if permanent is not None:
                raise permanent from exc
            translated = _translate(exc, url)
            if translated is None or translated is exc:
                raise
            raise translated from exc

    with using_url(url), redis_errors(url), _unwrapped_group():
        async with client, client._dedicated:
            await retry_unavailable(
                ping,
                backoff=backoff,
                give_up_after=math.inf if give_up_after is None else give_up_after,
                what=f"connecting to Redis at {masked}",
            )
            log.debug("connected to Redis at %s", masked)
            yield client


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the leaves of an exception group, and their causes and contexts."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)


_PERCENT_ENCODE = "percent-encode @ / : ? # in it as %40 %2F %3A %3F %23"


def _permanent_failure(exc: BaseException, url: str) -> ConfigError | None:
    """A connection failure that retrying cannot cure, as a ConfigError saying what to check.

    A refused or missing password, a TLS handshake that fails (``rediss://`` to a plain
    server, an untrusted certificate) and a host name that does not exist fail at once.
    A host name that cannot be resolved *for now* (``EAI_AGAIN``: DNS not ready yet, as
    in a starting container) is transient, like a refused connection or a timeout.
    """
    masked = mask_url(url)
    tls = url.lower().startswith("rediss:")
    for error in _chain(exc):
        if isinstance(error, coredis.exceptions.AuthenticationRequiredError):
            return ConfigError(
                "redis_url",
                f"Redis at {masked} requires a password: give it in the URL, "
                f"redis://:PASSWORD@host:port ({_PERCENT_ENCODE})",
            )
        if isinstance(error, coredis.exceptions.AuthenticationError):
            return ConfigError(
                "redis_url",
                f"Redis at {masked} refused the user name or password in the URL ({error}): "
                f"check them ({_PERCENT_ENCODE})",
            )
        if isinstance(error, ssl.SSLCertVerificationError):
            return ConfigError(
                "redis_url",
                f"the TLS certificate of Redis at {masked} was refused ({error.verify_message}): "
                f"give the CA with ?ssl_ca_certs=/path/ca.pem",
            )
        if tls and isinstance(error, ssl.SSLError):
            return ConfigError(
                "redis_url",
                f"the TLS handshake with Redis at {masked} failed ({_reason(error)}): is the "
                f"server speaking TLS? Use redis:// for a plain server, rediss:// for TLS",
            )
        if isinstance(error, socket.gaierror) and error.errno in (
            socket.EAI_NONAME,
            getattr(socket, "EAI_NODATA", socket.EAI_NONAME),
        ):
            return ConfigError(
                "redis_url", f"unknown host in {masked} ({error.strerror}): check the host name"
            )
    return None
