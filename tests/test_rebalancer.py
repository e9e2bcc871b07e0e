"""The rebalancer: the pure planner, then real members, locks and Redis.

Every scenario runs real membership stores and lock managers on the session's Redis
with short intervals (heartbeat 0.1 s, lease TTL 0.6 s). Each ``run()`` records its
start and stop in a shared :class:`Recorder`, so tests can check that no partition is
ever run by two members at once; every wait is on a condition under
``trio.fail_after``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio_util

from streamkit import ConfigError, LockLost, NotReplicated
from streamkit._backoff import Backoff
from streamkit._locks import HeldLease, Lease, LockManager, lock_key, open_lock_manager
from streamkit._membership import Membership, open_membership
from streamkit._rebalancer import (
    Claim,
    RebalancePlan,
    Rebalancer,
    RebalancerSettings,
    open_rebalancer,
    plan_rebalance,
)
from streamkit._redis import health_of
from streamkit._vanished import VANISHED
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from streamkit._redis import Redis

pytestmark = pytest.mark.timeout(30)

GROUP = "rb.test"
PARTITIONS = 8
FAST: dict[str, Any] = {
    "heartbeat_interval": 0.1,
    "session_timeout": 0.5,
    "refresh_interval": 0.5,
    "leave_timeout": 1.0,
}
LEASE_TTL = 0.6
#: What a test of the path without failures runs with (see start_worker's ``patient``).
PATIENT: dict[str, Any] = {**FAST, "session_timeout": 3.0, "leave_timeout": 3.0}
PATIENT_LEASE_TTL = 3.0
GRACE = 0.5
TICK = 0.005
WAIT = 5.0


def lock_name(partition: int) -> str:
    return f"{GROUP}.{partition}"


# --------------------------------------------------------------------------- the planner


def test_plan_claims_everything_at_first() -> None:
    assert plan_rebalance({2, 0, 1}) == RebalancePlan(claim=(0, 1, 2))


def test_plan_keeps_what_stays_assigned() -> None:
    plan = plan_rebalance({0, 1, 4}, running={0, 1, 2, 3})
    assert plan == RebalancePlan(claim=(4,), release=(2, 3))
    assert not plan_rebalance({0, 1}, running={0, 1})


def test_plan_abandons_unassigned_waits() -> None:
    plan = plan_rebalance({1}, running={1}, acquiring={2, 3})
    assert plan == RebalancePlan(abandon=(2, 3))


def test_plan_lets_draining_finish_before_claiming_again() -> None:
    # Moved away and straight back: wait until the old run() is gone, then claim.
    assert not plan_rebalance({5}, draining={5})
    assert plan_rebalance({5}) == RebalancePlan(claim=(5,))
    # Draining partitions are never released twice.
    assert not plan_rebalance(set(), draining={5})


def test_plan_leaves_idle_alone_until_unassigned() -> None:
    assert not plan_rebalance({1, 2}, running={1}, idle={2})
    assert plan_rebalance({1}, running={1}, idle={2}) == RebalancePlan(forget=(2,))


def test_plan_empty_assignment_releases_everything() -> None:
    plan = plan_rebalance((), running={0, 1}, acquiring={2}, draining={3}, idle={4})
    assert plan == RebalancePlan(release=(0, 1), abandon=(2,), forget=(4,))


@pytest.mark.parametrize(
    "options",
    [{"lease_ttl": 0}, {"lease_ttl": math.inf}, {"grace": -1}, {"grace": math.nan}],
)
def test_settings_are_validated(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        RebalancerSettings(**options)


async def test_claim_generation_is_a_deprecated_name_of_previous_runs() -> None:
    claim = Claim(3, HeldLease(Lease("p", lock_key("p"), "me", 1, 1.0, 1.0)), previous_runs=2)
    with pytest.deprecated_call(match="previous_runs"):
        assert claim.generation == 2


# --------------------------------------------------------------------------- harness


@attrs.frozen
class Event:
    kind: str  # "start" or "stop"
    member: str
    partition: int
    at: float
    how: str = ""  # for stops: "drained", "returned" or "cancelled"
    reason: str = ""  # the cancel reason


@attrs.define(eq=False)
class Recorder:
    """Shared by every member's run(): starts, stops and heartbeat-like ticks."""

    events: list[Event] = attrs.field(factory=list)
    last_tick: dict[tuple[str, int], float] = attrs.field(factory=dict)
    max_gap: dict[tuple[str, int], float] = attrs.field(factory=dict)
    changed: Any = attrs.field(factory=lambda: trio_util.AsyncValue(0))

    def add(self, kind: str, member: str, partition: int, **extra: str) -> None:
        self.events.append(Event(kind, member, partition, trio.current_time(), **extra))
        self.changed.value += 1

    def tick(self, member: str, partition: int) -> None:
        now = trio.current_time()
        key = (member, partition)
        if key in self.last_tick:
            gap = now - self.last_tick[key]
            self.max_gap[key] = max(self.max_gap.get(key, 0.0), gap)
        self.last_tick[key] = now

    def runner(self, member: str, *, ticking: bool = False) -> Callable[[Claim], Awaitable[None]]:
        """A well-behaved run(): waits (or ticks) until draining, then returns.

        Without ticking, run() has no timed scope of its own, so a Cancelled it sees
        carries the reason of the scope that was cancelled (a timeout expiring at the
        same moment would otherwise show instead).
        """

        async def run(claim: Claim) -> None:
            p = claim.partition
            self.add("start", member, p)
            self.last_tick.pop((member, p), None)
            try:
                if not ticking:
                    await claim.wait_draining()
                while not claim.draining.value:
                    self.tick(member, p)
                    with trio.move_on_after(TICK):
                        await claim.wait_draining()
            except trio.Cancelled as exc:
                self.add("stop", member, p, how="cancelled", reason=exc.reason or "")
                raise
            self.add("stop", member, p, how="drained")

        return run

    def of(self, partition: int) -> list[Event]:
        return [e for e in self.events if e.partition == partition]

    def starts(self, member: str, partition: int) -> int:
        return sum(1 for e in self.of(partition) if e.kind == "start" and e.member == member)

    def running(self, partition: int) -> str | None:
        """Who runs ``partition`` now, as far as the events say."""
        holder = None
        for e in self.of(partition):
            holder = e.member if e.kind == "start" else None
        return holder

    def assert_exclusive(self) -> None:
        """No two run() of one partition ever overlapped, across all members."""
        for p in {e.partition for e in self.events}:
            holder: str | None = None
            for e in self.of(p):
                if e.kind == "start":
                    assert holder is None, f"partition {p}: {e.member} started while {holder} ran"
                    holder = e.member
                else:
                    assert holder == e.member, f"partition {p}: stray stop {e}"
                    holder = None

    async def wait(self, predicate: Callable[[], bool]) -> None:
        with trio.fail_after(WAIT):
            await self.changed.wait_value(lambda _: predicate())


