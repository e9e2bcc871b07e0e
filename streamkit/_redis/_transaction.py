"""``transaction()`` for a Redis Cluster: WATCH, MULTI and EXEC on the slot's master.

coredis's cluster client lacks ``coredis.Redis.transaction``. :func:`run_transaction`
gives it, on the dedicated half of the client (a transaction holds its connection),
and rides out a failover or a resharding met between WATCH and EXEC.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeVar

import coredis
import coredis.exceptions
import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from coredis.patterns.pipeline import ClusterPipeline

__all__ = ["run_transaction"]

R = TypeVar("R")

log = logging.getLogger("streamkit.redis")

# Refusals of a queued command by which a cluster says the slot is elsewhere or moving.
_CLUSTER_MOVES = (
    coredis.exceptions.AskError,  # MovedError is one too
    coredis.exceptions.TryAgainError,
    coredis.exceptions.ClusterDownError,
    coredis.exceptions.ReadOnlyError,
)
_TRANSACTION_RETRIES = 6


async def run_transaction(
    client: coredis.RedisCluster[bytes],
    func: Callable[[ClusterPipeline[bytes]], Awaitable[R]],
    *watches: str | bytes,
    watch_delay: float | None = None,
) -> R:
    """``coredis.Redis.transaction`` on ``client``, a cluster's client.

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
            async with client.pipeline(transaction=False) as pipe, pipe.watch(*watches):
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
            refusals = await _relearn(client, refused, refusals)
            continue
        except _CLUSTER_MOVES as exc:
            # WATCH itself was refused.
            if refusals >= _TRANSACTION_RETRIES:
                raise
            refusals = await _relearn(client, exc, refusals)
            continue
        if watch_delay:
            await trio.sleep(watch_delay)


async def _relearn(client: coredis.RedisCluster[bytes], refused: Exception, refusals: int) -> int:
    """After a transaction's slot was found elsewhere or moving (a failover or a
    resharding): tell the layout, wait a little, and count the refusal."""
    layout = client.connection_pool.cluster_layout
    node = None
    if isinstance(refused, coredis.exceptions.MovedError):
        node = layout.node_for_slot(refused.slot_id, True)
    layout.report_errors(node, refused)
    log.debug("a transaction was refused (%r); running it again", refused)
    await trio.sleep(0.05 * 2**refusals)
    return refusals + 1
