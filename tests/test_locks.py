"""The lock manager: leases, fencing tokens, and ``hold()`` on a real Redis server.

Time logic that does not need Redis (the renewal schedule, the local deadline) runs
on Trio's mock clock with exact times; everything else talks to a private server.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from streamkit import ConfigError, LockLost, LockNotAcquired, NotLockOwner, RedisUnavailable
from streamkit._backoff import Backoff
from streamkit._locks import (
    HeldLease,
    Lease,
    LockManager,
    fence_key,
    keep_lease_alive,
    local_deadline,
    lock_key,
    open_lock_manager,
    tagged,
)
from streamkit._redis import open_redis
from streamkit._vanished import lost_to_vanishing
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit._redis import Redis
    from streamkit.testing import RedisServer

pytestmark = pytest.mark.timeout(30)

CONTENDER = Path(__file__).with_name("lock_contender.py")


async def next_extension(held: HeldLease) -> None:
    """Wait until ``held`` has been extended once more."""
    await held.current.wait_transition()


@pytest.fixture
async def locks(redis: Redis) -> AsyncIterator[LockManager]:
    async with open_lock_manager(redis, owner="alice") as manager:
        yield manager


@pytest.fixture
async def other(redis: Redis) -> AsyncIterator[LockManager]:
    async with open_lock_manager(redis, owner="bob") as manager:
        yield manager


# --- key layout ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("jobs", "{jobs}"),
        ("{app.orders.3}.proc", "{app.orders.3}.proc"),
        ("a{b}c", "a{b}c"),
        ("a{}b", "{a{}b}"),  # an empty tag does not count
        ("a{b", "{a{b}"),
        ("{", "{{}"),
    ],
)
def test_names_get_a_hash_tag_unless_they_have_one(name: str, expected: str) -> None:
    assert tagged(name) == expected
    assert lock_key(name) == "__lock:" + expected
    assert fence_key(name) == "__lock:" + expected + ":fence"


# --- single operations ---------------------------------------------------------------


@pytest.mark.cluster
async def test_acquire_extend_release(redis: Redis, locks: LockManager) -> None:
    lease = await locks.acquire("jobs", ttl=5)
    assert (lease.name, lease.key, lease.owner) == ("jobs", "__lock:{jobs}", "alice")
    assert lease.value == f"alice:{lease.token}".encode()
    assert await redis.get(lease.key) == lease.value
    assert 4000 < await redis.pttl(lease.key) <= 5000
    assert await redis.pttl(lease.fence_key) == -1  # the counter never expires

    info = await locks.holder("jobs")
    assert info is not None
    assert (info.owner, info.token) == ("alice", lease.token)
    assert info.expires_in is not None
    assert 4 < info.expires_in <= 5

    longer = await locks.extend(lease, ttl=30)
    assert longer.token == lease.token
    assert longer.ttl == 30
    assert longer.valid_until > lease.valid_until
    assert 29000 < await redis.pttl(lease.key) <= 30000

    await locks.release(longer)
    assert await redis.exists([lease.key]) == 0
    assert await locks.holder("jobs") is None
    stats = locks.statistics()
    assert (stats.acquired, stats.extended, stats.released, stats.lost) == (1, 1, 1, 0)
    assert "alice" in repr(locks)


@pytest.mark.cluster
async def test_a_held_lock_is_not_acquired(locks: LockManager, other: LockManager) -> None:
    await locks.acquire("jobs", ttl=5)
    with pytest.raises(LockNotAcquired) as info:
        await other.acquire("jobs", ttl=5)
    assert info.value.name == "jobs"
    assert await other.try_acquire("jobs", ttl=5) is None
    # Not reentrant: the same manager is refused too.
    assert await locks.try_acquire("jobs", ttl=5) is None


async def test_acquire_with_wait_times_out(locks: LockManager, other: LockManager) -> None:
    await locks.acquire("jobs", ttl=5)
    start = trio.current_time()
    with trio.fail_after(5), pytest.raises(LockNotAcquired):
        await other.acquire("jobs", ttl=5, wait=0.3)
    assert trio.current_time() - start >= 0.3


@pytest.mark.cluster
async def test_waiting_acquire_gets_the_lock_when_released(
    locks: LockManager, other: LockManager
) -> None:
    lease = await locks.acquire("jobs", ttl=30)
    got: list[Lease] = []

    async def wait_for_it() -> None:
        got.append(await other.acquire("jobs", ttl=5, wait=None))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_it)
            await trio.testing.wait_all_tasks_blocked()
            assert not got
            await locks.release(lease)
        # The nursery waited for wait_for_it: it got the lock.
    assert got[0].owner == "bob"
    assert got[0].token == lease.token + 1


async def test_waiting_acquire_gets_the_lock_when_it_expires(
    locks: LockManager, other: LockManager
) -> None:
    first = await locks.acquire("jobs", ttl=0.3)
    with trio.fail_after(5):
        second = await other.acquire("jobs", ttl=5, wait=None)
    assert second.token > first.token
    assert trio.current_time() >= first.valid_until - 0.01


@pytest.mark.cluster
async def test_fencing_tokens_strictly_increase(
    redis: Redis, locks: LockManager, other: LockManager
) -> None:
    tokens = []
    for manager in (locks, other, locks, other):
        # Released normally...
        lease = await manager.acquire("jobs", ttl=5)
        tokens.append(lease.token)
        await manager.release(lease)
        # ...and left to expire: the counter survives the lock.
        lease = await manager.acquire("jobs", ttl=5)
        tokens.append(lease.token)
        await redis.pexpire(lease.key, 1)

        async def expired(key: str = lease.key) -> bool:
            return not await redis.exists([key])

        await wait_until(expired, what=f"{lease.key} to expire", within=5, interval=0.005)
    assert tokens == sorted(set(tokens))
    assert tokens == list(range(1, 9))
    # Locks do not share counters.
    assert (await locks.acquire("other-jobs", ttl=5)).token == 1


async def test_non_owners_cannot_extend_or_release(
    redis: Redis, locks: LockManager, other: LockManager
) -> None:
    mine = await locks.acquire("jobs", ttl=10)
    pttl_before = await redis.pttl(mine.key)
    forged = attrs.evolve(mine, owner="bob")
    wrong_token = attrs.evolve(mine, token=mine.token + 1)
    for lease in (forged, wrong_token):
        with pytest.raises(NotLockOwner):
            await other.extend(lease, ttl=60)
        with pytest.raises(NotLockOwner):
            await other.release(lease)
    assert await redis.get(mine.key) == mine.value
    assert await redis.pttl(mine.key) <= pttl_before


async def test_a_stale_lease_cannot_touch_the_new_holders_lock(
    redis: Redis, locks: LockManager, other: LockManager
) -> None:
    stale = await locks.acquire("jobs", ttl=10)
    await redis.delete([stale.key])  # as if it expired
    fresh = await other.acquire("jobs", ttl=10)
    with pytest.raises(NotLockOwner) as info:
        await locks.extend(stale)
    assert "held by 'bob'" in info.value.__notes__[0]
    with pytest.raises(NotLockOwner):
        await locks.release(stale)
    assert await redis.get(fresh.key) == fresh.value

    await other.release(fresh)
    with pytest.raises(NotLockOwner) as info:
        await locks.extend(stale)
    assert "expired or was deleted" in info.value.__notes__[0]


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan, 0.0001])
async def test_bad_ttls_are_config_errors(locks: LockManager, ttl: float) -> None:
    with pytest.raises(ConfigError, match="ttl"):
        await locks.acquire("jobs", ttl=ttl)


async def test_bad_wait_is_a_config_error(locks: LockManager) -> None:
    with pytest.raises(ConfigError, match="wait"):
        await locks.acquire("jobs", ttl=1, wait=-1)


async def test_unreachable_redis_while_waiting(private_redis: RedisServer) -> None:
    async with open_redis(private_redis.url) as client, open_lock_manager(client) as locks:
        await trio.to_thread.run_sync(private_redis.stop)
        with pytest.raises(RedisUnavailable):
            await locks.acquire("jobs", ttl=1)
        with trio.fail_after(5), pytest.raises(RedisUnavailable):
            await locks.acquire("jobs", ttl=1, wait=0.2)


# --- hold ----------------------------------------------------------------------------


@pytest.mark.cluster
async def test_hold_keeps_the_lease_alive_and_releases_it(redis: Redis, locks: LockManager) -> None:
    with trio.fail_after(5):
        async with locks.hold("jobs", ttl=0.3) as held:
            assert locks.statistics().holding == ("jobs",)
            # Three times past the original TTL, the lease still holds.
            await held.current.wait_value(lambda _: held.extensions >= 3)
            assert trio.current_time() > held.lease.valid_until - 0.3
            assert await redis.get(held.lease.key) == held.lease.value
            assert not held.lost.value
            assert "held" in repr(held)
    assert await redis.exists([held.lease.key]) == 0
    stats = locks.statistics()
    assert stats.holding == ()
    assert stats.released == 1
    assert stats.extended >= 3


async def test_hold_waits_for_the_lock(locks: LockManager, other: LockManager) -> None:
    lease = await locks.acquire("jobs", ttl=0.3)
    with trio.fail_after(5):
        async with other.hold("jobs", ttl=1) as held:
            assert held.token == lease.token + 1
    await locks.acquire("jobs", ttl=5)
    with pytest.raises(LockNotAcquired):
        async with other.hold("jobs", ttl=1, wait=0):
            pytest.fail("must not be acquired")


async def test_deleted_key_cancels_the_body(redis: Redis, locks: LockManager) -> None:
    reasons: list[str] = []

    async def body(held: HeldLease) -> None:
        await redis.delete([held.lease.key])
        try:
            await trio.sleep_forever()
        except trio.Cancelled as exc:
            reasons.append(str(exc.reason))
            raise

    with trio.fail_after(5), pytest.raises(LockLost) as info:
        async with locks.hold("jobs", ttl=0.6) as held:
            await body(held)
    assert info.value.name == "jobs"
    assert "expired or was deleted" in info.value.reason
    assert held.lost.value
    assert held.lost_reason == info.value.reason
    assert reasons == [f"lease on 'jobs' lost: {info.value.reason}"]
    assert locks.statistics().lost == 1


async def test_expired_key_cancels_the_body(redis: Redis, locks: LockManager) -> None:
    async def body(held: HeldLease) -> None:
        await redis.pexpire(held.lease.key, 1)
        reason = await held.wait_lost()
        assert "expired" in reason
        await trio.sleep_forever()

    with trio.fail_after(5), pytest.raises(LockLost, match="expired"):
        async with locks.hold("jobs", ttl=0.6) as held:
            await body(held)


@pytest.mark.cluster
async def test_takeover_cancels_the_body_and_leaves_the_new_lease_alone(
    redis: Redis, locks: LockManager, other: LockManager
) -> None:
    taken: list[Lease] = []

    async def body(held: HeldLease) -> None:
        # Right after an extension, so the takeover completes before the next.
        await next_extension(held)
        await redis.delete([held.lease.key])
        taken.append(await other.acquire("jobs", ttl=10))
        await trio.sleep_forever()

    with trio.fail_after(5), pytest.raises(LockLost) as info:
        async with locks.hold("jobs", ttl=0.6) as held:
            await body(held)
    [theirs] = taken
    assert "extension refused" in info.value.reason
    assert f"held by 'bob' (token {theirs.token})" in info.value.reason
    assert await redis.get(theirs.key) == theirs.value
    assert await redis.pttl(theirs.key) > 9000


@pytest.mark.cluster
async def test_a_holder_with_a_smaller_token_means_the_lock_vanished(
    redis: Redis, locks: LockManager, other: LockManager
) -> None:
    """Tokens only grow: a lock taken under a smaller token than this lease's was taken
    after its fencing counter vanished (Redis lost its data), so the loss is reported
    as a vanished lock (said once by the worker), not as a takeover."""
    await locks.release(await locks.acquire("jobs", ttl=10))  # this lease's token is 2

    async def body(held: HeldLease) -> None:
        await next_extension(held)
        await redis.delete([held.lease.key, held.lease.fence_key])  # as a FLUSHALL would
        theirs = await other.acquire("jobs", ttl=10)
        assert theirs.token < held.token
        await trio.sleep_forever()

    with trio.fail_after(5), pytest.raises(LockLost) as info:
        async with locks.hold("jobs", ttl=0.6) as held:
            await body(held)
    assert lost_to_vanishing(info.value.reason), info.value.reason
    assert "held by 'bob' (token 1)" in info.value.reason


async def test_body_exception_wins_over_lock_lost(redis: Redis, locks: LockManager) -> None:
    async def body(held: HeldLease) -> None:
        await redis.delete([held.lease.key])
        try:
            await trio.sleep_forever()
        finally:
            raise KeyError("cleanup failed")

    with trio.fail_after(5), pytest.raises(KeyError):
        async with locks.hold("jobs", ttl=0.6) as held:
            await body(held)


async def test_body_exceptions_are_not_wrapped(locks: LockManager, redis: Redis) -> None:
    with pytest.raises(ValueError, match="boom"):
        async with locks.hold("jobs", ttl=1) as held:
            raise ValueError("boom")
    assert await redis.exists([held.lease.key]) == 0  # released all the same


async def test_loss_noticed_only_at_release_still_raises(redis: Redis, locks: LockManager) -> None:
    with pytest.raises(LockLost, match="lost before release"):
        async with locks.hold("jobs", ttl=5) as held:
            await redis.delete([held.lease.key])


async def test_outer_cancellation_releases_the_lease(redis: Redis, locks: LockManager) -> None:
    with trio.CancelScope() as scope:
        async with locks.hold("jobs", ttl=5) as held:
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert await redis.exists([held.lease.key]) == 0
    assert not held.lost.value


async def test_cancel_on_loss_reaches_other_tasks(redis: Redis, locks: LockManager) -> None:
    cancelled: list[str] = []

    async def worker(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            try:
                await trio.sleep_forever()
            except trio.Cancelled as exc:
                cancelled.append(str(exc.reason))
                raise

    async def body(held: HeldLease) -> None:
        async with trio.open_nursery() as nursery:
            held.cancel_on_loss(await nursery.start(worker))
            await redis.delete([held.lease.key])
            await trio.sleep_forever()

    with trio.fail_after(5), pytest.raises(LockLost):
        async with locks.hold("jobs", ttl=0.6) as held:
            await body(held)
    assert len(cancelled) == 1
    assert cancelled[0].startswith("lease on 'jobs' lost")
    # A scope linked after the loss is cancelled at once.
    late = trio.CancelScope()
    held.cancel_on_loss(late)
    assert late.cancel_called


async def test_brief_outage_is_ridden_out(private_redis: RedisServer) -> None:
    async with open_redis(private_redis.url) as client, open_lock_manager(client) as locks:
        with trio.fail_after(10):
            async with locks.hold("jobs", ttl=1.0) as held:
                # Freeze Redis right after an extension, for half the TTL.
                await next_extension(held)
                private_redis.pause()
                try:
                    await trio.sleep(0.5)
                finally:
                    private_redis.resume()
                await next_extension(held)
                await next_extension(held)
                assert not held.lost.value
                assert await client.get(held.lease.key) == held.lease.value


async def loop_lag(*, task_status: trio.TaskStatus[list[float]]) -> None:
    """How late this event loop wakes a task, at worst, while this runs (in seconds,
    ``[lag]``, updated every 20 ms)."""
    lag = [0.0]
    task_status.started(lag)
    while True:
        due = trio.current_time() + 0.02
        await trio.sleep_until(due)
        lag[0] = max(lag[0], trio.current_time() - due)


async def test_long_outage_loses_the_lease(private_redis: RedisServer) -> None:
    async with open_redis(private_redis.url) as client, open_lock_manager(client) as locks:

        async def body(held: HeldLease) -> None:
            private_redis.pause()
            try:
                with trio.fail_after(2):
                    async with trio.open_nursery() as nursery:
                        lag = await nursery.start(loop_lag)
                        await held.wait_lost()
                        nursery.cancel_scope.cancel()
                # Noticed at the local deadline, not later: later only by as much as
                # this event loop ran late meanwhile (a loaded machine runs it late).
                assert trio.current_time() <= local_deadline(held.lease) + 0.3 + lag[0]
                await trio.sleep_forever()
            finally:
                private_redis.resume()

        with trio.fail_after(10), pytest.raises(LockLost) as info:
            async with locks.hold("jobs", ttl=0.6) as held:
                await body(held)
        assert "Redis unreachable" in info.value.reason
        assert locks.statistics().lost == 1


@pytest.mark.cluster
async def test_two_processes_exclude_each_other(redis_url: str, redis: Redis) -> None:
    processes, rounds = 3, 4
    async with trio.open_nursery() as nursery:
        for _ in range(processes):
            nursery.start_soon(
                trio.run_process, [sys.executable, str(CONTENDER), redis_url, str(rounds)]
            )
    log = [entry.decode().split() for entry in await redis.lrange("{contended}:log", 0, -1)]
    assert len(log) == 2 * processes * rounds
    tokens = []
    for enter, leave in zip(log[::2], log[1::2], strict=True):
        # Every "enter" is directly followed by the same holder's "exit".
        assert enter[0] == "enter"
        assert leave == ["exit", *enter[1:]]
        tokens.append(int(enter[2]))
    assert tokens == sorted(set(tokens))
    assert len({enter[1] for enter in log[::2]}) == processes


# --- the renewal schedule, on a mock clock -------------------------------------------


def test_local_deadline_allows_for_clock_drift() -> None:
    lease = Lease("jobs", "__lock:{jobs}", "alice", 1, ttl=3.0, valid_until=13.0)
    assert local_deadline(lease) == 13.0 - (3.0 * 0.01 + 0.002)


def new_lease(ttl: float = 3.0) -> Lease:
    return Lease("jobs", "__lock:{jobs}", "alice", 7, ttl, trio.current_time() + ttl)


async def test_renewals_keep_a_fixed_schedule(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    sent: list[float] = []
    extended: list[Lease] = []

    async def extend(lease: Lease) -> Lease:
        now = trio.current_time()
        sent.append(now - start)
        if len(sent) == 5:
            exc = NotLockOwner(lease.name)
            exc.add_note("the lock is now held by 'bob' (token 8)")
            raise exc
        await trio.sleep(0.25)  # a slow round trip must not shift the schedule
        return attrs.evolve(lease, valid_until=now + lease.ttl)

    reason = await keep_lease_alive(new_lease(), extend, on_extended=extended.append)
    assert sent == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert trio.current_time() - start == 5.0  # refusal ends it at once
    assert reason == "extension refused: the lock is now held by 'bob' (token 8)"
    assert [lease.valid_until - start for lease in extended] == [4.0, 5.0, 6.0, 7.0]


async def test_slow_renewal_skips_missed_ticks(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    sent: list[float] = []

    async def extend(lease: Lease) -> Lease:
        now = trio.current_time()
        sent.append(now - start)
        if len(sent) == 1:
            raise RedisUnavailable("redis://test", "connection reset")
        if len(sent) == 3:
            raise NotLockOwner(lease.name)
        return attrs.evolve(lease, valid_until=now + lease.ttl)

    # The retry succeeds at 2.2; the next renewal is still at 3.0, not 3.2, and
    # the one due at 2.0 is skipped rather than sent late.
    backoff = Backoff(initial=1.2, maximum=1.2, jitter=0)
    reason = await keep_lease_alive(new_lease(), extend, backoff=backoff)
    assert sent == pytest.approx([1.0, 2.2, 3.0], abs=1e-9)
    assert reason == "extension refused"


async def test_unreachable_redis_is_retried_until_the_local_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    sent: list[float] = []
    last: list[Lease] = []

    async def extend(lease: Lease) -> Lease:
        now = trio.current_time()
        sent.append(now - start)
        if len(sent) > 1:
            raise RedisUnavailable("redis://test", "connection refused")
        last.append(attrs.evolve(lease, valid_until=now + lease.ttl))
        return last[-1]

    backoff = Backoff(initial=0.1, maximum=0.4, jitter=0)
    reason = await keep_lease_alive(new_lease(), extend, backoff=backoff)
    assert trio.current_time() == local_deadline(last[0])  # 4.0 - 0.032 after start
    assert sent == pytest.approx([1.0, 2.0, 2.1, 2.3, 2.7, 3.1, 3.5, 3.9], abs=1e-9)
    assert reason.startswith("Redis unreachable")


async def test_hung_attempts_are_abandoned_and_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    sent: list[float] = []

    async def extend(lease: Lease) -> Lease:
        sent.append(trio.current_time() - start)
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    backoff = Backoff(initial=0.5, maximum=0.5, jitter=0)
    lease = new_lease()
    reason = await keep_lease_alive(lease, extend, backoff=backoff)
    # Each attempt is given ttl / 3 = 1 s, then 0.5 s of backoff; the lease runs out
    # at its local deadline, in the middle of the second attempt.
    assert sent == [1.0, 2.5]
    assert trio.current_time() == local_deadline(lease)
    assert reason.startswith("Redis unreachable")


async def test_failed_release_does_not_mask_how_the_block_ended(
    private_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def stop_redis_and_fail() -> None:
        await trio.to_thread.run_sync(private_redis.stop)
        raise ValueError("mine")

    async with open_redis(private_redis.url) as client, open_lock_manager(client) as locks:
        with pytest.raises(ValueError, match="mine"):
            async with locks.hold("jobs", ttl=5):
                await stop_redis_and_fail()
        await trio.to_thread.run_sync(private_redis.start)
        with caplog.at_level(logging.DEBUG, logger="streamkit"):
            async with locks.hold("other", ttl=5):
                await trio.to_thread.run_sync(private_redis.stop)
        # Left normally within the lease: the lease was good; it just expires. The
        # outage is the client's to say (once); the release's own line is detail.
        assert any("releasing 'other' failed" in r.message for r in caplog.records)
        assert any(
            r.levelno == logging.WARNING and "unreachable" in r.message for r in caplog.records
        )
