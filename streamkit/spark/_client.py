"""The synchronous Redis side of the Spark data source: connections, errors, metadata.

Spark runs data source code in plain Python worker processes, so the data source uses
redis-py's blocking client, built by :mod:`streamkit._redispy` (the one place where a
streamkit URL becomes a redis-py client, shared with :mod:`streamkit.clients`):
``redis.Redis`` for a server, ``redis.cluster.RedisCluster`` for a ``redis+cluster://``
URL. Connections are opened inside the method that needs them (``read``, ``write``,
driver-side validation) and closed before it returns: nothing holding a socket is ever
pickled. redis-py exceptions are translated by that module, and no other module of the
subpackage imports them.

On a cluster every command the data source sends names keys of one slot (a partition's
stream with its write markers, or a stream's metadata hash), so the cluster client
routes each to its node and follows MOVED / ASK redirections on its own; the
per-partition pipelines of the readers are cluster pipelines, which send each node's
commands together.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, cast

import redis

from .. import _keys, _redispy
from .._errors import StreamkitError
from .._wire import REDIS_MAX_BULK, text

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Client", "connect", "read_metadata", "redis_errors", "server_bulk_limit"]

#: The client of a server or of a cluster; both take the same (single-slot) commands.
Client = _redispy.SyncClient

# Spark retries tasks on its own; a short socket timeout turns a hung server into a
# failed (and retried) task instead of a stuck one.
_CONNECT_TIMEOUT = 5.0
_SOCKET_TIMEOUT = 60.0
# A task sends one command at a time.
_MAX_CONNECTIONS = 4


def redis_errors(url: str) -> contextlib.AbstractContextManager[None]:
    """Translate redis-py exceptions raised inside the block into streamkit errors."""
    return _redispy.redis_errors(url, setting="url")


@contextlib.contextmanager
def connect(url: str) -> Iterator[Client]:
    """A connected client for the duration of the block: redis-py's cluster client for a
    ``redis+cluster://`` URL, else a server's client checked with PING.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if the server (no node of the cluster)
        cannot be reached, :class:`~streamkit.ConfigError` for a malformed URL.
    """
    with redis_errors(url):
        client = _redispy.open_sync(
            url,
            connect_timeout=_CONNECT_TIMEOUT,
            socket_timeout=_SOCKET_TIMEOUT,
            max_connections=_MAX_CONNECTIONS,
            setting="url",
        )
    try:
        with redis_errors(url):
            if isinstance(client, redis.Redis):
                client.ping()
            yield client
    finally:
        client.close()


def read_metadata(client: Client, url: str, app: str, stream: str) -> dict[str, str]:
    """Return the stream's recorded metadata (empty when the stream does not exist)."""
    with redis_errors(url):
        raw = cast("dict[bytes, bytes]", client.hgetall(_keys.meta_key(app, stream)))
    return {text(k): text(v) for k, v in raw.items()}


def server_bulk_limit(client: Client) -> int:
    """The longest string the server accepts in a command (``proto-max-bulk-len``).

    Redis's default when it cannot be read: ``CONFIG`` refused to this user (an ACL
    without ``+config|get``), renamed (managed services), or a cluster's nodes.
    """
    try:
        with _redispy.redis_errors("redis"):
            reply = cast("dict[str | bytes, str | bytes]", client.config_get("proto-max-bulk-len"))
        return int(next(iter(reply.values())))
    except (StreamkitError, StopIteration, AttributeError, TypeError, ValueError):
        return REDIS_MAX_BULK
