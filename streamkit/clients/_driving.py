"""What the blocking and asyncio drivers share that is not about awaiting: their
settings and state, their name, and how a pipeline's raw replies become one per call.

The drivers (:mod:`._blocking`, :mod:`._asyncio`) differ only where one awaits and the
other does not; what they decide the same way is written here once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis.exceptions

from .. import _redispy
from .._errors import BackendError, NotReplicated, StreamkitError
from .._urls import mask_url
from ._ops import ClientState

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ..jobs._plan import JobLike
    from ._ops import Batch, Call

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_POOL_TIMEOUT",
    "DEFAULT_SOCKET_TIMEOUT",
    "client_setup",
    "describe",
    "pair",
    "redirected",
    "translated",
    "untyped",
]

#: Connections of a client's pool (per node of a cluster), at most.
DEFAULT_MAX_CONNECTIONS = 64
#: Seconds a reply may take: longer than a job result's blocking read (5 s).
DEFAULT_SOCKET_TIMEOUT = 10.0
#: Seconds a thread waits for a free connection of the pool.
DEFAULT_POOL_TIMEOUT = 10.0


def client_setup(
    url: str,
    *,
    queue: str,
    jobs: Mapping[str, JobLike] | None,
    shards: int,
    max_bytes: int,
    connect_timeout: float,
    socket_timeout: float,
    max_connections: int,
    pool_timeout: float,
) -> tuple[dict[str, Any], ClientState]:
    """A new client's redis-py options and its state; the URL checked now, so that a
    bad one is one line at construction, not at the first command.

    Error handling:
        :class:`~streamkit.ConfigError` for a URL streamkit does not take.
    """
    _redispy.connection_options(url, connect_timeout=connect_timeout, socket_timeout=socket_timeout)
    options = {
        "connect_timeout": connect_timeout,
        "socket_timeout": socket_timeout,
        "max_connections": max_connections,
        "pool_timeout": pool_timeout,
    }
    state = ClientState(queue=queue, shards=shards, jobs=jobs or {}, max_bytes=max_bytes)
    return options, state


def describe(client: object, url: str, state: ClientState, *, closed: bool) -> str:
    """A client's ``repr``: its class, where it connects (password masked), its queue."""
    return (
        f"<{type(client).__name__} {mask_url(url)} queue={state.queue} "
        f"{'closed' if closed else 'open'}>"
    )


def pair(raw: list[Any], calls: Sequence[Call], batch: Batch) -> tuple[list[Any], list[int]]:
    """A pipeline's raw replies as one reply per call (its ``WAIT`` folded in), and the
    calls whose script the node lacked."""
    step = 2 if batch.replicas else 1
    replies: list[Any] = []
    missing: list[int] = []
    for i in range(len(calls)):
        reply = raw[i * step]
        if isinstance(reply, redis.exceptions.NoScriptError):
            missing.append(i)
        elif batch.replicas and not isinstance(reply, Exception):
            acknowledged = raw[i * step + 1]
            if isinstance(acknowledged, Exception):
                reply = acknowledged
            elif int(acknowledged) < batch.replicas:
                reply = NotReplicated(batch.replicas, int(acknowledged), batch.replica_timeout)
        replies.append(reply)
    return replies, missing


def translated(reply: Any, url: str) -> Any:
    """A reply, or the streamkit error for a redis-py error reply."""
    if isinstance(reply, Exception) and not isinstance(reply, StreamkitError):
        return _redispy.translate(reply, url) or BackendError(str(reply))
    return reply


def redirected(reply: Any) -> bool:
    """Whether a reply is a cluster's ``MOVED`` or ``ASK``."""
    return getattr(reply, "code", None) in ("MOVED", "ASK")


def untyped(client: object) -> Any:
    """redis-py's methods that carry no types (``execute_command``, ...)."""
    return client