@attrs.define(eq=False)
class Worker:
    """A member + lock manager + rebalancer running in its own task."""

    id: str
    member: Membership
    locks: LockManager
    rebalancer: Rebalancer
    stopping: trio.Event
    done: trio.Event

    async def leave(self) -> None:
        """Drain gracefully, then leave the group; wait until gone."""
        self.stopping.set()
        with trio.fail_after(WAIT):
            await self.done.wait()

    async def wait_settled(self) -> None:
        """Wait until the partitions running here are exactly those assigned."""
        with trio.fail_after(WAIT):
            await trio_util.wait_all(
                lambda: self.member.partitions.wait_value(lambda v: v),
                lambda: self.rebalancer.owned.wait_value(
                    lambda v: v and v == self.member.partitions.value
                ),
            )


async def start_worker(
    nursery: trio.Nursery,
    redis: Redis,
    member_id: str,
    rec: Recorder,
    *,
    run: Callable[[Claim], Awaitable[None]] | None = None,
    grace: float = GRACE,
    ticking: bool = False,
    patient: bool = False,
) -> Worker:
    """A worker of the test group; ``patient``: with timeouts that a loaded machine's
    stalls (the event loop or Redis late by a second) do not reach, for a test of what
    happens when nothing fails."""
    stopping, done = trio.Event(), trio.Event()
    timings = PATIENT if patient else FAST

    async def main(*, task_status: trio.TaskStatus[Worker]) -> None:
        try:
            async with (
                open_membership(
                    redis, GROUP, partitions=PARTITIONS, member_id=member_id, **timings
                ) as member,
                open_lock_manager(redis, owner=member_id) as locks,
                open_rebalancer(
                    member.partitions,
                    locks,
                    lock_name=lock_name,
                    run=run or rec.runner(member_id, ticking=ticking),
                    lease_ttl=PATIENT_LEASE_TTL if patient else LEASE_TTL,
                    grace=grace,
                ) as rebalancer,
            ):
                task_status.started(Worker(member_id, member, locks, rebalancer, stopping, done))
                await stopping.wait()
                await rebalancer.drain()
        finally:
            done.set()

    with trio.fail_after(WAIT):
        worker: Worker = await nursery.start(main)
    return worker


