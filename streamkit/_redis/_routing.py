"""Which connection a command runs on: the routing both clients share.

A client from :func:`~streamkit.open_redis` has two halves, each with its own pool:

* the *shared* half carries simple commands (``GET``, ``EVALSHA``, ``XADD``, ...),
  multiplexed: many tasks' commands are in flight on one connection at once.
  Cancelling such a command never touches the connection; its reply is read and
  dropped.
* the *dedicated* half carries every command that holds a connection for its whole
  run: blocking commands (``XREAD``, ``XREADGROUP``, ``BLPOP``, ``BLMOVE``,
  ``BZPOPMIN``, ...), pipelines and transactions, and every command followed by a
  ``WAIT`` (see :func:`~._replicas.replicated`). While such a command runs, its
  connection carries nothing else. Cancelling it discards that connection (the server
  may still be blocked on it) and frees its slot; no other command is touched.

coredis 6.9 sends blocking commands over the shared pool; :class:`Routing` sends them
to the dedicated half, for the client of a server and of a cluster alike.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from coredis.client import Client

from .._errors import ConfigError
from ._health import Health, RedisStatistics
from ._pool import SlotAccounting

if TYPE_CHECKING:
    import coredis
    from coredis.commands import CommandRequest


__all__ = ["Redis", "Routing", "health_of", "own", "redis_statistics"]

#: The type of the client :func:`~streamkit.open_redis` yields, for annotations.
Redis: TypeAlias = "coredis.Redis[bytes]"

R = TypeVar("R")


class Routing(Client[bytes]):
    """The shared half of a client, handing connection-holding commands to the dedicated
    half (:attr:`_dedicated`, a client of the same kind on a pool of its own)."""

    _dedicated: coredis.Redis[bytes] | coredis.RedisCluster[bytes]
    # The pool of the hot scripts' connections (see ._hot).
    _hot_pool: SlotAccounting[Any]
    # The pool of the hot connections that carry a fetcher's blocking waits.
    _hot_dedicated_pool: SlotAccounting[Any]
    _health: Health

    async def execute_command(self, command: CommandRequest[R]) -> R:
        # A command followed by WAIT holds its connection until the WAIT returns.
        if command.blocking or self._dedicated.requires_wait:
            return await self._dedicated.execute_command(command)
        # The concrete client's own (coredis.Redis or RedisCluster), next in the MRO.
        return await super().execute_command(command)  # type: ignore[safe-super]

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        # Each kind's own signature and defaults (a cluster's pipelines are not
        # transactions unless asked).
        return self._dedicated.pipeline(*args, **kwargs)


def own(redis: object, what: str) -> Routing:
    """``redis`` as the client :func:`~streamkit.open_redis` made, or :class:`ConfigError`."""
    if not isinstance(redis, Routing):
        raise ConfigError("redis", f"{what} need a client from streamkit.open_redis")
    return redis


# The health of clients that did not come from open_redis (a test's, a user's own).
_others: weakref.WeakKeyDictionary[object, Health] = weakref.WeakKeyDictionary()


def health_of(redis: object) -> Health:
    """The :class:`~._health.Health` of ``redis``: a client's own, for one from
    :func:`~streamkit.open_redis`; for any other client, one kept for it here (its
    pools report nothing, its users do)."""
    if isinstance(redis, Routing):
        return redis._health
    health = _others.get(redis)
    if health is None:
        health = _others[redis] = Health("Redis", connecting=False)
    return health


def redis_statistics(redis: object) -> RedisStatistics:
    """A snapshot of the connections of ``redis``, a client from :func:`open_redis`.

    Error handling:
        :class:`ConfigError` for a client that did not come from :func:`open_redis`.
    """
    client = own(redis, "statistics")
    shared = client.connection_pool
    dedicated = client._dedicated.connection_pool
    assert isinstance(shared, SlotAccounting)
    assert isinstance(dedicated, SlotAccounting)
    health = client._health
    return RedisStatistics(
        # The hot scripts' connections are multiplexed too.
        shared_connections=len(shared._online_connections)
        + len(client._hot_pool._online_connections),
        dedicated_connections=len(dedicated._online_connections)
        + len(client._hot_dedicated_pool._online_connections),
        dedicated_in_use=dedicated.in_use() + client._hot_dedicated_pool.in_use(),
        discarded=health.discarded,
        lost=health.lost,
        reconnects=health.reconnects,
    )
