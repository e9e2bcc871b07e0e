"""The synchronous Redis side of the Spark data source: connections, errors, metadata.

Spark runs data source code in plain Python worker processes, so this is the one place
in streamkit that uses redis-py's synchronous client. Connections are opened inside the
method that needs them (``read``, ``write``, driver-side validation) and closed before it
returns: nothing holding a socket is ever pickled. redis-py exceptions are translated
here into streamkit's, and no other module of the subpackage imports them.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, cast

import redis
import redis.exceptions

from .. import _keys
from .._errors import BackendError, ConfigError, RedisUnavailable
from .._urls import mask_url
from .._wire import text

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["connect", "read_metadata", "redis_errors"]

# Spark retries tasks on its own; a short socket timeout turns a hung server into a
# failed (and retried) task instead of a stuck one.
_CONNECT_TIMEOUT = 5.0
_SOCKET_TIMEOUT = 60.0


@contextlib.contextmanager
def redis_errors(url: str) -> Iterator[None]:
    """Translate redis-py exceptions raised inside the block into streamkit errors."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise RedisUnavailable(mask_url(url), str(exc) or type(exc).__name__) from exc
    except redis.exceptions.AuthenticationError as exc:  # pragma: no cover - a subclass above
        raise RedisUnavailable(mask_url(url), f"authentication failed: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        raise BackendError(str(exc)) from exc


@contextlib.contextmanager
def connect(url: str) -> Iterator[redis.Redis]:
    """A connected redis-py client for the duration of the block, checked with PING.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if the server cannot be reached,
        :class:`~streamkit.ConfigError` for a malformed URL.
    """
    try:
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=_CONNECT_TIMEOUT,
            socket_timeout=_SOCKET_TIMEOUT,
            decode_responses=False,
        )
    except ValueError as exc:
        raise ConfigError("url", f"not a Redis URL: {mask_url(url)!r} ({exc})") from exc
    try:
        with redis_errors(url):
            client.ping()
            yield client
    finally:
        client.close()


def read_metadata(client: redis.Redis, url: str, app: str, stream: str) -> dict[str, str]:
    """Return the stream's recorded metadata (empty when the stream does not exist)."""
    with redis_errors(url):
        raw = cast("dict[bytes, bytes]", client.hgetall(_keys.meta_key(app, stream)))
    return {text(k): text(v) for k, v in raw.items()}