@pytest.fixture
async def nursery(redis: Redis) -> AsyncIterator[trio.Nursery]:
    # Depends on ``redis`` so that workers release and leave before the client closes.
    async with trio.open_nursery() as n:
        yield n
        n.cancel_scope.cancel()


async def holders(locks: LockManager, partitions: range | list[int]) -> dict[int, str | None]:
    result = {}
    for p in partitions:
        info = await locks.holder(lock_name(p))
        result[p] = info.owner if info else None
    return result


# --------------------------------------------------------------------------- scenarios


async def test_join_moves_partitions_without_overlap(redis: Redis, nursery: trio.Nursery) -> None:
    rec = Recorder()
    a = await start_worker(nursery, redis, "a", rec, ticking=True)
    await a.wait_settled()
    assert a.rebalancer.owned.value == frozenset(range(PARTITIONS))
    assert await holders(a.locks, range(PARTITIONS)) == dict.fromkeys(range(PARTITIONS), "a")
    # Let every run() tick a few times, then measure gaps from here on.
    await rec.wait(lambda: len(rec.last_tick) == PARTITIONS)
    rec.max_gap.clear()

    joined_at = trio.current_time()
    b = await start_worker(nursery, redis, "b", rec)
    moved = b.member.partitions.value
    assert moved, "the joining member gets a share at once"
    await b.wait_settled()
    resumed = trio.current_time() - joined_at
    await a.wait_settled()
    kept = a.member.partitions.value
    assert kept | moved == frozenset(range(PARTITIONS))
    assert not kept & moved

    # Moved partitions stopped on a by draining, not by being cancelled, and only then
    # started on b; the kept ones were started once and never stopped.
    rec.assert_exclusive()
    for p in moved:
        assert [(e.kind, e.member, e.how) for e in rec.of(p)] == [
            ("start", "a", ""),
            ("stop", "a", "drained"),
            ("start", "b", ""),
        ]
    for p in kept:
        assert [(e.kind, e.member) for e in rec.of(p)] == [("start", "a")]
        assert rec.running(p) == "a"
    await rec.wait(lambda: all(rec.max_gap.get(("a", p)) for p in kept))
    longest_gap = max(rec.max_gap[("a", p)] for p in kept)
    print(
        f"\nrebalance on join: moved partitions resumed {resumed * 1000:.0f} ms after the join; "
        f"longest tick gap of an unmoved partition {longest_gap * 1000:.1f} ms"
    )
    stats = a.rebalancer.statistics()
    assert stats.owned == kept
    assert (stats.starts, stats.stops) == (PARTITIONS, len(moved))
    assert (stats.cancelled, stats.lost) == (0, 0)
    assert "Rebalancer owned=" in repr(a.rebalancer)
    assert await holders(a.locks, sorted(moved)) == dict.fromkeys(sorted(moved), "b")


