"""The pure assignment: balanced, complete, sticky (minimal moves) and deterministic."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from streamkit._assignment import Assignment, AssignmentDiff, Assignor, assign, diff

if TYPE_CHECKING:
    import random
    from collections.abc import Collection, Mapping

MEMBER_NAMES = [f"m{i}" for i in range(8)]


def _check_valid(
    result: Mapping[str, Collection[int]], partitions: Collection[int], members: Collection[str]
) -> None:
    assert set(result) == set(members)
    owned = sorted(p for ps in result.values() for p in ps)
    assert owned == sorted(partitions), "every partition exactly once"
    if members:
        sizes = [len(ps) for ps in result.values()]
        assert max(sizes) - min(sizes) <= 1, "balanced"
    for ps in result.values():
        assert list(ps) == sorted(ps)


def _minimum_moves(
    partitions: Collection[int],
    members: Collection[str],
    previous: Mapping[str, Collection[int]],
) -> int:
    """The fewest partitions held by staying members that any balanced result moves.

    Found by brute force over which members get the "+1" quotas, independently of
    the greedy rule the assignor uses.
    """
    ids = sorted(members)
    if not ids:
        return 0
    held = {m: len(set(previous.get(m, ())) & set(partitions)) for m in ids}
    quota, extra = divmod(len(partitions), len(ids))
    best_kept = max(
        sum(min(held[m], quota + (m in bigger)) for m in ids)
        for bigger in map(set, itertools.combinations(ids, extra))
    )
    return sum(held.values()) - best_kept


def _moves(previous: Mapping[str, Collection[int]], new: Mapping[str, Collection[int]]) -> int:
    """Partitions owned before by a member still present that changed owner."""
    return sum(1 for m, ps in previous.items() if m in new for p in ps if p not in new[m])


class AssignmentMachine(RuleBasedStateMachine):
    """Random joins, leaves and deaths over one group, checking every reassignment."""

    def __init__(self) -> None:
        super().__init__()
        self.partitions: list[int] = []
        self.current: dict[str, tuple[int, ...]] = {}

    @initialize(
        partitions=st.one_of(
            st.integers(1, 24).map(lambda n: list(range(n))),
            st.sets(st.integers(0, 1000), min_size=1, max_size=20).map(sorted),
        ),
        first=st.sampled_from(MEMBER_NAMES),
        rnd=st.randoms(use_true_random=False),
    )
    def start(self, partitions: list[int], first: str, rnd: random.Random) -> None:
        self.partitions = partitions
        self.reassign({first}, rnd)

    def reassign(self, members: set[str], rnd: random.Random) -> None:
        previous = dict(self.current)
        new = assign(self.partitions, members, previous)
        _check_valid(new, self.partitions, members)
        assert _moves(previous, new) == _minimum_moves(self.partitions, members, previous)

        # Deterministic: shuffled inputs, in other containers, give the same result.
        shuffled_parts = list(self.partitions)
        rnd.shuffle(shuffled_parts)
        shuffled_members = list(members)
        rnd.shuffle(shuffled_members)
        shuffled_prev = {m: tuple(rnd.sample(ps, len(ps))) for m, ps in previous.items()}
        shuffled_prev = dict(rnd.sample(list(shuffled_prev.items()), len(shuffled_prev)))
        assert assign(shuffled_parts, shuffled_members, shuffled_prev) == new
        assert list(assign(shuffled_parts, shuffled_members, shuffled_prev)) == list(new)

        # Stable: assigning again without a change moves nothing.
        assert assign(self.partitions, members, new) == new
        self.current = new

    @rule(name=st.sampled_from(MEMBER_NAMES), rnd=st.randoms(use_true_random=False))
    def join(self, name: str, rnd: random.Random) -> None:
        self.reassign(set(self.current) | {name}, rnd)

    @precondition(lambda self: len(self.current) > 1)
    @rule(data=st.data(), rnd=st.randoms(use_true_random=False))
    def leave(self, data: st.DataObject, rnd: random.Random) -> None:
        name = data.draw(st.sampled_from(sorted(self.current)))
        self.reassign(set(self.current) - {name}, rnd)

    @precondition(lambda self: len(self.current) > 1)
    @rule(data=st.data(), rnd=st.randoms(use_true_random=False))
    def die(self, data: st.DataObject, rnd: random.Random) -> None:
        # Several members die at once (reaped together in one transaction).
        dead = data.draw(
            st.sets(
                st.sampled_from(sorted(self.current)), min_size=1, max_size=len(self.current) - 1
            )
        )
        self.reassign(set(self.current) - dead, rnd)

    @rule(
        joined=st.sets(st.sampled_from(MEMBER_NAMES), min_size=2, max_size=4),
        rnd=st.randoms(use_true_random=False),
    )
    def join_many(self, joined: set[str], rnd: random.Random) -> None:
        self.reassign(set(self.current) | joined, rnd)

    @invariant()
    def everything_is_owned(self) -> None:
        if self.current:
            _check_valid(self.current, self.partitions, set(self.current))


AssignmentMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=20, deadline=None
)
TestAssignment = AssignmentMachine.TestCase


def test_is_an_assignor() -> None:
    assignor: Assignor = assign
    assert assignor(range(4), ["a"], {}) == {"a": (0, 1, 2, 3)}


def test_a_join_takes_from_the_biggest_holders() -> None:
    before = {"a": (0, 1, 2, 3), "b": (4, 5, 6, 7)}
    after = assign(range(8), ["a", "b", "c"], before)
    # c takes 2 (one from each, ties by id keep the extra with a); a and b keep 3.
    assert after == {"a": (0, 1, 2), "b": (4, 5, 6), "c": (3, 7)}


def test_a_leave_moves_only_the_leavers_partitions() -> None:
    before = {"a": (0, 1, 2), "b": (3, 4, 5), "c": (6, 7)}
    after = assign(range(8), ["a", "c"], before)
    assert set(before["a"]) <= set(after["a"])
    assert set(before["c"]) <= set(after["c"])
    assert sorted(after["a"] + after["c"]) == list(range(8))


def test_more_members_than_partitions() -> None:
    after = assign([0, 1], ["a", "b", "c"], {"c": (0, 1)})
    # c keeps one partition (it held the most), one member gets nothing.
    assert after == {"a": (1,), "b": (), "c": (0,)}


def test_no_members_means_no_assignment() -> None:
    assert assign(range(4), [], {"a": (0, 1)}) == {}


def test_unknown_and_duplicate_previous_partitions_are_dropped() -> None:
    after = assign(range(4), ["a", "b"], {"a": (0, 1, 9), "b": (1, 2)})
    # 9 no longer exists; 1 was listed twice and stays with "a" (sorts first).
    assert after == {"a": (0, 1), "b": (2, 3)}


def test_assignment_value() -> None:
    assignment = Assignment(generation=3, partitions=[2, 0, 1], members={"b": [2], "a": [1, 0]})
    assert assignment.partitions == (0, 1, 2)
    assert list(assignment.members) == ["a", "b"]
    assert assignment.of("a") == (0, 1)
    assert assignment.of("zz") == ()
    assert assignment.owner(2) == "b"
    assert assignment.owner(7) is None
    assert assignment == Assignment(
        generation=3, partitions=(0, 1, 2), members={"a": (0, 1), "b": (2,)}
    )
    assert "generation=3" in repr(assignment)
    with pytest.raises(TypeError):
        assignment.members["c"] = (9,)  # type: ignore[index]


def test_diff() -> None:
    old = Assignment(generation=1, partitions=range(6), members={"a": [0, 1, 2], "b": [3, 4, 5]})
    new = Assignment(
        generation=2, partitions=range(6), members={"a": [0, 1], "b": [3, 4], "c": [2, 5]}
    )
    assert diff(old, new, "a") == AssignmentDiff(release=(2,), claim=(), keep=(0, 1))
    assert diff(old, new, "c") == AssignmentDiff(release=(), claim=(2, 5), keep=())
    assert diff(None, new, "c") == diff({}, new.members, "c")
    assert not diff(new, new, "a")
    assert diff(old, new, "b")
