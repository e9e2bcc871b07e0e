"""Leases on named locks in Redis: TTLs, fencing tokens, and ``hold()``.

A lock is one Redis key. Whoever holds it has a :class:`Lease`: the lock's name, the
holder's owner id, a *fencing token* and a TTL. The token comes from a counter that
only ever grows (it has no TTL, so it survives the lock's expiry), which lets anything
the holder writes to check that no newer holder exists: a Lua script compares the
lock's stored value with :attr:`Lease.value` in the same step as its write.

Key layout (the stream runtime depends on it, so it is part of the API)::

    __lock:{name}          "<owner>:<token>", with a TTL     (the lock)
    __lock:{name}:fence    the fencing counter, no TTL

The name is wrapped in a Redis Cluster hash tag (``{name}``) unless it already has
one, so a lock can share a hash slot with the keys it guards (a partition's stream,
say) and one Lua script can check the lock and write those keys together.

Every mutation is a Lua script, so it is atomic: acquire sets the key only if it is
absent and takes the next token; extend and release act only if the key still holds
*our* value. Nobody ever deletes or extends someone else's lease.

Why one room (about 800 lines): acquire, extend, release and ``hold()`` are one lease
protocol over four scripts and one owner id; the pure time logic (local deadlines)
and the key layout (:mod:`streamkit._keys`) are apart already.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio
import trio_util

from ._backoff import Backoff
from ._errors import (
    LockLost,
    LockNotAcquired,
    NotLockOwner,
    RedisUnavailable,
    StreamkitError,
)
from ._keys import FENCE_KEY_SUFFIX, fence_key, lock_key, tagged
from ._locks_renewal import Renewals
from ._lua import script
from ._nurseries import open_service_nursery
from ._periodic import next_tick
from ._redis import LuaScript, Redis, health_of, redis_errors
from ._validate import non_negative_number, valid_ttl
from ._vanished import VANISHED, lost_to_vanishing

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = [
    "HeldLease",
    "Lease",
    "LockInfo",
    "LockManager",
    "LockManagerStatistics",
    "fence_key",
    "keep_lease_alive",
    "local_deadline",
    "lock_key",
    "lost_to_outage",
    "open_lock_manager",
    "tagged",
    "valid_ttl",
]

log = logging.getLogger("streamkit.locks")


#: ``hold()`` extends a lease this many times per TTL, so two renewals can fail
#: before the lease is in danger.
RENEWALS_PER_TTL = 3

#: The local deadline of a lease ends this much before its TTL runs out, to allow
#: for the Redis server's clock running faster than ours (Redlock's allowance:
#: 1% of the TTL plus 2 ms).
CLOCK_DRIFT_FACTOR = 0.01
CLOCK_DRIFT_MINIMUM = 0.002

#: How long releasing a lease may take while leaving ``hold()``, at least (it may take
#: until the lease would expire anyway); after that the lease is left to expire.
RELEASE_TIMEOUT = 1.0


# How long acquire() may wait: seconds, or None for as long as it takes.
_valid_wait = non_negative_number.or_none()

#: Polling schedule while waiting for a lock someone else holds.
DEFAULT_POLL_BACKOFF = Backoff(initial=0.02, maximum=0.5)

# The scripts (see their files for what each takes and answers).
_ACQUIRE = LuaScript(script("locks/acquire"))
_EXTEND = LuaScript(script("locks/extend"))
_RELEASE = LuaScript(script("locks/release"))
_INSPECT = LuaScript(script("locks/inspect"))


# --- key layout: in streamkit._keys, re-exported for the lock's users --------------


# --- pure time logic ------------------------------------------------------------------


def local_deadline(lease: Lease) -> float:
    """The Trio-clock time after which ``lease`` must be treated as lost.

    :attr:`Lease.valid_until` is measured from when the acquire or extend command was
    *sent*, so Redis can only have started the TTL later; the clock drift allowance
    covers a server clock that runs fast.
    """
    drift = lease.ttl * CLOCK_DRIFT_FACTOR + CLOCK_DRIFT_MINIMUM
    return lease.valid_until - drift


# --- value objects -------------------------------------------------------------------


def _ttl_ms(ttl: float) -> int:
    valid_ttl.check("ttl", ttl)
    return max(1, round(ttl * 1000))


def _parse_value(value: bytes) -> tuple[str, int]:
    owner, _, token = value.decode("utf-8", "replace").rpartition(":")
    try:
        return owner, int(token)
    except ValueError:
        return value.decode("utf-8", "replace"), 0


#: What a refusal says when the lock is gone (expired or deleted).
_NO_HOLDER = "the lock expired or was deleted"


def _describe_holder(value: bytes | None) -> str:
    if value is None:
        return _NO_HOLDER
    owner, token = _parse_value(value)
    return f"the lock is now held by {owner!r} (token {token})"


@attrs.frozen
class Lease:
    """Proof of holding lock :attr:`name` until :attr:`valid_until`.

    Leases are values: :meth:`LockManager.extend` returns a new one with a later
    :attr:`valid_until`; the token stays the same.

    Attributes:
        name: the lock's name.
        key: the Redis key of the lock.
        owner: the owner id of the :class:`LockManager` that acquired it.
        token: the fencing token; strictly greater than every earlier token of
            this lock, across expiries and owners.
        ttl: the lease's time to live in seconds.
        valid_until: Trio-clock time when the lease runs out, measured from when
            the last acquire or extend command was sent (so it errs early).
    """

    name: str
    key: str
    owner: str
    token: int
    ttl: float
    valid_until: float = attrs.field(repr=False)

    @property
    def value(self) -> bytes:
        """The value stored at :attr:`key` while this lease holds.

        A write guarded by the lease is a script that compares the value of the lock's
        key with it before it writes (as the fenced read and commit, ``commit/read``
        and ``commit/ack`` of :mod:`streamkit._lua`, do).
        """
        return f"{self.owner}:{self.token}".encode()

    @property
    def fence_key(self) -> str:
        """The key of the lock's fencing counter."""
        return self.key + FENCE_KEY_SUFFIX

    def remaining(self) -> float:
        """Seconds until :attr:`valid_until` (negative once it has passed)."""
        return self.valid_until - trio.current_time()


