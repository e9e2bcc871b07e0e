"""The rebalancer: turns an assignment into owned partitions, one cancel scope each.

A member's assignment (say :attr:`Membership.partitions`) says which partitions it
*should* work on; the rebalancer makes that true. For every assigned partition it
starts a task that takes the partition's lease with :meth:`LockManager.hold` (waiting
while the previous owner finishes) and then runs the user's ``run(claim)``, inside a
:class:`trio.CancelScope` of its own. When a partition is no longer assigned, its
:attr:`Claim.draining` turns true, ``run()`` gets ``grace`` seconds to finish and
return, and then its scope is cancelled with a reason; the lease is released as the
hold exits. Partitions that stay assigned are never touched.

This replaces runnel's ``Waiter`` task: there is no polling loop between "told to
stop" and "stopped", only scopes, and decisions are taken by a pure function,
:func:`plan_rebalance`, that the async code merely applies.

Each partition goes through these states::

    acquiring --lock held--> running --unassigned--> draining --returned/cancelled--> gone
        |                       |  \\--run() returned while assigned--> idle
        |                       \\--lease lost, Redis unavailable--> acquiring (again,
        |                                                           after a backoff)
        \\--unassigned--> gone (the wait for the lock is cancelled)

Why one room (about 700 lines): one state machine per partition (acquiring, running,
draining, releasing) and the loop that applies plans to it; the plan itself is a pure
function in :mod:`streamkit._assignment`.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import asynccontextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

import attrs
import trio
import trio_util

from ._backoff import Backoff
from ._defaults import DEFAULT_GRACE, DEFAULT_LEASE_TTL
from ._errors import LockLost, NotReplicated, RedisUnavailable, StreamkitError
from ._locks import lost_to_outage
from ._logs import log_context, partitions_text
from ._nurseries import open_service_nursery
from ._redis import health_of
from ._validate import non_negative_number, valid_ttl
from ._vanished import VANISHED, lost_to_vanishing

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping

    from ._locks import HeldLease, LockManager

__all__ = [
    "DEFAULT_ACQUIRE_BACKOFF",
    "DEFAULT_GRACE",
    "DEFAULT_LEASE_TTL",
    "Claim",
    "PartitionState",
    "RebalancePlan",
    "Rebalancer",
    "RebalancerSettings",
    "RebalancerStatistics",
    "open_rebalancer",
    "plan_rebalance",
]

log = logging.getLogger("streamkit.rebalancer")


#: The pause before re-acquiring a partition whose lease was lost.
DEFAULT_ACQUIRE_BACKOFF = Backoff(initial=0.05, maximum=2.0)

#: Where a partition under way is (see :attr:`Rebalancer.partition_states`).
PartitionState = Literal["acquiring", "running", "draining", "releasing", "idle"]


# --------------------------------------------------------------------------- the plan


@attrs.frozen(kw_only=True)
class RebalancePlan:
    """What the rebalancer must do to follow an assignment (all tuples sorted).

    Attributes:
        claim: assigned partitions with nothing under way: start acquiring them.
        release: running partitions no longer assigned: drain them (set
            ``draining``, wait up to ``grace``, then cancel).
        abandon: partitions still waiting for their lock that are no longer
            assigned: stop waiting at once.
        forget: idle partitions (``run()`` returned while assigned) that are no
            longer assigned: drop them, so a later assignment starts them again.
    """

    claim: tuple[int, ...] = ()
    release: tuple[int, ...] = ()
    abandon: tuple[int, ...] = ()
    forget: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        """True if there is anything to do."""
        return bool(self.claim or self.release or self.abandon or self.forget)


def plan_rebalance(
    assigned: Collection[int],
    *,
    running: Collection[int] = (),
    acquiring: Collection[int] = (),
    draining: Collection[int] = (),
    idle: Collection[int] = (),
) -> RebalancePlan:
    """Decide how to get from the partitions under way to the ``assigned`` ones.

    Pure: no I/O, no clock. The four state sets are disjoint.

    * A running partition that stays assigned is left alone: it keeps running.
    * A draining partition is left to finish even if it is assigned again; once it
      is gone, the next plan claims it afresh (never two ``run()`` at once).
    * An idle partition stays idle while it stays assigned (no restart loop).

    Args:
        assigned: the partitions this member should own.
        running: partitions whose ``run()`` is running (not draining).
        acquiring: partitions waiting for their lock (or backing off after a loss).
        draining: partitions told to drain whose ``run()`` has not ended yet.
        idle: partitions whose ``run()`` returned on its own while assigned.
    """
    want = frozenset(assigned)
    running, acquiring = frozenset(running), frozenset(acquiring)
    draining, idle = frozenset(draining), frozenset(idle)
    under_way = running | acquiring | draining | idle
    return RebalancePlan(
        claim=tuple(sorted(want - under_way)),
        release=tuple(sorted(running - want)),
        abandon=tuple(sorted(acquiring - want)),
        forget=tuple(sorted(idle - want)),
    )


# --------------------------------------------------------------------------- values


@attrs.define(eq=False)
class Claim:
    """One owned partition, as handed to ``run(claim)``.

    Attributes:
        partition: the partition number.
        held: the partition's lease, kept alive by :meth:`LockManager.hold`; use
            ``held.lease.value`` / ``held.token`` for fenced writes.
        draining: ``trio_util.AsyncBool`` that turns true when the partition is
            being moved away (or the rebalancer drains): finish the current unit of
            work, acknowledge it, and return.
        started_at: Trio-clock time when ``run()`` was started.
        previous_runs: how many times this rebalancer has started ``run()`` for this
            partition before (0 the first time; more after a lost lease or a
            re-assignment). Not to be confused with an :class:`~streamkit.lowlevel.Assignment`'s
            ``generation``, which counts membership changes.
    """

    partition: int
    held: HeldLease = attrs.field(repr=False)
    draining: trio_util.AsyncBool = attrs.field(factory=trio_util.AsyncBool, repr=False)
    started_at: float = attrs.field(factory=trio.current_time, repr=False)
    previous_runs: int = 0

    @property
    def generation(self) -> int:
        """Deprecated: the old name of :attr:`previous_runs`."""
        warnings.warn(
            "Claim.generation is deprecated; use Claim.previous_runs",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.previous_runs

    async def wait_draining(self) -> None:
        """Wait until the partition must be handed back.

        Cancellation:
            Safe to cancel.
        """
        await self.draining.wait_value(True)


@attrs.frozen(kw_only=True)
class RebalancerSettings:
    """How a rebalancer holds and hands back partitions. Times are in seconds.

    Attributes:
        lease_ttl: the TTL of each partition lease (renewed every ``lease_ttl / 3``).
        grace: how long ``run()`` may take to return once its partition drains.
        acquire_backoff: the pause before re-acquiring a partition whose lease
            was lost (it grows while losses repeat).
    """

    lease_ttl: float = attrs.field(default=DEFAULT_LEASE_TTL, validator=valid_ttl)
    grace: float = attrs.field(default=DEFAULT_GRACE, validator=non_negative_number)
    acquire_backoff: Backoff = attrs.field(
        default=DEFAULT_ACQUIRE_BACKOFF, validator=attrs.validators.instance_of(Backoff)
    )


@attrs.frozen(kw_only=True)
class RebalancerStatistics:
    """A snapshot of a :class:`Rebalancer`.

    Attributes:
        assigned: the partitions it is told to own.
        owned: partitions whose ``run()`` is running (draining ones included).
        acquiring: partitions waiting for their lock.
        draining: partitions told to drain whose ``run()`` has not ended yet.
        idle: partitions whose ``run()`` returned while still assigned.
        starts: ``run()`` calls started.
        stops: ``run()`` calls ended (returned, cancelled or lost).
        lost: leases lost under a running ``run()``.
        cancelled: ``run()`` calls cancelled for not draining within the grace.
        rebalances: rebalances completed: changes of the assignment (the first one
            included), each until every assigned partition runs and every other
            one is released.
        rebalance_seconds: the time those rebalances took, in total.
        rebalancing: whether a rebalance is under way.
    """

    assigned: frozenset[int]
    owned: frozenset[int]
    acquiring: frozenset[int]
    draining: frozenset[int]
    idle: frozenset[int]
    starts: int
    stops: int
    lost: int
    cancelled: int
    rebalances: int = 0
    rebalance_seconds: float = 0.0
    rebalancing: bool = False


@attrs.define(eq=False)
class _Slot:
    """The rebalancer's bookkeeping for one partition under way."""

    partition: int
    state: PartitionState = "acquiring"
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    claim: Claim | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    # Set once the partition is to be handed back: never start run() again.
    leaving: str | None = None


