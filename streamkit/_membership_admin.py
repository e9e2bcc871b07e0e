"""Looking at a membership group from outside: ``streamkit status`` and ``reset``.

These read (or delete) a group's keys without joining it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ._membership_state import GroupState, MemberInfo, membership_keys
from ._redis import redis_errors

if TYPE_CHECKING:
    from ._assignment import Assignment
    from ._redis import Redis

__all__ = ["MembershipSnapshot", "read_membership", "reset_membership"]


@attrs.frozen(kw_only=True)
class MembershipSnapshot:
    """What :func:`read_membership` found in Redis.

    Attributes:
        group: the group's name.
        generation: the current generation.
        partitions: the group's partitions.
        members: every member, with its heartbeat's remaining time.
        assignment: who owns what.
    """

    group: str
    generation: int
    partitions: tuple[int, ...]
    members: tuple[MemberInfo, ...]
    assignment: Assignment


async def read_membership(redis: Redis, group: str) -> MembershipSnapshot | None:
    """Return a snapshot of ``group``'s state, or ``None`` if it has never had members.

    Error handling:
        :class:`RedisUnavailable` / :class:`BackendError` from Redis;
        :class:`StreamkitError` if the state is corrupt.
    """
    keys = membership_keys(group)
    with redis_errors():
        raw = await redis.get(keys.state)
    state = GroupState.decode(raw)
    if state is None:
        return None
    ids = sorted(state.members)
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            requests = [pipe.pttl(keys.heartbeat(m)) for m in ids]
        ttls = [await request for request in requests]
    members = tuple(
        attrs.evolve(state.members[m], heartbeat_ttl=ttl / 1000 if ttl >= 0 else None)
        for m, ttl in zip(ids, ttls, strict=True)
    )
    return MembershipSnapshot(
        group=group,
        generation=state.generation,
        partitions=state.partitions,
        members=members,
        assignment=state.assignment,
    )


async def reset_membership(redis: Redis, group: str) -> None:
    """Delete ``group``'s state, heartbeats and control stream (for ``streamkit reset``).

    Only safe while no member runs: live members would rejoin at once.
    """
    keys = membership_keys(group)
    with redis_errors():
        raw = await redis.get(keys.state)
        state = GroupState.decode(raw)
        members = list(state.members) if state else []
        await redis.delete([keys.state, keys.control, *(keys.heartbeat(m) for m in members)])
