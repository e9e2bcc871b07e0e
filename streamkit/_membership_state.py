"""A membership group as data: its keys, its JSON state, and pure plans for changes.

Nothing here does I/O. The runtime member (:mod:`streamkit._membership`) reads the
state, asks :func:`plan_join` or :func:`plan_removal` for the next one, and writes it
back in a transaction; the admin helpers (:mod:`streamkit._membership_admin`) read or
delete it from outside the group.

Keys of a group ``g`` (one Redis Cluster slot, thanks to the ``{g}`` hash tag):

===========================  ============================================================
key                          what it holds
===========================  ============================================================
``__memb:{g}``               JSON: generation, partitions, members (with metadata) and
                             the assignment
``__beat:{g}:ID``            member ID's heartbeat: a string key with a TTL
``__ctrl:{g}``               control stream: ``event`` (join/leave/reap), ``member``,
                             ``generation``; capped at about 1000 entries
===========================  ============================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import orjson

from . import _keys
from ._assignment import Assignment, Assignor
from ._errors import ConfigError, MetadataMismatch, StreamkitError

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

__all__ = [
    "CONTROL_STREAM_MAXLEN",
    "GroupState",
    "MemberInfo",
    "MembershipKeys",
    "membership_keys",
    "plan_join",
    "plan_removal",
    "tag_safe",
]

#: The control stream is trimmed to about this many entries.
CONTROL_STREAM_MAXLEN = 1000
_STATE_VERSION = 1


# --------------------------------------------------------------------------- keys


def tag_safe(kind: str, value: str) -> str:
    """Return ``value``, a group name or member id, if it can go inside a hash tag.

    Error handling:
        :class:`ConfigError` naming ``kind`` if ``value`` is empty or has braces.
    """
    # Braces would change the hash tag, so the group's keys could land on different
    # cluster slots and the member's transactions would fail there.
    if not isinstance(value, str) or not value or "{" in value or "}" in value:
        raise ConfigError(kind, f"must be a non-empty string without braces, got {value!r}")
    return value


@attrs.frozen
class MembershipKeys:
    """The Redis keys of one membership group (all in one cluster slot).

    Attributes:
        group: the group's name.
        state: the JSON state (members, assignment, generation, partitions).
        control: the control stream announcing every change.
    """

    group: str
    state: str
    control: str

    def heartbeat(self, member_id: str) -> str:
        """The heartbeat key of ``member_id``."""
        return _keys.heartbeat_key(self.group, member_id)


def membership_keys(group: str) -> MembershipKeys:
    """Return the keys of ``group``.

    Error handling:
        :class:`ConfigError` if ``group`` is empty or contains braces.
    """
    tag_safe("group", group)
    return MembershipKeys(group, _keys.membership_key(group), _keys.control_key(group))


# --------------------------------------------------------------------------- state


@attrs.frozen(kw_only=True)
class MemberInfo:
    """What the group records about a member.

    Attributes:
        id: the member's id.
        static: whether a graceful exit keeps its place for ``static_grace`` seconds.
        host: the host name it runs on.
        pid: its process id.
        joined_at: when it joined, as a Unix timestamp.
        heartbeat_ttl: seconds until its heartbeat expires, as last read (``None``
            where unknown or already expired); only set by :func:`read_membership`.
    """

    id: str
    static: bool = False
    host: str = ""
    pid: int = 0
    joined_at: float = 0.0
    heartbeat_ttl: float | None = None

    def _to_json(self) -> dict[str, Any]:
        return {
            "static": self.static,
            "host": self.host,
            "pid": self.pid,
            "joined_at": self.joined_at,
        }

    @classmethod
    def _from_json(cls, member_id: str, data: Mapping[str, Any]) -> MemberInfo:
        return cls(
            id=member_id,
            static=bool(data.get("static", False)),
            host=str(data.get("host", "")),
            pid=int(data.get("pid", 0)),
            joined_at=float(data.get("joined_at", 0.0)),
        )


@attrs.frozen(kw_only=True)
class GroupState:
    """The decoded ``__memb`` key; every change produces a new one.

    Attributes:
        generation: bumped by every change of the members (the assignment's too).
        partitions: the group's partitions.
        members: member id -> what the group records about it.
        assignment: who owns what, at ``generation``.
    """

    generation: int
    partitions: tuple[int, ...]
    members: Mapping[str, MemberInfo]
    assignment: Assignment

    def encode(self) -> bytes:
        """The JSON stored at the ``__memb`` key."""
        return orjson.dumps(
            {
                "version": _STATE_VERSION,
                "generation": self.generation,
                "partitions": list(self.partitions),
                "members": {m: info._to_json() for m, info in sorted(self.members.items())},
                "assignment": {m: list(p) for m, p in self.assignment.members.items()},
            }
        )

    @classmethod
    def decode(cls, raw: bytes | None) -> GroupState | None:
        """The state stored as ``raw``; ``None`` for a missing key.

        Error handling:
            :class:`StreamkitError` if ``raw`` is not a valid state.
        """
        if raw is None:
            return None
        try:
            data = orjson.loads(raw)
            generation = int(data["generation"])
            partitions = tuple(int(p) for p in data["partitions"])
            members = {m: MemberInfo._from_json(m, info) for m, info in data["members"].items()}
            assignment = Assignment(
                generation=generation,
                partitions=partitions,
                members={m: [int(p) for p in ps] for m, ps in data["assignment"].items()},
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StreamkitError(f"membership state is corrupt: {exc!r}") from exc
        return cls(
            generation=generation, partitions=partitions, members=members, assignment=assignment
        )


# --------------------------------------------------------------------------- planning


def _checked(
    assignor: Assignor,
    partitions: tuple[int, ...],
    members: Collection[str],
    previous: Mapping[str, Collection[int]],
) -> dict[str, tuple[int, ...]]:
    if not members:
        # The last member left: nobody owns anything until someone joins.
        return {}
    result = assignor(partitions, members, previous)
    given = sorted(p for owned in result.values() for p in owned)
    if given != sorted(partitions) or not set(result) <= set(members):
        raise ConfigError(
            "assignor",
            f"must give each of {list(partitions)} to exactly one of {sorted(members)}, "
            f"returned {result!r}",
        )
    return {m: tuple(result.get(m, ())) for m in members}


def _with_members(
    state: GroupState | None,
    members: Mapping[str, MemberInfo],
    partitions: tuple[int, ...],
    assignor: Assignor,
) -> GroupState:
    generation = (state.generation if state else 0) + 1
    previous = state.assignment.members if state else {}
    owners = _checked(assignor, partitions, list(members), previous)
    return GroupState(
        generation=generation,
        partitions=partitions,
        members=dict(members),
        assignment=Assignment(generation=generation, partitions=partitions, members=owners),
    )


def plan_join(
    state: GroupState | None,
    member: MemberInfo,
    partitions: tuple[int, ...],
    assignor: Assignor,
    *,
    group: str = "",
) -> GroupState | None:
    """The state after ``member`` joins, or ``None`` if nothing changes.

    A member that is already in the group (a static member back within its grace
    period, or a rejoin that raced with nothing) changes nothing, so nobody's
    partitions move and the generation stays.

    Error handling:
        :class:`MetadataMismatch` if the group has members and other partitions;
        :class:`ConfigError` if ``assignor`` returns an invalid assignment.
    """
    if state is not None and state.members:
        if member.id in state.members:
            return None
        if state.partitions != partitions:
            raise MetadataMismatch(
                f"membership group {group}", "partitions", list(state.partitions), list(partitions)
            )
    members = dict(state.members) if state else {}
    members[member.id] = member
    return _with_members(state, members, partitions, assignor)


def plan_removal(
    state: GroupState | None, gone: Collection[str], assignor: Assignor
) -> GroupState | None:
    """The state after the ``gone`` members leave or are reaped; ``None``: no change.

    Error handling:
        :class:`ConfigError` if ``assignor`` returns an invalid assignment.
    """
    if state is None or not set(gone) & set(state.members):
        return None
    members = {m: info for m, info in state.members.items() if m not in gone}
    return _with_members(state, members, state.partitions, assignor)
