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

A ``redis+cluster://`` URL gives a :class:`_ClusterClient` built the same way on
coredis's cluster client: both pools per node, no retries, cross-slot commands refused
rather than split; redirections (``MOVED``, ``ASK``, ``TRYAGAIN``) are followed by
coredis, since the node that answered so ran nothing.

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
from coredis._concurrency import QueueFull
from coredis._utils import hash_slot
from coredis.commands.constants import CommandName
from coredis.connection import BaseConnection, ClusterConnection, TCPLocation
from coredis.globals import READONLY_COMMANDS
from coredis.pool import ClusterConnectionPool, ConnectionPool
from coredis.retry import NoRetryPolicy

from ._acl import not_permitted, remember_script
from ._backoff import Backoff, retry_unavailable
from ._errors import (
    BackendError,
    ConfigError,
    GroupExists,
    NoSuchGroup,
    NotReplicated,
    OutcomeUnknown,
    RedisUnavailable,
    ServerRefused,
    StreamkitError,
)
from ._groups import leaves
from ._redis_urls import (
    check_redis_url as check_redis_url,
    is_cluster_url as is_cluster_url,
    seed_url as _seed_url,
)
from ._urls import current_url, mask_url, using_url

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence

    from coredis.cluster._node import ClusterNodeLocation
    from coredis.commands import CommandRequest
    from coredis.patterns.pipeline import ClusterPipeline, Pipeline