async def test_leave_moves_partitions_and_drains(redis: Redis, nursery: trio.Nursery) -> None:
    rec = Recorder()
    # (Patient: a second's stall of a loaded machine would lose b's leases before it
    # leaves, and its partitions would be cancelled, not drained.)
    a = await start_worker(nursery, redis, "a", rec, patient=True)
    b = await start_worker(nursery, redis, "b", rec, patient=True)
    await a.wait_settled()
    await b.wait_settled()
    from_b = b.member.partitions.value

    await b.leave()
    # b's run() calls were drained, not cancelled, and its leases released.
    for p in from_b:
        stops = [e for e in rec.of(p) if e.kind == "stop" and e.member == "b"]
        assert [e.how for e in stops] == ["drained"]
    assert b.rebalancer.owned.value == frozenset()
    assert b.locks.statistics().holding == ()
    assert b.rebalancer.statistics().cancelled == 0

    await rec.wait(lambda: all(rec.running(p) == "a" for p in range(PARTITIONS)))
    await a.wait_settled()
    assert a.rebalancer.owned.value == frozenset(range(PARTITIONS))
    rec.assert_exclusive()

    # drain() stops everything gracefully and claims nothing afterwards.
    await a.rebalancer.drain()
    assert a.rebalancer.owned.value == frozenset()
    assert all(rec.running(p) is None for p in range(PARTITIONS))
    assert all(e.how == "drained" for e in rec.events if e.kind == "stop")
    assert await holders(a.locks, range(PARTITIONS)) == dict.fromkeys(range(PARTITIONS))


async def test_run_ignoring_draining_is_cancelled_after_grace(redis: Redis) -> None:
    rec = Recorder()
    assigned = trio_util.AsyncValue(frozenset({3, 4}))
    grace = 0.2

    async def stubborn(claim: Claim) -> None:
        rec.add("start", "x", claim.partition)
        try:
            await trio.sleep_forever()
        except trio.Cancelled as exc:
            rec.add("stop", "x", claim.partition, how="cancelled", reason=exc.reason or "")
            raise

    with trio.fail_after(WAIT):
        async with (
            open_lock_manager(redis) as locks,
            open_rebalancer(
                assigned, locks, lock_name=lock_name, run=stubborn, lease_ttl=LEASE_TTL, grace=grace
            ) as rebalancer,
        ):
            await rebalancer.owned.wait_value(frozenset({3, 4}))
            assigned.value = frozenset({4})
            unassigned_at = trio.current_time()
            await rebalancer.owned.wait_value(frozenset({4}))
            await rebalancer.partition_states.wait_value(lambda s: 3 not in s)  # released
            (stop,) = [e for e in rec.of(3) if e.kind == "stop"]
            assert stop.how == "cancelled"
            assert "partition 3 moved" in stop.reason
            assert stop.at - unassigned_at >= grace
            assert await locks.holder(lock_name(3)) is None
            assert (await locks.holder(lock_name(4))) is not None
            assert rebalancer.statistics().cancelled == 1
            assert rec.running(4) == "x"
    # Leaving the block drains: partition 4 ignores it too, so it is cancelled.
    assert rec.running(4) is None
    assert "partition 4" in rec.of(4)[-1].reason


async def test_lost_lease_restarts_the_partition(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="streamkit.rebalancer")
    rec = Recorder()
    assigned = trio_util.AsyncValue(frozenset({0, 1}))
    claims: list[Claim] = []
    well_behaved = rec.runner("x")

    async def run(claim: Claim) -> None:
        claims.append(claim)
        await well_behaved(claim)

    with trio.fail_after(WAIT):
        async with (
            open_lock_manager(redis) as locks,
            open_lock_manager(redis, owner="intruder") as intruder,
            open_rebalancer(
                assigned,
                locks,
                lock_name=lock_name,
                run=run,
                # patient: nothing here waits for an expiry (the loss is a refused
                # extension), and a loaded machine must not lose partition 1's lease
                lease_ttl=PATIENT_LEASE_TTL,
                acquire_backoff=Backoff(initial=0.2, maximum=0.2, jitter=0),
            ) as rebalancer,
        ):
            await rebalancer.owned.wait_value(frozenset({0, 1}))
            first = claims[0] if claims[0].partition == 0 else claims[1]

            # Someone else takes the lock (as after our lease expired in a pause).
            await redis.delete([lock_key(lock_name(0))])
            lease = await intruder.acquire(lock_name(0), ttl=5)
            # Lost, and waiting for the lock again.
            await rebalancer.partition_states.wait_value(lambda s: s.get(0) == "acquiring")
            stop = rec.of(0)[-1]
            assert stop.how == "cancelled"
            assert "lost" in stop.reason
            assert first.held.lost.value
            assert rebalancer.statistics().lost == 1
            [said] = [r for r in caplog.records if r.name == "streamkit.rebalancer"]
            assert said.levelno == logging.WARNING
            assert said.getMessage().startswith("lease on partition 0 lost (")
            assert said.getMessage().endswith("); re-acquiring it")
            assert 0 in rebalancer.statistics().acquiring  # waiting for the intruder
            assert rec.running(1) == "x"  # the other partition is unaffected

            await intruder.release(lease)
            await rec.wait(lambda: rec.running(0) == "x")
            second = claims[-1]
            assert (second.partition, second.previous_runs) == (0, 1)
            assert second.held.token > lease.token > first.held.token
            await rebalancer.owned.wait_value(frozenset({0, 1}))
            assert rec.starts("x", 1) == 1
    rec.assert_exclusive()


