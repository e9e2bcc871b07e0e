""":func:`open_redis`: the one factory of clients, for a server and for a cluster alike.

A client is assembled from the layer's parts: two pools of the same kind
(:mod:`._pool`), a shared half that routes (:mod:`._routing`) and a dedicated half
that counts replicas (:mod:`._replicas`), one :class:`~._health.Health` for both.
coredis is told never to retry: a command whose connection was lost may have run, and
the retry rules are the caller's (:mod:`._retries`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import urllib.parse
from typing import TYPE_CHECKING, Any, TypeVar, cast

import coredis
import coredis.exceptions
import trio
from coredis.connection import TCPLocation
from coredis.retry import NoRetryPolicy

from .._backoff import Backoff, retry_unavailable
from .._defaults import DEFAULT_CONNECT_TIMEOUT
from .._errors import ConfigError, RedisUnavailable, using_url
from .._urls import (
    check_redis_url,
    is_cluster_url,
    mask_url,
    seed_url,
    tls_options,
    without_tls_arguments,
)
from ._health import Health
from ._hot import hot_connection_class
from ._pool import ClusterPool, Pool
from ._replicas import CountingReplicas
from ._routing import Routing
from ._transaction import run_transaction
from ._translate import permanent_failure, redis_errors, translate, unwrapped_group

if TYPE_CHECKING:
    import ssl
    from collections.abc import AsyncIterator, Awaitable, Callable

    from coredis.patterns.pipeline import ClusterPipeline

    from ._routing import Redis

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_MAX_CONNECTIONS", "open_redis"]

R = TypeVar("R")

#: Slots of each pool (shared and dedicated). Connections are opened lazily, when a
#: command finds no idle one: a pool holds as many as were ever in use at once.
DEFAULT_MAX_CONNECTIONS = 64

log = logging.getLogger("streamkit.redis")


class _DedicatedClient(CountingReplicas, coredis.Redis[bytes]):
    """The dedicated half of a server's client."""


class _Client(Routing, coredis.Redis[bytes]):
    """The client of a server."""

    _dedicated: _DedicatedClient


class _DedicatedClusterClient(CountingReplicas, coredis.RedisCluster[bytes]):
    """The dedicated half of a cluster's client (``WAIT`` goes to the connection that ran
    the command, after any redirection: to the master that took the write)."""


class _ClusterClient(Routing, coredis.RedisCluster[bytes]):
    """The client of a cluster: both pools per node, no retries, cross-slot commands
    refused rather than split; redirections (``MOVED``, ``ASK``, ``TRYAGAIN``) are
    followed by coredis, since the node that answered so ran nothing."""

    _dedicated: _DedicatedClusterClient

    async def transaction(
        self,
        func: Callable[[ClusterPipeline[bytes]], Awaitable[R]],
        *watches: str | bytes,
        watch_delay: float | None = None,
    ) -> R:
        """``coredis.Redis.transaction``, which coredis's cluster client lacks (see
        :func:`~._transaction.run_transaction`)."""
        return await run_transaction(self._dedicated, func, *watches, watch_delay=watch_delay)


def _pool(
    url: str,
    *,
    cluster: bool,
    connect_timeout: float,
    max_connections: int,
    tls: ssl.SSLContext | None,
) -> Any:
    """A :class:`Pool` of the server at ``url``, or a :class:`ClusterPool` of the cluster.

    ``tls`` replaces the URL's TLS arguments, which coredis would read its own way
    (without checking the host name).
    """
    url = without_tls_arguments(url)
    if not cluster:
        # from_url builds the class it is called on; its overloads do not say so.
        # decode_components: a percent-encoded password (%40 for @, ...) is decoded.
        return cast(
            "Pool",
            Pool.from_url(
                url,
                decode_components=True,
                connect_timeout=connect_timeout,
                decode_responses=False,
                max_connections=max_connections,
                ssl_context=tls,
            ),
        )
    seed = urllib.parse.urlsplit(seed_url(url))
    return ClusterPool.from_url(
        seed_url(url),
        # Given, or coredis builds it in a deprecated form (a warning).
        startup_nodes=[TCPLocation(seed.hostname or "127.0.0.1", seed.port or 6379)],
        decode_components=True,
        connect_timeout=connect_timeout,
        decode_responses=False,
        # Each node gets max_connections slots (not a share of them).
        max_connections=max_connections,
        max_connections_per_node=True,
        ssl_context=tls,
    )