__all__ = [
    "Redis",
    "RedisStatistics",
    "as_unavailable",
    "by_slot",
    "call_once",
    "is_cluster",
    "key_slot",
    "mask_url",
    "open_redis",
    "redis_errors",
    "redis_statistics",
    "replicated",
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
    "MOVED": (
        "a cluster node that no longer serves the key's slot",
        "the cluster is resharding or failing over; the client follows its new layout",
    ),
    "ASK": ("a cluster node moving the key's slot", "wait for the resharding to end"),
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
    # MovedError is an AskError: MOVED first.
    (coredis.exceptions.MovedError, "MOVED"),
    (coredis.exceptions.AskError, "ASK"),
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
    if isinstance(exc, _TooFewReplicas):
        return NotReplicated(exc.wanted, exc.acknowledged, exc.timeout_ms / 1000)
    masked = mask_url(url)
    refused = _refusal(exc, url)
    if refused is not None:
        # Redis refused the command (out of memory, loading, a replica, ...): it did
        # not run, and may succeed later.
        return refused
    if _not_sent(exc):
        return RedisUnavailable(masked, _reason(exc))
    if isinstance(exc, coredis.exceptions.ClusterError):
        # The cluster client followed MOVED / ASK / TRYAGAIN redirections until it gave
        # up: no node ran the command.
        return RedisUnavailable(masked, f"the cluster kept redirecting the command ({exc})")
    if isinstance(exc, _LOST):
        return OutcomeUnknown(masked, _reason(exc))
    if isinstance(exc, coredis.exceptions.AuthenticationError):
        return RedisUnavailable(masked, f"authentication failed: {exc}")
    if isinstance(exc, coredis.exceptions.RedisError):
        return not_permitted(str(exc), masked) or _group_error(exc) or BackendError(str(exc))
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
        return remember_script(self.source)

    async def __call__(self, redis: Redis, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
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
    url = _own(redis, "blocking commands")._health.url
    try:
        with redis_errors(url), trio.fail_after(within):
            return await fn(redis)
    except trio.TooSlowError as exc:
        raise RedisUnavailable(url, f"{what} got no answer within {within:g}s") from exc


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
    # A cluster's masters, as its client last learned them.
    _masters: list[str] | None = None

    def learned_layout(self, masters: list[str]) -> None:
        """A cluster client learned the cluster's layout: warn if its masters changed."""
        if self._masters is not None and masters != self._masters:
            log.warning(
                "the Redis Cluster at %s has other masters now (a failover, or nodes "
                "added or removed): %s, before %s; commands go to the new ones",
                self.url,
                ", ".join(masters),
                ", ".join(self._masters),
            )
        self._masters = masters

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


class _TooFewReplicas(coredis.exceptions.ReplicationError):
    """``WAIT`` after a command counted fewer replicas than asked (with the count)."""

    def __init__(self, command: bytes, wanted: int, timeout_ms: int, acknowledged: int) -> None:
        super().__init__(command, wanted, timeout_ms)
        self.wanted = wanted
        self.timeout_ms = timeout_ms
        self.acknowledged = acknowledged


_NOTHING_TO_WAIT_FOR = READONLY_COMMANDS | {CommandName.SCRIPT_LOAD}


async def _wait_for_replicas(
    wait: tuple[int, int] | None, command: CommandRequest[Any], connection: BaseConnection
) -> None:
    """Send ``WAIT`` on the connection (so the node) that ran ``command``; count replicas.

    coredis's own check raises without the count; this one keeps it. Reads and
    ``SCRIPT LOAD`` (a script's first call on a server) wrote nothing to wait for.
    """
    if not wait or wait[0] <= 0 or command.name in _NOTHING_TO_WAIT_FOR:
        return
    reply = await connection.create_request(CommandName.WAIT, *wait, decode=False)
    acknowledged = int(cast("int", reply))
    if acknowledged < wait[0]:
        raise _TooFewReplicas(command.name, wait[0], wait[1], acknowledged)


class _DedicatedClient(coredis.Redis[bytes]):
    """The dedicated half of :class:`_Client`; also runs the commands of :func:`replicated`."""

    async def _ensure_wait_and_persist(
        self, command: CommandRequest[Any], connection: BaseConnection
    ) -> None:
        await _wait_for_replicas(self._waitcontext.get(), command, connection)


class _DedicatedClusterClient(coredis.RedisCluster[bytes]):
    """The dedicated half of :class:`_ClusterClient`; also runs :func:`replicated` commands.

    coredis sends the ``WAIT`` on the connection that ran the command, after any
    redirection: to the master that took the write.
    """

    async def _ensure_wait_and_persist(
        self, command: CommandRequest[Any], connection: BaseConnection
    ) -> None:
        await _wait_for_replicas(self._waitcontext.get(), command, connection)


@contextlib.contextmanager
def replicated(redis: Redis, replicas: int, timeout: float) -> Iterator[None]:
    """Make every command sent through ``redis`` in the block wait for ``replicas``.

    Each command (from this task and tasks it starts in the block) runs on a dedicated
    connection and is followed on it by ``WAIT replicas timeout``, so on a cluster
    by the master that ran it.

    Error handling:
        :class:`NotReplicated` (from :func:`redis_errors`) when fewer replicas
        acknowledged a command within ``timeout`` seconds: the command ran on the
        master. :class:`ConfigError` for a client not from :func:`open_redis`.
    """
    client = _own(redis, "replicas=")
    with client._dedicated.ensure_replication(replicas, max(1, round(timeout * 1000))):
        yield


class _Client(coredis.Redis[bytes]):
    """A coredis client that runs connection-holding commands on dedicated connections."""

    _dedicated: _DedicatedClient
    _health: _Health

    async def execute_command(self, command: CommandRequest[R]) -> R:
        # A command followed by WAIT holds its connection until the WAIT returns.
        if command.blocking or self._dedicated.requires_wait:
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


class _ClusterPool(ClusterConnectionPool):
    """coredis's cluster pool with the slot accounting of :class:`_Pool`, per node.

    Its per-node queues have the flaws :class:`_Pool` fixes: a connection released
    unusable (a cancelled blocking command) and a cancelled connection attempt each
    lose their node's slot for good.
    """

    _health: _Health
    _dedicated: bool
    _established: weakref.WeakSet[ClusterConnection]

    def _setup(self, health: _Health, *, dedicated: bool) -> None:
        self._health = health
        self._dedicated = dedicated
        self._established = weakref.WeakSet()
        layout = self.cluster_layout
        learn = layout._refresh

        async def learn_and_report() -> None:
            await learn()
            health.learned_layout(sorted(node.name for node in layout.primaries))

        # coredis learns the layout again by itself (after redirections and errors):
        # say so when the masters changed, the mark of a failover.
        setattr(layout, "_refresh", learn_and_report)  # noqa: B010 (mypy: a method)

    async def _get_connection_by_node(self, node: ClusterNodeLocation) -> ClusterConnection:
        queue = self._node_pool(TCPLocation(node.host, node.port))
        try:
            with trio.fail_after(math.inf if self.timeout is None else self.timeout):
                connection = await queue.get()
        except trio.TooSlowError as exc:
            raise coredis.exceptions.ConnectionError(
                f"Connection pool exhausted: no free connection to {node.name} "
                f"within {self.timeout}s"
            ) from exc
        # The slot is ours now: give it back if anything below fails or is cancelled.
        try:
            if connection is None or not connection.reusable:
                if connection is not None:
                    connection.invalidate()
                connection = None
                try:
                    fresh = await self._make_node_connection(node)
                except coredis.exceptions.ConnectionError as exc:
                    # coredis turns the cancellation of a connection being opened into
                    # a ConnectionError: let the cancellation win.
                    await trio.lowlevel.checkpoint_if_cancelled()
                    # coredis counts errors to decide when to learn the cluster's layout
                    # again, but not this one (raised before its command's error
                    # handling): a dead master's slots would be sent to it forever,
                    # never to the replica promoted in its place.
                    self.cluster_layout.report_errors(node, exc)
                    raise
                connection = fresh
                self._established.add(connection)
                self._health.established()
        except BaseException:
            if connection is None:
                queue.append_nowait(None)
            else:
                queue.put_nowait(connection)
            raise
        return connection

    def release(self, connection: ClusterConnection) -> None:
        self.statistics.connection_released(connection)
        queue = self._node_pool(connection.location)
        with contextlib.suppress(QueueFull):  # the node left the layout: a fresh queue
            if connection.usable:
                queue.put_nowait(connection)
                return
            # Cancelled mid-command or lost: the slot comes back empty.
            queue.append_nowait(None)
        connection.invalidate()

    async def _wrap_connection(
        self,
        connection: ClusterConnection,
        *,
        task_status: trio.TaskStatus[Exception | None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await super()._wrap_connection(connection, task_status=task_status)
        finally:
            if connection in self._established:
                self._health.ended(connection, dedicated=self._dedicated)


# Refusals of a queued command by which a cluster says the slot is elsewhere or moving.
_CLUSTER_MOVES = (
    coredis.exceptions.AskError,  # MovedError is one too
    coredis.exceptions.TryAgainError,
    coredis.exceptions.ClusterDownError,
    coredis.exceptions.ReadOnlyError,
)
_TRANSACTION_RETRIES = 6


class _ClusterClient(coredis.RedisCluster[bytes]):
    """A coredis cluster client that runs connection-holding commands on dedicated connections.

    coredis's cluster client multiplexes simple commands like the standalone one (a
    connection goes back to its node's pool as soon as the command is written), so a
    blocking command must not share its pool either.
    """

    _dedicated: _DedicatedClusterClient
    _health: _Health

    async def execute_command(self, command: CommandRequest[R]) -> R:
        if command.blocking or self._dedicated.requires_wait:
            return await self._dedicated.execute_command(command)
        return await super().execute_command(command)

    def pipeline(
        self,
        transaction: bool = False,
        *,
        raise_on_error: bool = True,
        timeout: float | None = None,
    ) -> ClusterPipeline[bytes]:
        return self._dedicated.pipeline(transaction, raise_on_error=raise_on_error, timeout=timeout)

    async def transaction(
        self,
        func: Callable[[ClusterPipeline[bytes]], Awaitable[R]],
        *watches: str | bytes,
        watch_delay: float | None = None,
    ) -> R:
        """``coredis.Redis.transaction``, which coredis's cluster client lacks.

        Runs ``func(pipe)`` with ``watches`` watched (they must share a slot); the
        commands it queues on ``pipe`` run in one ``MULTI``/``EXEC`` on that slot's
        master, and the whole function runs again while a watched key changed, and
        (a few times, learning the cluster's layout between tries) while the slot was
        found on another node or moving: a failover or a resharding. EXEC runs the
        commands all or none, so running them again cannot run them twice.
        """
        refusals = 0
        while True:
            queued: list[Any] = []
            try:
                async with self.pipeline(transaction=False) as pipe, pipe.watch(*watches):
                    result = await func(pipe)
                    queued = list(pipe.command_stack)
                return result
            except coredis.exceptions.WatchError:
                log.debug("a watched key changed; running the transaction again")
            except coredis.exceptions.ExecAbortError as exc:
                # A queued command was refused, so EXEC ran nothing: raise the refusal
                # itself, as the single-server client does, unless it is one of the
                # cluster's below.
                refused = next((c.result for c in queued if isinstance(c.result, Exception)), exc)
                if not isinstance(refused, _CLUSTER_MOVES) or refusals >= _TRANSACTION_RETRIES:
                    raise refused from exc
                refusals = await self._relearn(refused, refusals)
                continue
            except _CLUSTER_MOVES as exc:
                # WATCH itself was refused.
                if refusals >= _TRANSACTION_RETRIES:
                    raise
                refusals = await self._relearn(exc, refusals)
                continue
            if watch_delay:
                await trio.sleep(watch_delay)

    async def _relearn(self, refused: Exception, refusals: int) -> int:
        """After a transaction's slot was found elsewhere or moving (a failover or a
        resharding): tell the layout, wait a little, and count the refusal."""
        layout = self._dedicated.connection_pool.cluster_layout
        node = None
        if isinstance(refused, coredis.exceptions.MovedError):
            node = layout.node_for_slot(refused.slot_id, True)
        layout.report_errors(node, refused)
        log.debug("a transaction was refused (%r); running it again", refused)
        await trio.sleep(0.05 * 2**refusals)
        return refusals + 1


def redis_statistics(redis: Redis) -> RedisStatistics:
    """A snapshot of the connections of ``redis``, a client from :func:`open_redis`.

    Error handling:
        :class:`ConfigError` for a client that did not come from :func:`open_redis`.
    """
    client: _Client | _ClusterClient = _own(redis, "statistics")
    shared = client.connection_pool
    dedicated = client._dedicated.connection_pool
    if isinstance(dedicated, _ClusterPool):
        assert isinstance(shared, _ClusterPool)
        in_use = sum(
            queue._maxsize - len(queue._queue)
            for queue in dedicated._cluster_available_connections.values()
        )
    else:
        assert isinstance(shared, _Pool)
        assert isinstance(dedicated, _Pool)
        in_use = dedicated.max_connections - len(dedicated._available_connections)
    health = client._health
    return RedisStatistics(
        shared_connections=len(shared._online_connections),
        dedicated_connections=len(dedicated._online_connections),
        dedicated_in_use=in_use,
        discarded=health.discarded,
        lost=health.lost,
        reconnects=health.reconnects,
    )


def _own(redis: object, what: str) -> _Client | _ClusterClient:
    """``redis`` as the client :func:`open_redis` made, or :class:`ConfigError`."""
    if not isinstance(redis, (_Client, _ClusterClient)):
        raise ConfigError("redis", f"{what} need a client from streamkit.open_redis")
    return redis


def is_cluster(redis: object) -> bool:
    """Whether ``redis`` is a client of a Redis Cluster (from a ``redis+cluster://`` URL)."""
    return isinstance(redis, coredis.RedisCluster)


K = TypeVar("K", str, bytes)


def by_slot(redis: object, keys: Iterable[K]) -> list[list[K]]:
    """``keys`` grouped so that each group may go into one multi-key command.

    On a single server that is one group (empty if there are no keys); on a Redis
    Cluster one group per hash slot, in the order of the keys' first appearance. A
    command may name several keys only if they share a slot (see ``docs/redis.md``,
    "Redis Cluster").
    """
    keys = list(keys)
    if not is_cluster(redis):
        return [keys] if keys else []
    groups: dict[int, list[K]] = {}
    for key in keys:
        groups.setdefault(key_slot(key), []).append(key)
    return list(groups.values())


def key_slot(key: str | bytes) -> int:
    """The Redis Cluster hash slot of ``key`` (its hash tag's, if it has one)."""
    return hash_slot(key.encode() if isinstance(key, str) else key)


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
    client._dedicated = _DedicatedClient(
        connection_pool=dedicated, decode_responses=False, retry_policy=NoRetryPolicy()
    )
    client._health = health
    return client


def _cluster_pool_from_url(
    url: str, connect_timeout: float, max_connections: int, health: _Health, *, dedicated: bool
) -> _ClusterPool:
    seed = urllib.parse.urlsplit(_seed_url(url))
    pool = _ClusterPool.from_url(
        _seed_url(url),
        # Given, or coredis builds it in a deprecated form (a warning).
        startup_nodes=[TCPLocation(seed.hostname or "127.0.0.1", seed.port or 6379)],
        decode_components=True,
        connect_timeout=connect_timeout,
        decode_responses=False,
        # Each node gets max_connections slots (not a share of them).
        max_connections=max_connections,
        max_connections_per_node=True,
    )
    pool._setup(health, dedicated=dedicated)
    return pool


def _cluster_client_from_url(
    url: str, connect_timeout: float, max_connections: int
) -> _ClusterClient:
    check_redis_url(url)
    health = _Health(mask_url(url))
    try:
        shared = _cluster_pool_from_url(
            url, connect_timeout, max_connections, health, dedicated=False
        )
        dedicated = _cluster_pool_from_url(
            url, connect_timeout, max_connections, health, dedicated=True
        )
    except ValueError as exc:
        raise ConfigError("redis_url", f"{mask_url(url)!r}: {exc}") from exc
    # No retries in coredis (its cluster client's default re-sends a command whose
    # connection was lost), and a command whose keys are in several slots is refused
    # rather than split into one command per node (which would not be atomic).
    # Redirections (MOVED, ASK) and TRYAGAIN are still followed: the refusing node ran
    # nothing.
    options: dict[str, Any] = {
        "decode_responses": False,
        "retry_policy": NoRetryPolicy(),
        "non_atomic_cross_slot": False,
    }
    client = _ClusterClient(connection_pool=shared, **options)
    client._dedicated = _DedicatedClusterClient(connection_pool=dedicated, **options)
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
    (``?ssl_cert_reqs=none`` and friends as query arguments),
    ``unix:///path/to/socket?db=0``, or ``redis+cluster://host[:port]`` naming any node
    of a Redis Cluster (``rediss+cluster://`` for TLS; see ``docs/redis.md``, "Redis
    Cluster").

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
    check_redis_url(url)
    cluster = is_cluster_url(url)
    # A cluster client discovers the cluster's layout from the URL's node when it is
    # entered: ping that node first, with a plain client, to wait for it as for a server.
    client = _client_from_url(_seed_url(url) if cluster else url, connect_timeout, max_connections)

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
            if not cluster:
                log.debug("connected to Redis at %s", masked)
                yield client
                return
            await _check_cluster_node(client, masked)
        nodes = _cluster_client_from_url(url, connect_timeout, max_connections)
        async with nodes, nodes._dedicated:
            log.debug("connected to the Redis Cluster at %s", masked)
            # Typed as a standalone client: streamkit and its users call the commands
            # both have (see docs/redis.md, "Redis Cluster").
            yield cast("Redis", nodes)


async def _check_cluster_node(client: Redis, masked: str) -> None:
    try:
        await client.cluster_info()
    except coredis.exceptions.ResponseError as exc:
        if "cluster support disabled" not in str(exc):
            raise
        raise ConfigError(
            "redis_url",
            f"Redis at {masked} is not a cluster node (cluster support disabled): "
            f"use redis:// for a single server",
        ) from exc


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
    tls = url.lower().startswith(("rediss:", "rediss+cluster:"))
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