async def test_failing_run_propagates_with_locks_released(redis: Redis) -> None:
    rec = Recorder()
    well_behaved = rec.runner("x")
    assigned = trio_util.AsyncValue(frozenset(range(4)))

    class Boom(Exception):
        pass

    async def run(claim: Claim) -> None:
        if claim.partition == 2:
            await trio.sleep(0.05)
            raise Boom("partition 2 is broken")
        await well_behaved(claim)

    with trio.fail_after(WAIT):
        async with open_lock_manager(redis) as locks:
            with pytest.raises(Boom) as info:
                async with open_rebalancer(
                    assigned, locks, lock_name=lock_name, run=run, lease_ttl=LEASE_TTL
                ):
                    await trio.sleep_forever()
            assert type(info.value) is Boom  # itself, not an exception group
            assert await holders(locks, range(4)) == dict.fromkeys(range(4))
            assert locks.statistics().holding == ()
    for p in (0, 1, 3):
        assert [e.how for e in rec.of(p) if e.kind == "stop"] == ["cancelled"]


async def test_error_in_block_takes_precedence(redis: Redis) -> None:
    rec = Recorder()
    async with open_lock_manager(redis) as locks:

        async def body() -> None:
            async with open_rebalancer(
                trio_util.AsyncValue(frozenset({0})),
                locks,
                lock_name=lock_name,
                run=rec.runner("x"),
                lease_ttl=LEASE_TTL,
            ) as rebalancer:
                await rebalancer.owned.wait_value(frozenset({0}))
                raise KeyError("mine")

        with trio.fail_after(WAIT), pytest.raises(KeyError, match="mine"):
            await body()
        assert await locks.holder(lock_name(0)) is None


async def test_cancelling_the_rebalancer_releases_locks(redis: Redis) -> None:
    rec = Recorder()
    async with open_lock_manager(redis) as locks:
        with trio.fail_after(WAIT):
            with trio.CancelScope() as outer:
                async with open_rebalancer(
                    trio_util.AsyncValue(frozenset(range(4))),
                    locks,
                    lock_name=lock_name,
                    run=rec.runner("x"),
                    lease_ttl=LEASE_TTL,
                ) as rebalancer:
                    await rebalancer.owned.wait_value(frozenset(range(4)))
                    outer.cancel("worker shutting down")
                    await trio.sleep_forever()
            assert outer.cancelled_caught
            assert await holders(locks, range(4)) == dict.fromkeys(range(4))
        assert [e.how for e in rec.events if e.kind == "stop"] == ["cancelled"] * 4


async def test_unassigned_before_acquired_stops_waiting(redis: Redis) -> None:
    rec = Recorder()
    assigned = trio_util.AsyncValue(frozenset({0}))
    async with open_lock_manager(redis) as locks, open_lock_manager(redis) as other:
        lease = await other.acquire(lock_name(1), ttl=5)
        with trio.fail_after(WAIT):
            async with open_rebalancer(
                assigned, locks, lock_name=lock_name, run=rec.runner("x"), lease_ttl=LEASE_TTL
            ) as rebalancer:
                await rebalancer.owned.wait_value(frozenset({0}))
                assigned.value = frozenset({0, 1})
                await rebalancer.partition_states.wait_value({0: "running", 1: "acquiring"})
                assigned.value = frozenset({0})
                await rebalancer.partition_states.wait_value({0: "running"})
                assert rec.starts("x", 1) == 0
                await other.release(lease)
                assigned.value = frozenset({0, 1})
                await rebalancer.owned.wait_value(frozenset({0, 1}))
        assert rec.starts("x", 1) == 1


