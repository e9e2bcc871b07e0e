"""Sticky, balanced assignment of partitions to group members: pure functions only.

The membership store decides *who owns what* with an :data:`Assignor`; the
rebalancer applies the decision with :func:`diff`. Nothing here does I/O, so every
rule can be checked exhaustively in tests.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

__all__ = ["Assignment", "AssignmentDiff", "Assignor", "assign", "diff"]


class Assignor(Protocol):
    """Computes who owns which partition; :func:`assign` is the default.

    An assignor must be pure and deterministic: given the same partitions, members
    and previous assignment (in any iteration order), it returns the same result.
    Every partition must go to exactly one of ``members``.
    """

    def __call__(
        self,
        partitions: Collection[int],
        members: Collection[str],
        previous: Mapping[str, Collection[int]],
        /,
    ) -> dict[str, tuple[int, ...]]: ...


def _frozen_mapping(
    value: Mapping[str, Iterable[int]],
) -> Mapping[str, tuple[int, ...]]:
    # Sorted keys and sorted tuples: equal assignments compare and print equal
    # whatever order they were built in.
    return types.MappingProxyType({m: tuple(sorted(value[m])) for m in sorted(value)})


def _sorted_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(value)))


@attrs.frozen(kw_only=True)
class Assignment:
    """The whole group's assignment at one generation.

    Attributes:
        generation: bumped by every membership change; ``0`` means "no group yet".
        partitions: every partition of the group, sorted.
        members: member id -> the partitions it owns (sorted), for every member.
    """

    generation: int = 0
    partitions: tuple[int, ...] = attrs.field(default=(), converter=_sorted_tuple)
    members: Mapping[str, tuple[int, ...]] = attrs.field(
        factory=dict, converter=_frozen_mapping, hash=False
    )

    def of(self, member: str) -> tuple[int, ...]:
        """Return the partitions ``member`` owns (empty if it is not a member)."""
        return self.members.get(member, ())

    def owner(self, partition: int) -> str | None:
        """Return the member owning ``partition``, or ``None`` if nobody does."""
        for member, owned in self.members.items():
            if partition in owned:
                return member
        return None

    def __repr__(self) -> str:
        owners = ", ".join(f"{m}: {list(p)}" for m, p in self.members.items())
        return f"Assignment(generation={self.generation}, {{{owners}}})"


@attrs.frozen(kw_only=True)
class AssignmentDiff:
    """What one member must do to go from one assignment to the next.

    Attributes:
        release: partitions it owned and must stop working on (sorted).
        claim: partitions it newly owns and must start working on (sorted).
        keep: partitions it owns before and after (sorted); these keep running.
    """

    release: tuple[int, ...] = ()
    claim: tuple[int, ...] = ()
    keep: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        """True if anything moves for this member."""
        return bool(self.release or self.claim)


def assign(
    partitions: Collection[int],
    members: Collection[str],
    previous: Mapping[str, Collection[int]],
    /,
) -> dict[str, tuple[int, ...]]:
    """Spread ``partitions`` over ``members``, moving as few as possible.

    The result is:

    * **complete and exclusive**: every partition goes to exactly one member;
    * **balanced**: member sizes differ by at most one;
    * **sticky**: with ``quota`` = ``len(partitions) // len(members)`` (plus one for
      the first ``len(partitions) % len(members)`` members), each member keeps
      ``min(len(current), quota)`` of the partitions it owns in ``previous``. The
      "+1" quotas go to the members that currently hold the most (ties broken by
      member id), which is exactly what minimises the number of moved partitions;
    * **deterministic**: the same inputs in any iteration order give the same output.

    Partitions in ``previous`` that are not in ``partitions`` are dropped; a partition
    listed for two members in ``previous`` stays with the member whose id sorts first.

    Args:
        partitions: the group's partitions.
        members: the member ids.
        previous: the assignment being replaced (members that left may appear).

    Returns:
        Member id -> its sorted partitions, for every member (possibly empty).
        Empty if there are no members.
    """
    all_partitions = sorted(set(partitions))
    ids = sorted(set(members))
    if not ids:
        return {}

    # What each staying member holds now, with duplicates and unknown partitions
    # removed deterministically.
    valid = set(all_partitions)
    current: dict[str, list[int]] = {}
    taken: set[int] = set()
    for member in ids:
        held = sorted((set(previous.get(member, ())) & valid) - taken)
        current[member] = held
        taken.update(held)

    quota, extra = divmod(len(all_partitions), len(ids))
    # The +1 quotas go to whoever can use them to keep one more partition.
    by_holding = sorted(ids, key=lambda m: (-len(current[m]), m))
    quotas = {m: quota + (1 if rank < extra else 0) for rank, m in enumerate(by_holding)}

    result: dict[str, list[int]] = {}
    for member in ids:
        # Keep the lowest-numbered ones: any choice is minimal, this one is stable.
        result[member] = current[member][: quotas[member]]
    kept = {p for owned in result.values() for p in owned}
    pool = [p for p in all_partitions if p not in kept]

    position = 0
    for member in ids:
        need = quotas[member] - len(result[member])
        result[member].extend(pool[position : position + need])
        position += need
    return {m: tuple(sorted(result[m])) for m in ids}


def diff(
    old: Assignment | Mapping[str, Collection[int]] | None,
    new: Assignment | Mapping[str, Collection[int]],
    member: str,
) -> AssignmentDiff:
    """Return what ``member`` must release, claim and keep between two assignments.

    Args:
        old: the assignment the member currently works by (``None``: it owns nothing).
        new: the assignment to move to.
        member: the member's id.
    """
    before = set(_owned(old, member))
    after = set(_owned(new, member))
    return AssignmentDiff(
        release=tuple(sorted(before - after)),
        claim=tuple(sorted(after - before)),
        keep=tuple(sorted(before & after)),
    )


def _owned(
    assignment: Assignment | Mapping[str, Collection[int]] | None, member: str
) -> Collection[int]:
    if assignment is None:
        return ()
    if isinstance(assignment, Assignment):
        return assignment.of(member)
    return assignment.get(member, ())
