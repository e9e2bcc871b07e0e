"""Leader election on a real Redis server: one leader, failover, leader-only work."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
import trio_util

from streamkit import RedisUnavailable
from streamkit._leadership import LeaderElection, open_leader_election
from streamkit._locks import lock_key, open_lock_manager
from streamkit._redis import open_redis

if TYPE_CHECKING:
    from streamkit._redis import Redis
    from streamkit.testing import RedisServer

pytestmark = pytest.mark.timeout(30)

TTL = 0.6


async def run_contender(
    redis: Redis,
    owner: str,
    elections: dict[str, LeaderElection],
    *,
    task_status: trio.TaskStatus[trio.CancelScope],
) -> None:
    """One contender with a cancel scope of its own, like a worker process."""
    with trio.CancelScope() as scope:
        async with (
            open_lock_manager(redis, owner=owner) as locks,
            open_leader_election(locks, "scheduler", ttl=TTL) as election,
        ):
            elections[owner] = election
            task_status.started(scope)
            await trio.sleep_forever()


def leaders(elections: dict[str, LeaderElection]) -> list[str]:
    return [owner for owner, e in elections.items() if e.is_leader.value]


@pytest.mark.cluster
async def test_exactly_one_leader_and_failover(redis: Redis) -> None:
    elections: dict[str, LeaderElection] = {}
    scopes: dict[str, trio.CancelScope] = {}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for owner in ("n1", "n2", "n3"):
                scopes[owner] = await nursery.start(run_contender, redis, owner, elections)
            # The first attempt is made before open_leader_election returns.
            assert leaders(elections) == ["n1"]
            first = elections["n1"]
            assert first.lease is not None
            assert (await first.leader()) is not None

            # Several TTLs later, still exactly one leader, holding the lock: the
            # same term, extended all along, and no other contender ever elected.
            token = first.lease.token
            later = trio.current_time() + 3 * TTL
            lease = await first.leader_lease.wait_value(
                lambda lease: lease is not None and lease.valid_until >= later
            )
            assert lease.token == token
            assert leaders(elections) == ["n1"]
            assert [e.terms for e in elections.values()] == [1, 0, 0]
            info = await elections["n2"].leader()
            assert info is not None
            assert (info.owner, info.token) == ("n1", token)

            # Kill the leader: another contender takes over, with a newer token.
            scopes["n1"].cancel()
            await trio_util.wait_any(
                lambda: elections["n2"].is_leader.wait_value(True),
                lambda: elections["n3"].is_leader.wait_value(True),
            )
            [new] = leaders(elections)
            assert new in ("n2", "n3")
            new_lease = await elections[new].wait_leader()
            assert new_lease.token > token
            assert not first.is_leader.value
            assert "leader (token" in repr(elections[new])
            assert "follower" in repr(first)
            nursery.cancel_scope.cancel()


@pytest.mark.cluster
async def test_leader_work_is_cancelled_on_loss_and_restarted(redis: Redis) -> None:
    events = trio_util.AsyncValue[tuple[str, ...]](())
    reasons: list[str] = []

    async def leader_work() -> None:
        events.value += ("start",)
        try:
            await trio.sleep_forever()
        except trio.Cancelled as exc:
            reasons.append(str(exc.reason))
            events.value += ("cancelled",)
            raise

    with trio.fail_after(10):
        async with (
            open_lock_manager(redis, owner="me") as locks,
            open_lock_manager(redis, owner="usurper") as usurper,
            open_leader_election(locks, "scheduler", ttl=TTL) as election,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(election.run_while_leader, leader_work)
            await events.wait_value(("start",))
            first = await election.wait_leader()

            # Someone else takes the lock: the leader work stops, leadership is lost.
            await redis.delete([lock_key("scheduler")])
            theirs = await usurper.acquire("scheduler", ttl=30)
            await election.is_leader.wait_value(False)
            await events.wait_value(("start", "cancelled"))
            assert reasons[0].startswith("lease on 'scheduler' lost: extension refused")
            assert election.lease is None
            assert election.leader_lease.value is None

            # The deposed leader campaigns again and wins once the lock is free.
            await usurper.release(theirs)
            second = await election.wait_leader()
            assert second.token > theirs.token > first.token
            await events.wait_value(("start", "cancelled", "start"))
            assert election.terms == 2
            nursery.cancel_scope.cancel()


async def test_work_that_returns_waits_for_the_next_term(redis: Redis) -> None:
    runs = trio_util.AsyncValue[tuple[int, ...]](())

    async def once(election: LeaderElection) -> None:
        lease = await election.wait_leader()
        runs.value += (lease.token,)

    with trio.fail_after(10):
        async with (
            open_lock_manager(redis) as locks,
            open_leader_election(locks, "scheduler", ttl=TTL) as election,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(election.run_while_leader, once, election)
            await runs.wait_value(lambda r: len(r) == 1)
            await redis.delete([lock_key("scheduler")])  # depose; it is re-elected
            second = await runs.wait_value(lambda r: len(r) == 2)
            assert second[1] > second[0]
            nursery.cancel_scope.cancel()


@pytest.mark.cluster
async def test_leaving_the_election_releases_leadership(redis: Redis) -> None:
    async with open_lock_manager(redis) as locks:
        async with open_leader_election(locks, "scheduler", ttl=30) as election:
            assert election.is_leader.value
        assert await redis.exists([lock_key("scheduler")]) == 0
        assert not election.is_leader.value


async def test_block_exceptions_propagate_as_themselves(redis: Redis) -> None:
    async with open_lock_manager(redis) as locks:
        with pytest.raises(ValueError, match="boom"):
            async with open_leader_election(locks, "scheduler", ttl=TTL):
                raise ValueError("boom")


async def test_unreachable_redis_at_start_is_reported(private_redis: RedisServer) -> None:
    async with open_redis(private_redis.url) as client, open_lock_manager(client) as locks:
        await trio.to_thread.run_sync(private_redis.stop)
        with trio.fail_after(5), pytest.raises(RedisUnavailable):
            async with open_leader_election(locks, "scheduler", ttl=TTL):
                pytest.fail("must not start")


async def test_leader_rides_out_a_redis_restart(private_redis: RedisServer) -> None:
    async with (
        open_redis(private_redis.url) as client,
        open_lock_manager(client, owner="me") as locks,
        open_leader_election(locks, "scheduler", ttl=1.0) as election,
    ):
        first = await election.wait_leader()
        # The append-only file keeps the lock and its fencing counter.
        await trio.to_thread.run_sync(private_redis.restart)
        restarted = trio.current_time()
        with trio.fail_after(10):
            # Leading on a lease extended (or won again) after the restart.
            lease = await election.leader_lease.wait_value(
                lambda lease: lease is not None and lease.valid_until >= restarted + 0.5
            )
        assert lease.token >= first.token