async def test_run_returning_early_is_not_restarted(redis: Redis) -> None:
    calls: list[int] = []
    assigned = trio_util.AsyncValue(frozenset({0}))

    async def quits(claim: Claim) -> None:
        calls.append(claim.partition)

    async with open_lock_manager(redis) as locks:
        with trio.fail_after(WAIT):
            async with open_rebalancer(
                assigned, locks, lock_name=lock_name, run=quits, lease_ttl=LEASE_TTL
            ) as rebalancer:
                await rebalancer.partition_states.wait_value({0: "idle"})
                assert rebalancer.owned.value == frozenset()
                assert await locks.holder(lock_name(0)) is None
                assigned.value = frozenset({0, 1})  # another change: still no restart
                await rebalancer.partition_states.wait_value({0: "idle", 1: "idle"})
                assert calls == [0, 1]
                assigned.value = frozenset()
                await rebalancer.partition_states.wait_value({})
                assigned.value = frozenset({0})  # assigned afresh: starts again
                await rebalancer.partition_states.wait_value({0: "idle"})
                assert calls == [0, 1, 0]


async def test_hold_errors_are_not_swallowed(redis: Redis) -> None:
    # LockLost from a run() that holds another lease itself is the user's business.
    async with open_lock_manager(redis) as locks:

        async def run(claim: Claim) -> None:
            raise LockLost("elsewhere", "test")

        with trio.fail_after(WAIT), pytest.raises(LockLost, match="elsewhere"):
            async with open_rebalancer(
                trio_util.AsyncValue(frozenset({0})),
                locks,
                lock_name=lock_name,
                run=run,
                lease_ttl=LEASE_TTL,
            ):
                await trio.sleep_forever()


@contextlib.asynccontextmanager
async def rebalancing_partition_0(
    redis: Redis, run: Callable[[Claim], Awaitable[None]]
) -> AsyncIterator[Rebalancer]:
    """A rebalancer running ``run`` for partition 0, retaking a lost lease at once."""
    async with (
        open_lock_manager(redis) as locks,
        open_rebalancer(
            trio_util.AsyncValue(frozenset({0})),
            locks,
            lock_name=lock_name,
            run=run,
            lease_ttl=LEASE_TTL,
            acquire_backoff=Backoff(initial=0.05, maximum=0.05, jitter=0),
        ) as rebalancer,
    ):
        yield rebalancer


async def test_run_losing_its_lease_before_the_hold_noticed_runs_again(redis: Redis) -> None:
    """The events find the lease's local deadline passed and raise :class:`LockLost`
    about it before the hold's renewal noticed (a worker starved of CPU during a
    cluster failover, in ``tests/test_cluster_failover.py``): a lost lease, taken
    again, not a fatal error that stopped every partition and the worker."""
    noticed: list[bool] = []
    again = trio.Event()
    well_behaved = Recorder().runner("x")

    async def run(claim: Claim) -> None:
        noticed.append(claim.held.lost.value)
        if len(noticed) == 1:
            raise LockLost(claim.held.name, "the lease ran out before it could be extended")
        again.set()
        await well_behaved(claim)

    with trio.fail_after(WAIT):
        async with rebalancing_partition_0(redis, run) as rebalancer:
            await again.wait()
            assert noticed == [False, False]
            assert rebalancer.statistics().lost == 1
            # Lost here only: the lock did not vanish (the hold released it).
            assert health_of(redis).vanished.reports.value == 0


async def test_run_failing_for_want_of_replicas_runs_again(redis: Redis) -> None:
    """:class:`NotReplicated` out of run() (the relay's last round, as a partition is
    handed over during a cluster failover, met a master without its replica) is not
    fatal: the write ran, what it carried is retried, the partition runs again."""
    runs: list[int] = []
    again = trio.Event()
    well_behaved = Recorder().runner("x")

    async def run(claim: Claim) -> None:
        runs.append(claim.partition)
        if len(runs) == 1:
            raise NotReplicated(1, 0, 2.0)
        again.set()
        await well_behaved(claim)

    with trio.fail_after(WAIT):
        async with rebalancing_partition_0(redis, run):
            await again.wait()
            assert runs == [0, 0]


