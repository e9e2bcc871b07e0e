"""The synchronous Redis side of the Spark data source: connections, errors, metadata.

Spark runs data source code in plain Python worker processes, so this is the one place
in streamkit that uses redis-py's synchronous client: ``redis.Redis`` for a server,
``redis.cluster.RedisCluster`` for a ``redis+cluster://`` URL. Connections are opened
inside the method that needs them (``read``, ``write``, driver-side validation) and
closed before it returns: nothing holding a socket is ever pickled. redis-py exceptions
are translated here into streamkit's, and no other module of the subpackage imports
them.

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
import redis.cluster
import redis.exceptions

from .. import _keys
from .._acl import not_permitted
from .._errors import BackendError, ConfigError, RedisUnavailable
from .._redis_urls import check_redis_url, is_cluster_url, seed_url
from .._urls import mask_url
from .._wire import REDIS_MAX_BULK, text

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Client", "connect", "read_metadata", "redis_errors", "server_bulk_limit"]

#: The client of a server or of a cluster; both take the same (single-slot) commands.
Client = redis.Redis | redis.cluster.RedisCluster

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
    except redis.exceptions.AskError as exc:  # MOVED too, a subclass
        if is_cluster_url(url):  # pragma: no cover - the cluster client follows them
            raise BackendError(str(exc)) from exc
        scheme, _, rest = mask_url(url).partition("://")
        raise ConfigError(
            "url",
            f"{mask_url(url)!r} names a node of a Redis Cluster, which redirected a command "
            f"({exc}): write {scheme}+cluster://{rest}",
        ) from exc
    except redis.exceptions.ClusterError as exc:
        # CLUSTERDOWN, or redirections still failing after the client's retries.
        raise RedisUnavailable(mask_url(url), f"the cluster is not serving: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        raise not_permitted(str(exc), mask_url(url)) or BackendError(str(exc)) from exc
    except redis.exceptions.RedisClusterException as exc:
        # Raised by the cluster client itself: no reachable node, a node without
        # cluster mode, a slot no node serves.
        raise RedisUnavailable(mask_url(url), str(exc) or type(exc).__name__) from exc


def _open(url: str) -> Client:
    check_redis_url(url, setting="url")
    options = {
        "socket_connect_timeout": _CONNECT_TIMEOUT,
        "socket_timeout": _SOCKET_TIMEOUT,
        "decode_responses": False,
    }
    try:
        if is_cluster_url(url):
            # The cluster client connects (and reads the slot map) as it is built.
            return redis.cluster.RedisCluster.from_url(seed_url(url), **options)
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise ConfigError("url", f"not a Redis URL: {mask_url(url)!r} ({exc})") from exc


@contextlib.contextmanager
def connect(url: str) -> Iterator[Client]:
    """A connected client for the duration of the block: redis-py's cluster client for a
    ``redis+cluster://`` URL, else a server's client checked with PING.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if the server (no node of the cluster)
        cannot be reached, :class:`~streamkit.ConfigError` for a malformed URL.
    """
    with redis_errors(url):
        client = _open(url)
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
        reply = cast("dict[str | bytes, str | bytes]", client.config_get("proto-max-bulk-len"))
        return int(next(iter(reply.values())))
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
        return REDIS_MAX_BULK
    except (StopIteration, AttributeError, TypeError, ValueError):
        return REDIS_MAX_BULK
