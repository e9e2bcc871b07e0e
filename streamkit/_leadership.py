"""Leader election: at most one leader per name, on top of the lock manager.

Every contender campaigns for the lock ``name`` in the background. The one holding
it is the leader, keeps its lease alive with :meth:`LockManager.hold`, and stays
leader until the lease is lost or it leaves. Everyone else polls until the lock is
free; a deposed leader simply campaigns again.

Work that only the leader may do runs under :meth:`LeaderElection.run_while_leader`,
which starts it on each election and cancels it the moment leadership is lost.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
import trio
import trio_util

from ._backoff import Backoff
from ._errors import BackendError, LockLost, LockNotAcquired, RedisUnavailable
from ._nurseries import open_service_nursery
from ._redis import health_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from ._locks import HeldLease, Lease, LockInfo, LockManager

__all__ = ["LeaderElection", "open_leader_election"]

log = logging.getLogger("streamkit.leadership")

#: The default leader lease TTL: how long followers wait for a leader that died.
DEFAULT_LEADER_TTL = 10.0

# Retry schedule when a campaign fails for a reason other than a held lock (Redis
# unreachable while releasing, say); acquiring retries by itself while waiting.
_CAMPAIGN_BACKOFF = Backoff(initial=0.05, maximum=2.0)


def _new_term_after(previous: HeldLease | None) -> Callable[[HeldLease | None], bool]:
    def is_new_term(held: HeldLease | None) -> bool:
        return held is not None and held is not previous and held.lost_reason is None

    return is_new_term


@attrs.define(eq=False, repr=False)
class LeaderElection:
    """One contender in the election for ``name``; get it from :func:`open_leader_election`.

    Attributes:
        name: the name of the lock contended for.
        ttl: the leader lease's TTL in seconds.
        is_leader: a ``trio_util.AsyncBool``, true while this contender leads.
            Watch it with ``await election.is_leader.wait_value(True)`` or
            ``async for leading in election.is_leader.eventual_values(): ...``.
        leader_lease: a ``trio_util.AsyncValue`` of this contender's leader lease
            while it leads (a new value with each extension), ``None`` while it
            follows.
        terms: how many times this contender has been elected.
    """

    _locks: LockManager
    name: str
    ttl: float
    is_leader: trio_util.AsyncBool = attrs.field(init=False, factory=trio_util.AsyncBool)
    leader_lease: trio_util.AsyncValue[Lease | None] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(None)
    )
    terms: int = attrs.field(init=False, default=0)
    # The held lease of the current term, or None between terms.
    _term: trio_util.AsyncValue[HeldLease | None] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(None)
    )
    _term_scopes: set[trio.CancelScope] = attrs.field(init=False, factory=set)

    @property
    def lease(self) -> Lease | None:
        """The leader lease while leading (for its fencing token), else ``None``."""
        held: HeldLease | None = self._term.value
        return None if held is None or held.lost_reason is not None else held.lease

    async def wait_leader(self) -> Lease:
        """Wait until this contender leads; return its lease.

        Cancellation:
            Safe to cancel.
        """
        held: HeldLease = await self._term.wait_value(
            lambda h: h is not None and h.lost_reason is None
        )
        return held.lease

    async def leader(self) -> LockInfo | None:
        """Return who leads now (any contender), or ``None`` between leaders.

        Error handling:
            :class:`RedisUnavailable` if Redis cannot be reached.
        """
        return await self._locks.holder(self.name)

    async def run_while_leader(self, fn: Callable[..., Awaitable[object]], *args: Any) -> NoReturn:
        """Run ``await fn(*args)`` during each term of leadership, forever.

        ``fn`` starts when this contender is elected and is cancelled (with the
        reason as the cancel scope's reason) the moment the lease is lost or the
        election is left. It starts again at the next election. If it returns by
        itself, it is not restarted until the next term. Run it inside the
        ``open_leader_election`` block, for example with
        ``nursery.start_soon(election.run_while_leader, fn)``.

        Cancellation:
            Cancelling it cancels ``fn``.

        Error handling:
            An exception from ``fn`` propagates, ending the loop.
        """
        previous: HeldLease | None = None
        while True:
            held: HeldLease = await self._term.wait_value(_new_term_after(previous))
            previous = held
            with trio.CancelScope() as scope:
                # Cancelled in the very step that notices the loss, not when the
                # campaign task next runs.
                held.cancel_on_loss(scope)
                self._term_scopes.add(scope)
                try:
                    log.debug("term %d of %r: starting %r", held.token, self.name, fn)
                    await fn(*args)
                finally:
                    self._term_scopes.discard(scope)
            if scope.cancelled_caught:
                log.info("leadership of %r ended; %r was cancelled", self.name, fn)
            else:
                log.info("%r returned; waiting for the next term of %r", fn, self.name)

    def _elected(self, held: HeldLease) -> None:
        self.terms += 1
        self._term.value = held
        self.leader_lease.value = held.lease
        self.is_leader.value = True
        log.info("%s leads %r (token %d)", self._locks.owner, self.name, held.token)

    def _deposed(self, held: HeldLease) -> None:
        if self._term.value is held:
            self._term.value = None
            self.is_leader.value = False
            self.leader_lease.value = None
        reason = held.lost_reason or "the election was left"
        for scope in self._term_scopes:
            scope.cancel(f"leadership of {self.name!r} ended: {reason}")
        log.info("%s no longer leads %r: %s", self._locks.owner, self.name, reason)

    async def _campaign(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        # The first attempt is a single try, so that setup errors (Redis unreachable)
        # surface from open_leader_election and ``is_leader`` is settled when it
        # returns; after that, wait for the lock as long as it takes.
        wait: float | None = 0
        started = False
        delays = _CAMPAIGN_BACKOFF.delays()
        while True:
            try:
                async with self._locks.hold(self.name, ttl=self.ttl, wait=wait) as held:
                    self._elected(held)
                    if not started:
                        started = True
                        task_status.started()
                    try:
                        # Publish each extension, until the hold is left.
                        async for lease in held.current.eventual_values():
                            self.leader_lease.value = lease
                    finally:
                        self._deposed(held)
            except LockNotAcquired:
                pass
            except LockLost as exc:
                log.warning("lost leadership of %r: %s; campaigning again", self.name, exc.reason)
            except (RedisUnavailable, BackendError) as exc:
                # Outages and failovers (a READONLY replica, say) pass; a leader
                # deposed by them campaigns again once Redis is back.
                if not started:
                    raise
                delay = next(delays)
                if isinstance(exc, RedisUnavailable):
                    # Said once for the whole process by the client's outage log.
                    health_of(self._locks.redis).unavailable(
                        exc, what=f"campaign for {self.name!r}"
                    )
                    log.debug("campaign for %r: %s (retrying in %.2fs)", self.name, exc, delay)
                else:
                    log.warning("campaign for %r: %s (retrying in %.2fs)", self.name, exc, delay)
                await trio.sleep(delay)
            if not started:
                started = True
                task_status.started()
            wait = None

    def __repr__(self) -> str:
        state = f"leader (token {self.lease.token})" if self.lease else "follower"
        return (
            f"<LeaderElection {self.name!r} owner={self._locks.owner!r} {state}, "
            f"{self.terms} term(s)>"
        )


@asynccontextmanager
async def open_leader_election(
    locks: LockManager, name: str, *, ttl: float = DEFAULT_LEADER_TTL
) -> AsyncIterator[LeaderElection]:
    """Campaign for leadership of ``name`` while the block runs.

    One attempt is made before the block starts, so ``election.is_leader`` is
    already true if the lock was free. Leaving the block steps down: leader work is
    cancelled and the lease released, so another contender takes over at its next
    poll instead of after the TTL.

    Example::

        async with open_lock_manager(redis) as locks, open_leader_election(
            locks, "scheduler", ttl=5
        ) as election:
            await election.run_while_leader(schedule_jobs)

    Args:
        locks: the lock manager to hold the leader lease with.
        name: the election's name (the lock's name).
        ttl: the leader lease's TTL: a leader that dies is replaced after at most
            about this long.

    Error handling:
        :class:`RedisUnavailable` if Redis is unreachable at the first attempt;
        later outages are ridden out (a leader that cannot reach Redis for ``ttl``
        steps down). An exception raised by the block propagates as itself.
    """
    election = LeaderElection(locks, name, ttl)
    async with open_service_nursery(reason=f"leaving the election for {name!r}") as nursery:
        await nursery.start(election._campaign)
        yield election