class _Fatal(Exception):
    """Marks that a partition task recorded a fatal error (never escapes)."""


# --------------------------------------------------------------------------- the rebalancer


@attrs.define(eq=False, repr=False)
class Rebalancer:
    """Runs ``run(claim)`` for each owned partition; get one from :func:`open_rebalancer`.

    Attributes:
        assigned: ``trio_util.AsyncValue[frozenset[int]]``: the partitions to own.
        owned: ``trio_util.AsyncValue[frozenset[int]]``: the partitions whose
            ``run()`` is running now (under a held lease), draining ones included.
        partition_states: ``trio_util.AsyncValue`` of a read-only mapping from each
            partition under way to where it is: ``"acquiring"`` (waiting for its
            lock, or backing off after a lost lease), ``"running"``, ``"draining"``
            (``run()`` told to return), ``"releasing"`` (``run()`` ended, the lease
            is being released) or ``"idle"`` (``run()`` returned while assigned).
            A partition is absent once it is gone. Wait with
            ``await rebalancer.partition_states.wait_value(lambda s: 3 not in s)``.
        settings: lease TTL, grace and backoff.
    """

    assigned: trio_util.AsyncValue[frozenset[int]] = attrs.field(repr=False)
    locks: LockManager = attrs.field(repr=False)
    lock_name: Callable[[int], str] = attrs.field(repr=False)
    run: Callable[[Claim], Awaitable[None]] = attrs.field(repr=False)
    settings: RebalancerSettings
    owned: trio_util.AsyncValue[frozenset[int]] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(frozenset())
    )
    partition_states: trio_util.AsyncValue[Mapping[int, PartitionState]] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(MappingProxyType({}))
    )
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)
    _slots: dict[int, _Slot] = attrs.field(init=False, factory=dict)
    # Bumped on every change of a partition's state; waiters compare values.
    _version: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )
    _closing: bool = attrs.field(init=False, default=False)
    _fatal: BaseException | None = attrs.field(init=False, default=None)
    _runs: dict[int, int] = attrs.field(init=False, factory=dict)
    _starts: int = attrs.field(init=False, default=0)
    _stops: int = attrs.field(init=False, default=0)
    _lost: int = attrs.field(init=False, default=0)
    _cancelled: int = attrs.field(init=False, default=0)
    # Rebalances: the assignment last planned for, when the one under way began
    # (None: none is), how many completed and how long they took.
    _planned: frozenset[int] = attrs.field(init=False, factory=frozenset)
    _rebalancing_since: float | None = attrs.field(init=False, default=None)
    _rebalances: int = attrs.field(init=False, default=0)
    _rebalance_seconds: float = attrs.field(init=False, default=0.0)
    # A rebalance ended since the supervisor last said what this member owns.
    _settled: bool = attrs.field(init=False, default=False)
    # A publish of the partitions' states is due this scheduling round.
    _publishing: bool = attrs.field(init=False, default=False)

    # ----------------------------------------------------------------- inspection

    def _waiting(self) -> tuple[int, str]:
        """What waits during an outage: the partitions under way (not idle)."""
        return len(self._slots) - len(self._in("idle")), "partition"

    def _in(self, *states: PartitionState) -> frozenset[int]:
        return frozenset(p for p, s in self._slots.items() if s.state in states)

    def statistics(self) -> RebalancerStatistics:
        """Return a snapshot of the partitions under way and the counters."""
        return RebalancerStatistics(
            assigned=self.assigned.value,
            owned=self.owned.value,
            acquiring=self._in("acquiring"),
            draining=self._in("draining", "releasing"),
            idle=self._in("idle"),
            starts=self._starts,
            stops=self._stops,
            lost=self._lost,
            cancelled=self._cancelled,
            rebalances=self._rebalances,
            rebalance_seconds=self._rebalance_seconds,
            rebalancing=self._rebalancing_since is not None,
        )

    def __repr__(self) -> str:
        def show(ps: frozenset[int]) -> str:
            return str(sorted(ps))

        closing = ", draining all" if self._closing else ""
        return (
            f"<Rebalancer owned={show(self.owned.value)} "
            f"acquiring={show(self._in('acquiring'))} "
            f"draining={show(self._in('draining', 'releasing'))} "
            f"idle={show(self._in('idle'))}{closing}: {self._starts} starts, "
            f"{self._stops} stops, {self._lost} lost>"
        )

    # ----------------------------------------------------------------- state changes

    def _publish(self) -> None:
        """Update :attr:`owned` and :attr:`partition_states` from the slots."""
        owned = self._in("running", "draining")
        if owned != self.owned.value:
            self.owned.value = owned
        states = {p: slot.state for p, slot in sorted(self._slots.items())}
        if states != self.partition_states.value:
            self.partition_states.value = MappingProxyType(states)
        if self._rebalancing_since is not None:
            self._end_rebalance_if_settled()

    def _end_rebalance_if_settled(self) -> None:
        """Count the rebalance under way as done once every assigned partition runs
        (or returned on its own) and nothing else is held or waited for."""
        assert self._rebalancing_since is not None
        assigned = self.assigned.value
        slots = self._slots
        if self._closing:
            self._rebalancing_since = None
            return
        if not assigned <= slots.keys():
            return
        for p, slot in slots.items():
            if slot.state not in ("running", "idle") or p not in assigned:
                return
        # What an operator reads of a rebalance, where it ended: said by the
        # supervisor, in the processor's log context rather than a partition's.
        self._settled = True
        self._rebalances += 1
        self._rebalance_seconds += trio.current_time() - self._rebalancing_since
        self._rebalancing_since = None

    def _changed(self) -> None:
        # Published once per scheduling round, however many partitions changed in it:
        # publishing looks at every partition, and a worker starting 512 of them
        # changes states thousands of times (once each, it blocked the event loop for
        # seconds, and leases ran out).
        if not self._publishing and self._nursery is not None:
            self._publishing = True
            self._nursery.start_soon(self._publish_soon, name="streamkit rebalancer publish")
        self._version.value += 1

    async def _publish_soon(self) -> None:
        self._publishing = False
        self._publish()

    def _begin_drain(self, slot: _Slot, reason: str, grace: float) -> None:
        """Ask ``slot``'s run() to return; cancel it if it has not after ``grace``."""
        assert self._nursery is not None
        slot.leaving = reason
        if slot.state != "running":
            return
        assert slot.claim is not None
        slot.state = "draining"
        log.debug(
            "draining partition %d (%s); run() has %ss to return",
            slot.partition,
            reason,
            grace,
            extra={"partition": slot.partition},
        )
        slot.claim.draining.value = True
        with log_context(partition=slot.partition):
            self._nursery.start_soon(self._enforce_grace, slot, reason, grace)
        self._changed()

    async def _enforce_grace(self, slot: _Slot, reason: str, grace: float) -> None:
        with trio.move_on_after(grace):
            await slot.done.wait()
        # Only while run() still runs: a lease being released is left to finish.
        if slot.state == "draining" and not slot.scope.cancel_called:
            self._cancelled += 1
            why = (
                f"partition {slot.partition} moved: {reason}; run() did not return within {grace}s"
            )
            log.warning("cancelling %s", why)
            slot.scope.cancel(why)

    def _abandon(self, slot: _Slot, reason: str) -> None:
        slot.leaving = reason
        log.debug(
            "partition %d %s before its lock was acquired; no longer waiting",
            slot.partition,
            reason,
            extra={"partition": slot.partition},
        )
        slot.scope.cancel(f"partition {slot.partition} {reason} before its lock was acquired")

    def _apply(self, plan: RebalancePlan, reason: str) -> None:
        """Carry out ``plan``; synchronous, so nothing changes half way."""
        assert self._nursery is not None
        if plan.release and reason == "unassigned":
            log.info("handing %s over to other members", partitions_text(plan.release))
        for p in plan.abandon:
            self._abandon(self._slots[p], reason)
        for p in plan.release:
            self._begin_drain(self._slots[p], reason, self.settings.grace)
        for p in plan.forget:
            del self._slots[p]
        for p in plan.claim:
            slot = self._slots[p] = _Slot(p)
            # The task starts with a copy of this context: the partition is in the log
            # context of everything it runs.
            with log_context(partition=p):
                self._nursery.start_soon(self._run_partition, slot, name=f"streamkit partition {p}")
        # The planner's own changes: published, but no reason to plan again.
        self._publish()

    async def _supervise(self) -> None:
        """Follow :attr:`assigned` and the partition tasks, applying each plan."""
        while not self._closing:
            seen = self.assigned.value
            version = self._version.value
            if seen != self._planned:
                self._planned = seen
                if self._rebalancing_since is None:
                    self._rebalancing_since = trio.current_time()
            plan = plan_rebalance(
                seen,
                running=self._in("running"),
                acquiring=self._in("acquiring"),
                # Ended but still releasing its lease: as good as draining.
                draining=self._in("draining", "releasing"),
                idle=self._in("idle"),
            )
            if plan:
                log.debug("assigned %s: %r", sorted(seen), plan)
                self._apply(plan, "unassigned")
            elif self._rebalancing_since is not None:
                self._end_rebalance_if_settled()
            if self._settled:
                self._settled = False
                log.info("owns %s", partitions_text(self._in("running")))
            # Level-triggered waits on values read before planning: no change missed.
            await trio_util.wait_any(
                lambda seen=seen: self.assigned.wait_value(lambda v: v != seen),
                lambda version=version: self._version.wait_value(lambda v: v != version),
            )

    # ----------------------------------------------------------------- one partition

    async def _run_partition(self, slot: _Slot) -> None:
        p = slot.partition
        delays = None
        try:
            with slot.scope:
                while slot.leaving is None:
                    if delays is not None:
                        await trio.sleep(next(delays))
                    if not await self._hold_and_run(slot):
                        break
                    # The lease was lost: back off, then take the partition again.
                    if delays is None:
                        delays = self.settings.acquire_backoff.delays()
                    slot.state = "acquiring"
                    self._changed()
        except _Fatal:
            pass
        finally:
            slot.done.set()
            if slot.state == "idle" and slot.leaving is None:
                pass  # kept, so the planner does not start it again
            elif self._slots.get(p) is slot:
                del self._slots[p]
            self._changed()

    async def _hold_and_run(self, slot: _Slot) -> bool:
        """Take the lease and run ``run()`` once; return True to run it again (the
        lease was lost, or Redis was unavailable).

        Error handling:
            A fatal error from ``run()`` is recorded, the whole rebalancer is
            cancelled, and :class:`_Fatal` raised to end the partition's task.
        """
        p = slot.partition
        name = self.lock_name(p)
        claim: Claim | None = None
        try:
            async with self.locks.hold(name, ttl=self.settings.lease_ttl, wait=None) as held:
                claim = Claim(p, held, previous_runs=self._runs.get(p, 0))
                self._runs[p] = claim.previous_runs + 1
                slot.claim = claim
                slot.state = "running"
                self._starts += 1
                log.debug("claimed partition %d (lock %r, token %d)", p, name, held.token)
                self._changed()
                try:
                    await self.run(claim)
                finally:
                    self._stops += 1
                    slot.state = "releasing"
                    self._changed()
        except trio.Cancelled:
            if claim is not None:
                log.debug("released partition %d (cancelled: %s)", p, slot.leaving or "closing")
            raise
        except Exception as exc:
            if claim is not None and claim.held.lost.value and isinstance(exc, StreamkitError):
                # LockLost from the hold, or a fenced write refused after the lease was
                # lost, say. (A LockLost about some other lock run() holds is fatal.)
                reason = exc.reason if isinstance(exc, LockLost) else f"{exc}"
                return self._lease_lost(slot, await self._why_lost(claim.held, reason))
            if claim is not None and isinstance(exc, LockLost) and exc.name == name:
                # This very lease, lost by run()'s own account before the hold noticed:
                # the events found its local deadline passed (a worker starved of CPU
                # during a failover). Lost too; the hold has released the lock since,
                # so it is not asked whether the lock vanished.
                return self._lease_lost(slot, exc.reason)
            if isinstance(exc, RedisUnavailable):
                # Redis restarting or failing over: not fatal. Start the partition
                # again (after a backoff) once Redis answers; what run() had not
                # acknowledged stays pending and is processed first.
                return self._unavailable(slot, exc)
            if isinstance(exc, NotReplicated):
                # A write ran, but too few replicas acknowledged it in time (a replica
                # lagging or gone, a failover under way: the relay's last round as the
                # partition is handed over, say). Not fatal either: what it carried is
                # retried by whoever runs the partition next.
                return self._stopped(
                    slot,
                    logging.WARNING,
                    "run() for partition %d stopped: %s; %s",
                    exc,
                    again="restarting it",
                    otherwise="it is being handed back",
                )
            self._fail(p, exc)
            raise _Fatal from None
        if slot.leaving is not None:
            log.debug("released partition %d (%s)", p, slot.leaving)
        elif self._closing or p not in self.assigned.value:
            # Returned on its own just as the partition was being unassigned.
            log.debug("released partition %d (run() returned; no longer assigned)", p)
        else:
            log.warning(
                "run() for partition %d returned while the partition is still assigned; "
                "the lock is released and it stays idle until it is assigned again",
                p,
            )
            slot.state = "idle"
        return False

    async def _why_lost(self, held: HeldLease, reason: str) -> str:
        """``reason``, or, if the lock is gone while the lease cannot have run out yet
        (a fenced read found it so), that it vanished: reported, said once."""
        if lost_to_vanishing(reason) or trio.current_time() >= held.lease.valid_until:
            return reason
        try:
            holder = await self.locks.holder(held.name)
        except StreamkitError:
            return reason
        # Taken by someone with a token no greater than ours: the fencing counter
        # (kept without a TTL) vanished too, so the lock did before it was taken. Still
        # ours: lost here only (the local deadline, a little before the TTL's end,
        # passed before an extension landed: a worker starved of CPU, or Redis out of
        # reach until then), nothing vanished.
        if holder is not None and holder.token > held.token:
            # Taken over (by another worker, or a reset: `streamkit reset --force`).
            return f"{reason}; it is now held by {holder.owner!r} (token {holder.token})"
        if holder is not None and holder.token == held.token and holder.owner == held.lease.owner:
            return reason
        reason = f"{VANISHED} ({reason})"
        health_of(self.locks.redis).vanished.report(held.name, "lease", detail=reason)
        return reason

    def _lease_lost(self, slot: _Slot, reason: str) -> bool:
        self._lost += 1
        # Lost to an outage: the client's outage log says so, once for all partitions;
        # lost to its lock vanishing: the worker's data loss watch says it, once.
        quiet = lost_to_outage(reason) or (
            lost_to_vanishing(reason) and health_of(self.locks.redis).vanished.watched
        )
        return self._stopped(
            slot,
            logging.DEBUG if quiet else logging.WARNING,
            "lease on partition %d lost (%s); %s",
            reason,
            again="re-acquiring it",
            otherwise="not re-acquiring, it is being handed back",
        )

    def _unavailable(self, slot: _Slot, exc: RedisUnavailable) -> bool:
        health_of(self.locks.redis).unavailable(exc, what=f"partition {slot.partition}")
        return self._stopped(
            slot,
            logging.DEBUG,
            "run() for partition %d stopped: %s; %s",
            exc,
            again="restarting it once Redis answers",
            otherwise="it is being handed back",
        )

    def _stopped(
        self, slot: _Slot, level: int, message: str, cause: object, *, again: str, otherwise: str
    ) -> bool:
        """Whether ``slot``'s run(), stopped by ``cause``, runs again: only while the
        partition stays ours and the rebalancer open. Logs ``message`` (partition,
        cause, then ``again`` or ``otherwise``) at ``level``."""
        runs_again = slot.leaving is None and not self._closing
        log.log(level, message, slot.partition, cause, again if runs_again else otherwise)
        return runs_again

    def _fail(self, partition: int, exc: BaseException) -> None:
        log.error("run() for partition %d failed: %r; stopping all partitions", partition, exc)
        if self._fatal is None:
            self._fatal = exc
        self._closing = True
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel(f"run() for partition {partition} failed: {exc!r}")

    # ----------------------------------------------------------------- shutdown

    async def drain(self, grace: float | None = None) -> None:
        """Stop every partition gracefully and stop claiming new ones.

        Sets ``draining`` on every running partition, stops waiting for locks at
        once, gives the ``run()`` calls up to ``grace`` seconds (the rebalancer's
        own grace by default) to return, cancels the rest (with a reason), and
        returns once every lease was released. The rebalancer stays stopped: leave
        its block afterwards.

        Cancellation:
            Safe to cancel; cancelling the rebalancer's block then cancels whatever
            still runs (leases are still released).
        """
        grace = self.settings.grace if grace is None else grace
        non_negative_number.check("grace", grace)
        self._closing = True
        owned = self.owned.value
        # Also those waiting to take their lock again after Redis failed their run()
        # (their release failed as well, during an outage).
        handled = set(self._slots)
        log.debug("draining all partitions (%r, grace %ss)", self, grace)
        for slot in list(self._slots.values()):
            if slot.state == "acquiring":
                self._abandon(slot, "drained")
            elif slot.state == "running":
                self._begin_drain(slot, "drained", grace)
            elif slot.state == "releasing":
                slot.leaving = "drained"
            elif slot.state == "idle":
                del self._slots[slot.partition]
        self._changed()
        with trio.move_on_after(grace):
            await self._wait_empty()
        for slot in list(self._slots.values()):
            if slot.state == "draining" and not slot.scope.cancel_called:
                self._cancelled += 1
                slot.scope.cancel(
                    f"partition {slot.partition} drained: run() did not return within {grace}s"
                )
        await self._wait_empty()
        # Published now, not in a scheduling round: drained means owned is empty.
        self._publish()
        log.debug("drained: %r", self)
        outage = health_of(self.locks.redis).outage
        if handled and outage.down:
            # The releases and the last acknowledgements failed with Redis (said at
            # debug level, one by one): say what that means, once.
            log.warning(
                "stopping while %s is unreachable: %s not released; the leases run out "
                "by themselves and the events not acknowledged are processed again by "
                "the next owner",
                outage.subject,
                partitions_text(handled),
            )
        elif owned:
            log.info("released %s", partitions_text(owned))

    async def _wait_empty(self) -> None:
        await self._version.wait_value(lambda _: not self._slots)