@attrs.frozen
class LockInfo:
    """Who holds a lock right now, as :meth:`LockManager.holder` found it.

    Attributes:
        name: the lock's name.
        owner: the holder's owner id.
        token: the holder's fencing token.
        expires_in: seconds until the lock expires unless extended (``None`` if the
            key has no TTL, which streamkit never does).
    """

    name: str
    owner: str
    token: int
    expires_in: float | None


@attrs.frozen
class LockManagerStatistics:
    """A snapshot of a :class:`LockManager`'s activity.

    Attributes:
        owner: the manager's owner id.
        holding: names of the locks held through :meth:`LockManager.hold` now.
        acquired: leases acquired so far.
        extended: successful extensions so far.
        released: leases released so far.
        lost: held leases lost so far (expired, taken over or unreachable).
    """

    owner: str
    holding: tuple[str, ...]
    acquired: int
    extended: int
    released: int
    lost: int


@attrs.define(eq=False, repr=False)
class HeldLease:
    """A lease that :meth:`LockManager.hold` keeps alive in the background.

    Attributes:
        lease: the current lease; replaced after each extension (same token).
        current: a ``trio_util.AsyncValue`` of :attr:`lease`: it changes with every
            extension (``await held.current.wait_transition()`` waits for the next).
        lost: a ``trio_util.AsyncBool`` that turns true, once, the moment the lease
            is lost.
        lost_reason: why it was lost, or ``None`` while it holds.
        extensions: how many times the lease was extended.
    """

    lease: Lease
    current: trio_util.AsyncValue[Lease] = attrs.field(
        init=False,
        default=attrs.Factory(lambda self: trio_util.AsyncValue(self.lease), takes_self=True),
    )
    lost: trio_util.AsyncBool = attrs.field(init=False, factory=trio_util.AsyncBool)
    lost_reason: str | None = attrs.field(init=False, default=None)
    extensions: int = attrs.field(init=False, default=0)
    _scopes: list[trio.CancelScope] = attrs.field(init=False, factory=list)

    @property
    def name(self) -> str:
        """The lock's name."""
        return self.lease.name

    @property
    def token(self) -> int:
        """The fencing token of the lease."""
        return self.lease.token

    async def wait_lost(self) -> str:
        """Wait until the lease is lost; return the reason.

        Cancellation:
            Safe to cancel; nothing changes.
        """
        await self.lost.wait_value(True)
        assert self.lost_reason is not None
        return self.lost_reason

    def cancel_on_loss(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` (with the loss as reason) when the lease is lost.

        ``hold()`` does this for its body; use it to tie work in *other* tasks to the
        lease. A scope registered after the loss is cancelled at once.
        """
        if self.lost_reason is not None:
            scope.cancel(self._cancel_reason())
        else:
            self._scopes.append(scope)

    def _cancel_reason(self) -> str:
        return f"lease on {self.name!r} lost: {self.lost_reason}"

    def _extended(self, lease: Lease) -> None:
        # Counted and replaced before it is published: waiters see all three agree.
        self.extensions += 1
        self.lease = lease
        self.current.value = lease

    def _lose(self, reason: str) -> None:
        if self.lost_reason is not None:
            return
        self.lost_reason = reason
        self.lost.value = True
        # Cancel synchronously, in the same step that notices the loss: the holder
        # must stop as early as possible, not one scheduling round later.
        for scope in self._scopes:
            scope.cancel(self._cancel_reason())
        self._scopes.clear()

    def __repr__(self) -> str:
        state = f"lost: {self.lost_reason}" if self.lost_reason else "held"
        try:
            left = f", {self.lease.remaining():.3f}s left"
        except RuntimeError:  # outside of trio.run, say in a post-mortem debugger
            left = ""
        return (
            f"<HeldLease {self.name!r} token={self.token} {state}, "
            f"extended {self.extensions}x{left}>"
        )


# --- keeping a lease alive -----------------------------------------------------------


#: How the reason of a lease lost to an outage begins (see :func:`lost_to_outage`).
_UNREACHABLE = "Redis unreachable for the rest of the lease's TTL"


def lost_to_outage(reason: str) -> bool:
    """Whether a lease was lost for the reason ``reason`` because Redis could not be
    reached (rather than refused or taken over): the outage, said once elsewhere."""
    return reason.startswith(_UNREACHABLE)


async def _extend_before(
    lease: Lease,
    extend: Callable[[Lease], Awaitable[Lease]],
    *,
    deadline: float,
    attempt_timeout: float,
    backoff: Backoff,
    on_failure: Callable[[RedisUnavailable], object] | None = None,
) -> Lease | str:
    """Extend ``lease``, retrying while Redis is unreachable, until ``deadline``.

    Returns the new lease, or the reason the lease is lost.
    """
    delays = backoff.delays()
    failures = 0
    with trio.move_on_at(deadline):
        while True:
            # A hung connection (a frozen server, a black-holed route) must not use up
            # the whole TTL on one attempt: give up on it and try again.
            with trio.move_on_after(attempt_timeout) as attempt:
                try:
                    return await extend(lease)
                except NotLockOwner as exc:
                    detail = "; ".join(getattr(exc, "__notes__", ()))
                    if detail == _NO_HOLDER and trio.current_time() < lease.valid_until:
                        # Redis started the TTL after we sent the last extension, so
                        # the lock cannot have expired yet: it was deleted, or lost.
                        return f"{VANISHED}: extension refused: {detail}"
                    if exc.holder_token is not None and exc.holder_token < lease.token:
                        # Tokens only grow: a holder with a smaller one took the lock
                        # after its fencing counter vanished (Redis lost its data).
                        return f"{VANISHED}: extension refused: {detail}"
                    return "extension refused" + (f": {detail}" if detail else "")
                except RedisUnavailable as exc:
                    failure = exc
            if attempt.cancelled_caught:
                failure = RedisUnavailable(None, f"no answer within {attempt_timeout:.3f}s")
            failures += 1
            if on_failure is not None:
                # Told to whoever reports outages: one line for all leases.
                on_failure(failure)
            log.log(
                logging.DEBUG if on_failure is not None else logging.WARNING,
                "extending lease on %r failed: %s (%.3fs before it runs out)",
                lease.name,
                failure.reason,
                deadline - trio.current_time(),
            )
            await trio.sleep(next(delays))
    if failures == 0:
        return "the lease ran out before it could be extended"
    return f"{_UNREACHABLE} ({failures} failed extension attempt(s))"


async def keep_lease_alive(
    lease: Lease,
    extend: Callable[[Lease], Awaitable[Lease]],
    *,
    on_extended: Callable[[Lease], object] | None = None,
    backoff: Backoff | None = None,
    on_failure: Callable[[RedisUnavailable], object] | None = None,
    aligned: bool = False,
) -> str:
    """Extend ``lease`` every ``ttl / 3`` until it is lost; return why it was lost.

    This is the schedule behind :meth:`LockManager.hold`, separate from Redis so its
    timing can be tested on a mock clock. Renewals run at ``start + k * ttl / 3``
    where ``start`` is when the lease was acquired. A failed extension
    (:class:`RedisUnavailable`, or no answer within ``ttl / 3``) is retried with
    ``backoff`` until the lease's :func:`local_deadline`; a refused one
    (:class:`NotLockOwner`) ends the lease at once.

    Args:
        lease: the lease to keep alive.
        extend: extends a lease, returning the new one; raises
            :class:`NotLockOwner` when refused.
        on_extended: called with each new lease.
        backoff: the retry schedule for failed extensions; by default a few
            attempts per renewal period.
        on_failure: called with each failed extension's error (no answer within
            the attempt's time is a :class:`RedisUnavailable` too); without it,
            each failure is logged as a warning, with it at debug level.
        aligned: renew on the grid ``k * ttl / 3`` of the Trio clock instead of
            from the acquisition (the first renewal comes sooner): the leases of one
            TTL then fall due together, and their extensions can go as one call.

    Cancellation:
        Cancel it to stop extending; the lease is then left as it is.
    """
    period = lease.ttl / RENEWALS_PER_TTL
    start = lease.valid_until - lease.ttl
    if aligned:
        start = math.floor(start / period) * period
    if backoff is None:
        backoff = Backoff(initial=period / 8, maximum=period / 2)
    while True:
        await trio.sleep_until(next_tick(start, period, trio.current_time()))
        outcome = await _extend_before(
            lease,
            extend,
            deadline=local_deadline(lease),
            attempt_timeout=period,
            backoff=backoff,
            on_failure=on_failure,
        )
        if isinstance(outcome, str):
            return outcome
        lease = outcome
        if on_extended is not None:
            on_extended(lease)


# --- the manager ---------------------------------------------------------------------


def _default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@attrs.define(eq=False, repr=False)
class LockManager:
    """Acquires, extends, releases and holds leases on named locks.

    Get one from :func:`open_lock_manager`. Each manager has its own owner id, and
    two managers never share a lease, even in one process; neither do two tasks
    using one manager (locks are not reentrant).

    Attributes:
        redis: the client the manager uses.
        owner: the owner id written into every lease this manager takes.
        backoff: the polling schedule used while waiting for a held lock.
    """

    redis: Redis
    owner: str
    backoff: Backoff = DEFAULT_POLL_BACKOFF
    _where: str = attrs.field(default="redis")
    _holding: list[HeldLease] = attrs.field(init=False, factory=list)
    _acquired: int = attrs.field(init=False, default=0)
    _extended: int = attrs.field(init=False, default=0)
    _released: int = attrs.field(init=False, default=0)
    _lost: int = attrs.field(init=False, default=0)
    # When the last command Redis answered was sent (Trio clock): what the manager
    # last heard from it.
    _heard_at: float = attrs.field(init=False, default=-math.inf)
    # The holds' renewals due together, sent as one call (see _locks_renewal).
    _renewals: Renewals[Lease] = attrs.field(init=False)

    @_renewals.default
    def _make_renewals(self) -> Renewals[Lease]:
        return Renewals(self.redis, self._run, self._answer)

    async def _run(
        self, script: LuaScript, keys: list[str], args: list[str | int | bytes]
    ) -> list[Any]:
        sent = trio.current_time()
        with redis_errors(self._where):
            # EVALSHA, loading the script on NOSCRIPT (a new or restarted server).
            result = cast("list[Any]", await script(self.redis, keys, args))
        self._heard_at = max(self._heard_at, sent)
        return result

    async def _load_scripts(self) -> None:
        sent = trio.current_time()
        with redis_errors(self._where):
            for script in (_ACQUIRE, _EXTEND, _RELEASE, _INSPECT):
                await script.load(self.redis)
        self._heard_at = sent

    # -- single operations --

    async def try_acquire(self, name: str, *, ttl: float) -> Lease | None:
        """Try once to acquire lock ``name``; return the lease, or ``None`` if held.

        Cancellation:
            If cancelled after the command was sent, the lock may have been taken in
            Redis without anyone knowing; it then expires after ``ttl``.

        Error handling:
            :class:`RedisUnavailable` if Redis cannot be reached;
            :class:`ConfigError` for a bad ``ttl``.
        """
        outcome = await self._attempt(name, ttl)
        return outcome if isinstance(outcome, Lease) else None

    async def _attempt(self, name: str, ttl: float) -> Lease | float:
        """One acquire attempt: the lease, or seconds until the holder's lease runs out."""
        ttl_ms = _ttl_ms(ttl)
        key = lock_key(name)
        sent_at = trio.current_time()
        result = await self._run(_ACQUIRE, [key, key + FENCE_KEY_SUFFIX], [self.owner, ttl_ms])
        if int(result[0]) == 1:
            self._acquired += 1
            lease = Lease(name, key, self.owner, int(result[1]), ttl, sent_at + ttl)
            log.debug("acquired %r", lease)
            return lease
        pttl = int(result[1])
        return pttl / 1000 if pttl >= 0 else math.inf

    async def acquire(self, name: str, *, ttl: float, wait: float | None = 0) -> Lease:
        """Acquire lock ``name`` for ``ttl`` seconds.

        Args:
            name: the lock's name (see :func:`lock_key` for its Redis key).
            ttl: the lease's time to live in seconds.
            wait: ``0`` tries once; a number polls (with :attr:`backoff`, never
                sleeping past the holder's expiry) for up to that many seconds;
                ``None`` waits for as long as it takes. While waiting, an attempt
                is sent only if the manager heard from Redis within the last
                ``ttl``; after a longer silence it asks who holds the lock (taking
                nothing) until Redis answers, so attempts whose replies are lost (a
                link cut one way) cannot keep re-taking the lock.

        Cancellation:
            Safe to cancel while waiting. If cancelled after an attempt was sent,
            the lock may have been taken in Redis without anyone knowing; it then
            expires after ``ttl``.

        Error handling:
            :class:`LockNotAcquired` if the lock stayed held for ``wait`` seconds.
            While waiting, an unreachable Redis is retried; with ``wait=0``, or if it
            was unreachable throughout the wait, :class:`RedisUnavailable` is raised.
        """
        _ttl_ms(ttl)
        if wait == 0:
            outcome = await self._attempt(name, ttl)
            if isinstance(outcome, Lease):
                return outcome
            raise LockNotAcquired(name)
        _valid_wait.check("wait", wait)

        unavailable: RedisUnavailable | None = None
        answered = False
        health = health_of(self.redis)
        delays = self.backoff.delays()
        with trio.move_on_after(math.inf if wait is None else wait):
            while True:
                # An answer arriving after a full TTL would be a lease that has
                # already run out, so a longer attempt is treated as a failure.
                retry_in = math.inf
                sent = trio.current_time()
                with trio.move_on_after(ttl):
                    try:
                        if sent - self._heard_at >= ttl:
                            # Heard nothing for a lease period: requests may reach
                            # Redis while replies do not (a one-way partition), and
                            # an attempt nobody hears about takes the lock for a TTL,
                            # again and again, keeping it from the others for good.
                            # Ask without taking until Redis answers; then try.
                            await self.holder(name)
                            outcome = 0.0
                        else:
                            outcome = await self._attempt(name, ttl)
                    except RedisUnavailable as exc:
                        unavailable = exc
                        # Said once for every lease (and partition) of the process.
                        health.unavailable(exc, what=f"acquiring {name!r}")
                    else:
                        health.outage.answered(sent)
                        answered = True
                        if isinstance(outcome, Lease):
                            return outcome
                        retry_in = outcome
                await trio.sleep(min(next(delays), retry_in))
        if unavailable is not None and not answered:
            raise unavailable
        raise LockNotAcquired(name)

    async def extend(self, lease: Lease, *, ttl: float | None = None) -> Lease:
        """Extend ``lease`` to ``ttl`` seconds from now (its own TTL by default).

        Returns the extended lease; ``lease`` itself is unchanged (leases are
        values).

        Cancellation:
            If cancelled after the command was sent, the extension may or may not
            have happened; the returned-lease bookkeeping is simply skipped.

        Error handling:
            :class:`NotLockOwner` if the lock no longer holds this lease's value
            (it expired, or someone else holds it now; a note on the exception says
            which); the key is then left untouched. :class:`RedisUnavailable` if
            Redis cannot be reached.
        """
        ttl = lease.ttl if ttl is None else ttl
        ttl_ms = _ttl_ms(ttl)
        sent_at = trio.current_time()
        result = await self._run(_EXTEND, [lease.key], [lease.value, ttl_ms])
        return self._answer(attrs.evolve(lease, ttl=ttl), result, sent_at)

    def _answer(self, lease: Lease, result: Any, sent_at: float) -> Lease:
        """``lease`` extended by its TTL from ``sent_at``, from the extension's reply
        (``locks/extend``'s, or one of ``locks/extend_many``'s); or raise
        :class:`NotLockOwner` (with a note saying who holds the lock now)."""
        if result != 1 and int(result[0]) != 1:
            holder = None if result[1] is None else _parse_value(result[1])[1]
            exc = NotLockOwner(lease.name, holder_token=holder)
            exc.add_note(_describe_holder(result[1]))
            raise exc
        self._extended += 1
        return attrs.evolve(lease, valid_until=sent_at + lease.ttl)

    async def release(self, lease: Lease) -> None:
        """Release ``lease``, so that others can acquire the lock at once.

        Cancellation:
            If cancelled after the command was sent, the lock may or may not have
            been released; if not, it expires after its TTL.

        Error handling:
            :class:`NotLockOwner` if the lock no longer holds this lease's value; the
            key is then left untouched (so a late release never frees a lock that
            changed hands). :class:`RedisUnavailable` if Redis cannot be reached.
        """
        result = await self._run(_RELEASE, [lease.key], [lease.value])
        if int(result[0]) != 1:
            exc = NotLockOwner(lease.name)
            exc.add_note(_describe_holder(result[1]))
            raise exc
        self._released += 1
        log.debug("released %r", lease)

    async def holder(self, name: str) -> LockInfo | None:
        """Return who holds lock ``name`` now, or ``None`` if nobody does.

        Error handling:
            :class:`RedisUnavailable` if Redis cannot be reached.
        """
        value, pttl = await self._run(_INSPECT, [lock_key(name)], [])
        if value is None:
            return None
        owner, token = _parse_value(value)
        return LockInfo(name, owner, token, int(pttl) / 1000 if int(pttl) >= 0 else None)

    # -- holding --

    @asynccontextmanager
    async def hold(
        self, name: str, *, ttl: float, wait: float | None = None
    ) -> AsyncIterator[HeldLease]:
        """Acquire lock ``name`` and keep the lease alive while the block runs.

        A background task extends the lease every ``ttl / 3`` (see
        :func:`keep_lease_alive`). The moment the lease is lost, the block is
        cancelled: at once when an extension is refused (the lock expired or changed
        hands), or at the lease's local deadline when Redis stayed unreachable
        (failed extensions are retried until then). ``held.lost`` turns true at the
        same moment. The lease is released when the block is left.

        Example::

            async with locks.hold("report", ttl=10) as held:
                await write_report(fencing_token=held.token)

        Args:
            name: the lock's name.
            ttl: the lease's TTL in seconds: how long others wait for a holder
                that died.
            wait: how long to wait for the lock (``None``: forever; ``0``: one try).

        Cancellation:
            Cancelling the block releases the lease (shielded, until the lease would
            expire anyway, at least :data:`RELEASE_TIMEOUT` seconds; otherwise it
            expires after ``ttl``).

        Error handling:
            :class:`LockNotAcquired` or :class:`RedisUnavailable` from acquiring,
            as for :meth:`acquire`. :class:`LockLost` when leaving a block that
            lost its lease (whether or not the block noticed), with the reason;
            an exception the block raised itself takes precedence.
        """
        lease = await self.acquire(name, ttl=ttl, wait=wait)
        held = HeldLease(lease)
        body_scope = trio.CancelScope()
        held.cancel_on_loss(body_scope)
        self._holding.append(held)
        try:
            async with open_service_nursery(reason=f"leaving the hold on {name!r}") as nursery:
                nursery.start_soon(self._keep, held)
                with body_scope:
                    yield held
        finally:
            self._holding.remove(held)
            await self._release_held(held)
        if held.lost_reason is not None:
            raise LockLost(name, held.lost_reason)

    async def _keep(self, held: HeldLease) -> None:
        health = health_of(self.redis)

        async def extend(lease: Lease) -> Lease:
            sent = trio.current_time()
            # With the other holds' renewals due now, in one call.
            extended = await self._renewals.extend(lease)
            health.outage.answered(sent)
            return extended

        def failed(exc: RedisUnavailable) -> None:
            health.unavailable(exc, what=f"extending the lease on {held.name!r}")

        try:
            reason = await keep_lease_alive(
                held.lease, extend, on_extended=held._extended, on_failure=failed, aligned=True
            )
        except StreamkitError as exc:
            # A Redis error reply (say, a script error): the lease can no longer be
            # kept, so treat it as lost rather than leaving the holder unprotected.
            log.exception("keeping the lease on %r alive failed", held.name)
            reason = f"keeping the lease alive failed: {exc}"
        self._lost += 1
        level = logging.DEBUG if lost_to_outage(reason) else logging.WARNING
        if lost_to_vanishing(reason):
            level = health.vanished.report(held.name, "lease", detail=reason)
        log.log(
            level,
            "lease on %r (token %d) lost: %s",
            held.name,
            held.token,
            reason,
        )
        held._lose(reason)

    async def _release_held(self, held: HeldLease) -> None:
        if held.lost_reason is not None:
            # Refused already, or its TTL ran out: not ours to release.
            return
        # Until the lease would expire anyway (at least RELEASE_TIMEOUT): a worker
        # handing thousands of partitions over at once releases them all together, and
        # a release given up early leaves the lock to its TTL (the new owner waits).
        with trio.move_on_after(max(RELEASE_TIMEOUT, held.lease.remaining())) as scope:
            scope.shield = True
            try:
                await self.release(held.lease)
            except NotLockOwner as exc:
                # The block ended before the keeper noticed; its exclusive access
                # had ended earlier, so the caller must hear about it.
                held._lose(f"lost before release: {'; '.join(exc.__notes__)}")
                self._lost += 1
            except RedisUnavailable as exc:
                # An outage: said once for every lease by the client's outage log.
                health_of(self.redis).unavailable(exc, what=f"releasing {held.name!r}")
                log.debug(
                    "releasing %r failed (%s); it expires in %.3fs",
                    held.name,
                    exc,
                    held.lease.remaining(),
                )
            except StreamkitError as exc:
                # Never let a failed release hide how the block ended; the lease
                # simply expires.
                log.warning(
                    "releasing %r failed (%s); it expires in %.3fs",
                    held.name,
                    exc,
                    held.lease.remaining(),
                )
        if scope.cancelled_caught:
            log.warning("releasing %r timed out; it expires on its own", held.name)

    # -- inspection --

    def statistics(self) -> LockManagerStatistics:
        """Return a snapshot of this manager's activity."""
        return LockManagerStatistics(
            owner=self.owner,
            holding=tuple(h.name for h in self._holding),
            acquired=self._acquired,
            extended=self._extended,
            released=self._released,
            lost=self._lost,
        )

    def __repr__(self) -> str:
        return (
            f"<LockManager owner={self.owner!r} on {self._where}, "
            f"holding {[h.name for h in self._holding]}, acquired {self._acquired}, "
            f"lost {self._lost}>"
        )


@asynccontextmanager
async def open_lock_manager(
    redis: Redis, *, owner: str | None = None, backoff: Backoff | None = None
) -> AsyncIterator[LockManager]:
    """Create a :class:`LockManager` on ``redis``.

    The lock scripts are loaded first, so an unusable server fails here rather than
    at the first acquire.

    Args:
        redis: a client from :func:`streamkit._redis.open_redis`.
        owner: the owner id written into leases; by default
            ``"<hostname>:<pid>:<random>"``, unique per manager.
        backoff: the polling schedule while waiting for a held lock.

    Error handling:
        :class:`RedisUnavailable` if Redis cannot be reached.
    """
    where = getattr(redis.connection_pool, "location", None)
    manager = LockManager(
        redis,
        owner or _default_owner(),
        backoff or DEFAULT_POLL_BACKOFF,
        f"redis://{where}" if where else "redis",
    )
    await manager._load_scripts()
    yield manager