async def test_statistics_count_rebalances_until_every_partition_runs(redis: Redis) -> None:
    rec = Recorder()
    assigned = trio_util.AsyncValue(frozenset({0}))
    async with open_lock_manager(redis) as locks, open_lock_manager(redis) as other:
        lease = await other.acquire(lock_name(1), ttl=5)
        with trio.fail_after(WAIT):
            async with open_rebalancer(
                assigned, locks, lock_name=lock_name, run=rec.runner("x"), lease_ttl=LEASE_TTL
            ) as rebalancer:
                # The first assignment is a rebalance too: done once partition 0 runs.
                await rebalancer.owned.wait_value(frozenset({0}))
                stats = rebalancer.statistics()
                assert (stats.rebalances, stats.rebalancing) == (1, False)
                first = stats.rebalance_seconds
                # Partition 1's lock is held elsewhere: the rebalance lasts until it is
                # acquired and partition 1 runs.
                assigned.value = frozenset({0, 1})
                began = trio.current_time()
                await rebalancer.partition_states.wait_value({0: "running", 1: "acquiring"})
                assert rebalancer.statistics().rebalancing
                await trio.sleep(0.2)
                assert rebalancer.statistics().rebalances == 1
                await other.release(lease)
                await rebalancer.owned.wait_value(frozenset({0, 1}))
                took = trio.current_time() - began
                stats = rebalancer.statistics()
                assert (stats.rebalances, stats.rebalancing) == (2, False)
                assert 0.2 <= stats.rebalance_seconds - first <= took
                # Handing a partition back: a rebalance until it is released.
                assigned.value = frozenset({1})
                await rebalancer.partition_states.wait_value({1: "running"})
                stats = rebalancer.statistics()
                assert (stats.rebalances, stats.rebalancing) == (3, False)


@pytest.mark.alone  # its load is the test: the suite's others beside it made it fail
async def test_thousands_of_partitions_start_at_once_without_a_lost_lease(redis: Redis) -> None:
    """4,096 partitions assigned at once: the rebalancer publishes their states once
    per scheduling round, not once per change (which looked at every partition each
    time and blocked the event loop for seconds, so leases ran out)."""
    partitions = frozenset(range(4096))
    assigned = trio_util.AsyncValue(partitions)

    async def run(claim: Claim) -> None:
        await claim.wait_draining()

    async with open_lock_manager(redis) as locks:
        with trio.fail_after(90):
            async with open_rebalancer(
                assigned, locks, lock_name=lock_name, run=run, lease_ttl=10
            ) as rebalancer:
                await rebalancer.owned.wait_value(partitions)
                # Through the renewals that follow, too (a round of them every few
                # seconds; slower on a loaded machine, where losing none is the point).
                extended = locks.statistics().extended
                await wait_until(
                    lambda: locks.statistics().extended >= extended + len(partitions),
                    what="as many extensions as leases",
                    within=60,
                )
                stats = rebalancer.statistics()
                assert (stats.lost, stats.starts) == (0, len(partitions))


async def test_a_lease_lost_here_while_its_lock_is_still_ours_did_not_vanish(
    redis: Redis,
) -> None:
    """A lease lost at its local deadline (a little before its TTL ends in Redis: the
    worker starved of CPU, or Redis out of reach until then) whose lock still holds it
    is lost here only: not a lock that vanished (a reset soak's workers said so)."""
    assigned = trio_util.AsyncValue(frozenset[int]())
    reason = "the lease ran out before it could be extended"
    with trio.fail_after(WAIT):
        async with (
            open_lock_manager(redis) as locks,
            open_rebalancer(
                assigned, locks, lock_name=lock_name, run=Recorder().runner("x")
            ) as rebalancer,
        ):
            held = HeldLease(await locks.acquire(lock_name(0), ttl=30))
            assert await rebalancer._why_lost(held, reason) == reason
            assert health_of(redis).vanished.reports.value == 0
            # Gone while valid: vanished.
            await redis.delete([lock_key(lock_name(0))])
            assert (await rebalancer._why_lost(held, reason)).startswith(VANISHED)
