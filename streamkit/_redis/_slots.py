"""Redis Cluster hash slots: which keys may share a command.

A command may name several keys only if they share a slot (see ``docs/redis.md``,
"Redis Cluster"); on a single server every key shares the one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import coredis
from coredis._utils import hash_slot

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["by_slot", "is_cluster", "key_slot"]

K = TypeVar("K", str, bytes)


def is_cluster(redis: object) -> bool:
    """Whether ``redis`` is a client of a Redis Cluster (from a ``redis+cluster://`` URL)."""
    return isinstance(redis, coredis.RedisCluster)


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
