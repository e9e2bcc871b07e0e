"""The one place that builds Redis clients and translates Redis client errors.

Every other module talks to Redis through a client from :func:`open_redis` and wraps
its commands in :func:`redis_errors`, so no coredis exception reaches users.
"""

from __future__ import annotations

import contextlib
import logging
import math
import urllib.parse
from typing import TYPE_CHECKING, TypeAlias

import coredis
import coredis.exceptions
import trio

from ._backoff import Backoff, retry_unavailable
from ._errors import BackendError, ConfigError, RedisUnavailable, StreamkitError
from ._groups import leaves
from ._urls import mask_url

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

__all__ = ["Redis", "as_unavailable", "mask_url", "open_redis", "redis_errors"]

Redis: TypeAlias = "coredis.Redis[bytes]"

DEFAULT_CONNECT_TIMEOUT = 2.0

log = logging.getLogger("streamkit.redis")

_UNAVAILABLE = (
    coredis.exceptions.ConnectionError,
    coredis.exceptions.BusyLoadingError,
    ConnectionError,
    TimeoutError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)


def _translate(exc: BaseException, url: str) -> StreamkitError | None:
    if isinstance(exc, StreamkitError):
        return exc
    if isinstance(exc, _UNAVAILABLE):
        return RedisUnavailable(mask_url(url), str(exc) or type(exc).__name__)
    if isinstance(exc, coredis.exceptions.AuthenticationError):
        return RedisUnavailable(mask_url(url), f"authentication failed: {exc}")
    if isinstance(exc, coredis.exceptions.RedisError):
        return BackendError(str(exc))
    if isinstance(exc, BaseExceptionGroup):
        # coredis runs its pool in a task group, so a dropped connection can arrive
        # wrapped in a group. Unwrap it when every leaf is a Redis error.
        leaves = [_translate(e, url) for e in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None


def as_unavailable(exc: BaseException, url: str = "redis") -> RedisUnavailable | None:
    """``exc`` as :class:`RedisUnavailable` if it says Redis cannot be reached, else ``None``.

    For errors raised by code that uses the client directly (a processor calling
    ``app.redis``), where coredis exceptions are not translated: a streamkit
    :class:`RedisUnavailable`, or a coredis connection or loading error (alone or in
    an exception group of them). Built-in ``ConnectionError`` / ``TimeoutError`` do not
    count here: user code raises those for its own reasons.
    """
    if isinstance(exc, RedisUnavailable):
        return exc
    if isinstance(exc, coredis.exceptions.ConnectionError | coredis.exceptions.BusyLoadingError):
        return RedisUnavailable(mask_url(url), str(exc) or type(exc).__name__)
    if isinstance(exc, BaseExceptionGroup):
        leaves = [as_unavailable(e, url) for e in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
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
def redis_errors(url: str = "redis") -> Iterator[None]:
    """Translate Redis client errors raised in the block into streamkit errors.

    Error handling:
        Connection problems become :class:`RedisUnavailable`; errors Redis replied
        with become :class:`BackendError`. Anything else passes through untouched.
    """
    try:
        yield
    except BaseException as exc:
        translated = _translate(exc, url)
        if translated is None or translated is exc:
            raise
        raise translated from exc


def _client_from_url(url: str, connect_timeout: float) -> Redis:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            "redis_url", f"expected redis://, rediss:// or unix://, got {mask_url(url)!r}"
        )
    try:
        return coredis.Redis.from_url(url, connect_timeout=connect_timeout, decode_responses=False)
    except ValueError as exc:
        raise ConfigError("redis_url", f"{mask_url(url)!r}: {exc}") from exc


@contextlib.asynccontextmanager
async def open_redis(
    url: str,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    give_up_after: float | None = 0.0,
    backoff: Backoff | None = None,
) -> AsyncIterator[Redis]:
    """Connect to Redis at ``url`` and yield a client; close it on exit.

    ``url`` is ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` for TLS
    (``?ssl_cert_reqs=none`` and friends as query arguments) or
    ``unix:///path/to/socket?db=0``.

    The server is pinged before the client is yielded. While it cannot be reached,
    connecting is retried with exponential backoff, logging each failure, for up to
    ``give_up_after`` seconds (``None``: forever; ``0``: a single attempt).

    Error handling:
        :class:`ConfigError` for a malformed URL; :class:`RedisUnavailable` once the
        server stayed unreachable for ``give_up_after`` seconds.
    """
    masked = mask_url(url)
    backoff = backoff or Backoff()
    client = _client_from_url(url, connect_timeout)

    async def ping() -> None:
        try:
            with redis_errors(url), trio.fail_after(max(connect_timeout, 0.1) * 2):
                await client.ping()
        except trio.TooSlowError as exc:
            raise RedisUnavailable(masked, "timed out") from exc

    with redis_errors(url), _unwrapped_group():
        async with client:
            await retry_unavailable(
                ping,
                backoff=backoff,
                give_up_after=math.inf if give_up_after is None else give_up_after,
                what=f"connecting to Redis at {masked}",
            )
            log.debug("connected to Redis at %s", masked)
            yield client
