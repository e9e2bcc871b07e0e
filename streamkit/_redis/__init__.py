"""The one Redis layer: builds clients, owns their connections, decides retries, translates errors.

Every other module talks to Redis through a client from :func:`open_redis` and wraps
its commands in :func:`redis_errors`, so no coredis exception reaches users. One
concept per module, each importable on its own:

* :mod:`._translate`: coredis errors into streamkit's (:func:`redis_errors`,
  :func:`as_unavailable`), and connection failures that retrying cannot cure.
* :mod:`._retries`: when an operation is tried again (:func:`retry_idempotent`,
  :func:`call_once`, :func:`ride_out_refusals`).
* :mod:`._commands`: :class:`LuaScript` and :func:`run_blocking`.
* :mod:`._driver`: :func:`run_op`, the Trio driver of the operations of
  :mod:`streamkit._ops` (the blocking and asyncio clients have their own).
* :mod:`._health`: what happens to the connections (an outage said once, see
  :func:`health_of`), and :class:`RedisStatistics`.
* :mod:`._pool`: the pools of a server and of a cluster, with the one slot give-back.
* :mod:`._routing`: which half of a client a command runs on, for both kinds.
* :mod:`._replicas`: ``WAIT`` after a write (:func:`replicated`).
* :mod:`._transaction`: ``transaction()`` on a cluster.
* :mod:`._slots`: Redis Cluster hash slots (:func:`key_slot`, :func:`by_slot`).
* :mod:`._factory`: :func:`open_redis`, the one factory of both kinds of client.

URLs (checking, masking, TLS options) are :mod:`streamkit._urls`, below this layer:
the Spark executors use them without trio or coredis.

Connections. A client has two connection pools: the *shared* pool carries simple
commands, multiplexed; *dedicated* connections carry every command that holds a
connection for its whole run (blocking commands, pipelines, transactions). coredis 6.9
sends blocking commands over the shared pool and, when one is cancelled, drops a
connection that other tasks' commands may be in flight on, and never gives the pool
slot back (after 64 cancellations the pool is empty and every command waits forever).
:mod:`._pool` fixes the slot accounting; :mod:`._routing` sends connection-holding
commands to the dedicated pool. See ``docs/redis.md``.

A ``redis+cluster://`` URL gives a client built the same way on coredis's cluster
client: both pools per node, no retries, cross-slot commands refused rather than
split; redirections (``MOVED``, ``ASK``, ``TRYAGAIN``) are followed by coredis, since
the node that answered so ran nothing.

Retries. coredis is told never to retry (its default re-sends a command whose
connection was lost, although Redis may have run it). A lost connection surfaces as
:class:`~streamkit.OutcomeUnknown` when the command may have reached Redis, as plain
:class:`~streamkit.RedisUnavailable` when it surely did not. Retrying is decided in
:mod:`._retries`.
"""

from __future__ import annotations

from .._urls import (
    check_redis_url as check_redis_url,
    is_cluster_url as is_cluster_url,
    mask_url as mask_url,
)
from ._commands import (
    NOT_LOADED as NOT_LOADED,
    LuaScript as LuaScript,
    ScriptCall as ScriptCall,
    can_run_blocking_between as can_run_blocking_between,
    run_blocking as run_blocking,
    run_blocking_between as run_blocking_between,
)
from ._driver import run_op as run_op
from ._factory import (
    DEFAULT_CONNECT_TIMEOUT as DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS as DEFAULT_MAX_CONNECTIONS,
    open_redis as open_redis,
)
from ._health import RedisStatistics as RedisStatistics
from ._hot import (
    can_transact as can_transact,
    hget as hot_hget,
    hot_transaction as hot_transaction,
    is_no_script as is_no_script,
)
from ._replicas import replicated as replicated
from ._retries import (
    DEFAULT_RETRY_FOR as DEFAULT_RETRY_FOR,
    REFUSAL_BACKOFF as REFUSAL_BACKOFF,
    REPORT_EVERY as REPORT_EVERY,
    RETRY_BACKOFF as RETRY_BACKOFF,
    call_once as call_once,
    retry_idempotent as retry_idempotent,
    ride_out_refusals as ride_out_refusals,
)
from ._routing import (
    Redis as Redis,
    health_of as health_of,
    redis_statistics as redis_statistics,
)
from ._slots import by_slot as by_slot, is_cluster as is_cluster, key_slot as key_slot
from ._translate import as_unavailable as as_unavailable, redis_errors as redis_errors

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_RETRY_FOR",
    "NOT_LOADED",
    "REFUSAL_BACKOFF",
    "REPORT_EVERY",
    "RETRY_BACKOFF",
    "LuaScript",
    "Redis",
    "RedisStatistics",
    "ScriptCall",
    "as_unavailable",
    "by_slot",
    "call_once",
    "can_run_blocking_between",
    "can_transact",
    "check_redis_url",
    "health_of",
    "hot_hget",
    "hot_transaction",
    "is_cluster",
    "is_cluster_url",
    "is_no_script",
    "key_slot",
    "mask_url",
    "open_redis",
    "redis_errors",
    "redis_statistics",
    "replicated",
    "retry_idempotent",
    "ride_out_refusals",
    "run_blocking",
    "run_blocking_between",
    "run_op",
]