@asynccontextmanager
async def open_rebalancer(
    assigned: trio_util.AsyncValue[frozenset[int]],
    locks: LockManager,
    *,
    lock_name: Callable[[int], str],
    run: Callable[[Claim], Awaitable[None]],
    lease_ttl: float = DEFAULT_LEASE_TTL,
    grace: float = DEFAULT_GRACE,
    acquire_backoff: Backoff = DEFAULT_ACQUIRE_BACKOFF,
) -> AsyncIterator[Rebalancer]:
    """Run ``run(claim)`` for every partition in ``assigned``, while the block runs.

    Each assigned partition gets a task in the rebalancer's nursery, which holds the
    partition's lease (``locks.hold(lock_name(p), ttl=lease_ttl, wait=None)``,
    waiting while a previous owner drains) and calls ``run(claim)`` inside a cancel
    scope of its own. The rebalancer follows ``assigned``:

    * a partition that is no longer assigned *drains*: ``claim.draining`` turns
      true, ``run()`` has ``grace`` seconds to return, then its scope is cancelled
      with a reason (``"partition 3 moved: unassigned; ..."``); the lease is
      released as the hold exits. A partition unassigned while still waiting for
      its lock simply stops waiting.
    * partitions that stay assigned keep running, untouched.
    * a lost lease (expired while the process was paused, taken over) cancels
      ``run()``; if the partition is still assigned it is re-acquired after
      ``acquire_backoff`` and ``run()`` starts again with a new claim.
    * ``run()`` returning on its own while the partition is assigned is logged; it
      is not restarted until the partition is unassigned and assigned again.

    Leaving the block normally drains (as :meth:`Rebalancer.drain`); leaving it by
    an exception or cancellation cancels all partitions at once.

    Example::

        async with (
            open_membership(redis, "shards", partitions=8) as member,
            open_lock_manager(redis) as locks,
            open_rebalancer(
                member.partitions, locks, lock_name=lambda p: f"shards.{p}", run=work
            ) as rebalancer,
        ):
            await trio.sleep_forever()

    Args:
        assigned: the partitions to own, e.g. :attr:`Membership.partitions`.
        locks: the lock manager holding the partition leases.
        lock_name: the lock name of a partition.
        run: the work of one partition; see :class:`~streamkit.lowlevel.Claim`.
        lease_ttl: see :class:`~streamkit.lowlevel.RebalancerSettings`.
        grace: see :class:`~streamkit.lowlevel.RebalancerSettings`.
        acquire_backoff: see :class:`~streamkit.lowlevel.RebalancerSettings`.

    Cancellation:
        Cancelling the block cancels every ``run()``; leases are still released
        (shielded, time-limited, by the lock manager).

    Error handling:
        :class:`ConfigError` for invalid settings. :class:`RedisUnavailable` from
        ``run()`` restarts the partition (after ``acquire_backoff``, re-taking its
        lease) like a lost lease. Any other exception raised by ``run()``
        (other than a lost lease) is fatal: all other partitions are cancelled,
        their leases released, and the exception propagates from the block as
        itself, never wrapped in an exception group. An exception of the block
        itself takes precedence.
    """
    settings = RebalancerSettings(lease_ttl=lease_ttl, grace=grace, acquire_backoff=acquire_backoff)
    rebalancer = Rebalancer(assigned, locks, lock_name, run, settings)
    try:
        # An outage's summaries say how many partitions wait for Redis.
        with health_of(locks.redis).outage.waiting(rebalancer._waiting):
            async with open_service_nursery(reason="rebalancer closing") as nursery:
                rebalancer._nursery = nursery
                nursery.start_soon(rebalancer._supervise, name="streamkit rebalancer")
                yield rebalancer
                await rebalancer.drain()
    except trio.Cancelled:
        # Cancelled from outside just as run() failed: the failure is the news.
        if rebalancer._fatal is None:
            raise
    finally:
        rebalancer._closing = True
        rebalancer.owned.value = frozenset()
        rebalancer.partition_states.value = MappingProxyType({})
    if rebalancer._fatal is not None:
        # run() failed: the nursery was cancelled and the block with it.
        raise rebalancer._fatal