def _client(url: str, *, cluster: bool, connect_timeout: float, max_connections: int) -> Routing:
    """The client of the server (``cluster``: the cluster) at ``url``, not yet entered."""
    check_redis_url(url)
    health = Health(mask_url(url))
    tls = tls_options(url)
    if tls is not None:
        tls.warn_once(url)
    context = None if tls is None else tls.context()
    pools = []
    try:
        # Shared, dedicated, hot and hot dedicated (see ._hot): the hot pool's
        # connections are multiplexed like the shared pool's; the hot dedicated pool's
        # carry a fetcher's waits with the fenced reads around them.
        for dedicated in (False, True, False, True):
            pool = _pool(
                url,
                cluster=cluster,
                connect_timeout=connect_timeout,
                max_connections=max_connections,
                tls=context,
            )
            pool._setup(health, dedicated=dedicated)
            pools.append(pool)
    except ValueError as exc:
        raise ConfigError("redis_url", f"{mask_url(url)!r}: {exc}") from exc
    for hot in pools[2:]:
        hot.connection_class = hot_connection_class(hot.connection_class)
    # No retries in coredis (its default re-sends a command whose connection was lost,
    # although Redis may have run it).
    options: dict[str, Any] = {"decode_responses": False, "retry_policy": NoRetryPolicy()}
    if cluster:
        # A command whose keys are in several slots is refused rather than split into
        # one command per node (which would not be atomic).
        options["non_atomic_cross_slot"] = False
    kinds = (_ClusterClient, _DedicatedClusterClient) if cluster else (_Client, _DedicatedClient)
    client: Routing = kinds[0](connection_pool=pools[0], **options)
    client._dedicated = kinds[1](connection_pool=pools[1], **options)
    client._hot_pool = pools[2]
    client._hot_dedicated_pool = pools[3]
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
    client = _client(
        seed_url(url) if cluster else url,
        cluster=False,
        connect_timeout=connect_timeout,
        max_connections=max_connections,
    )

    async def ping() -> None:
        try:
            with trio.fail_after(max(connect_timeout, 0.1) * 2):
                await client.ping()
        except trio.TooSlowError as exc:
            raise RedisUnavailable(masked, "timed out") from exc
        except BaseException as exc:
            permanent = permanent_failure(exc, url)
            if permanent is not None:
                raise permanent from exc
            translated = translate(exc, url)
            if translated is None or translated is exc:
                raise
            raise translated from exc

    with using_url(masked), redis_errors(url), unwrapped_group():
        async with client, client._dedicated, client._hot_pool, client._hot_dedicated_pool:
            await retry_unavailable(
                ping,
                backoff=backoff,
                give_up_after=math.inf if give_up_after is None else give_up_after,
                what=f"connecting to Redis at {masked}",
                outage=client._health.outage,
            )
            # Connected: from now on the pools report their failures themselves.
            client._health.connecting = False
            if not cluster:
                log.debug("connected to Redis at %s", masked)
                yield cast("Redis", client)
                return
            await _check_cluster_node(client, masked)
        nodes = _client(
            url, cluster=True, connect_timeout=connect_timeout, max_connections=max_connections
        )
        nodes._health.connecting = False
        async with nodes, nodes._dedicated, nodes._hot_pool, nodes._hot_dedicated_pool:
            log.debug("connected to the Redis Cluster at %s", masked)
            # Typed as a standalone client: streamkit and its users call the commands
            # both have (see docs/redis.md, "Redis Cluster").
            yield cast("Redis", nodes)


async def _check_cluster_node(client: Routing, masked: str) -> None:
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
