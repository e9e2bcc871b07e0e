"""The membership store on a real Redis: joins, leaves, deaths, static members, outages.

Intervals are short (heartbeat 0.1 s, session 0.5 s) and every wait is on a
condition under ``trio.fail_after``; nothing sleeps and hopes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

from streamkit import ConfigError, MetadataMismatch, RedisUnavailable
from streamkit._membership import REAP_WATCHES, Membership, _watched_by, open_membership
from streamkit._membership_admin import read_membership, reset_membership
from streamkit._membership_state import GroupState, membership_keys, plan_removal
from streamkit._redis import Redis, open_redis

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from streamkit._assignment import Assignment
    from streamkit.testing import RedisServer

GROUP = "app.orders.proc"
FAST: dict[str, Any] = {
    "heartbeat_interval": 0.1,
    "session_timeout": 0.5,
    "refresh_interval": 0.5,
    "leave_timeout": 1.0,
}
WAIT = 5.0


@attrs.define
class Running:
    """A member running in its own task, which a test can stop or crash."""

    member: Membership
    scope: trio.CancelScope
    done: trio.Event

    async def stop(self) -> None:
        """Exit the member's block (a graceful leave) and wait until it has left."""
        self.scope.cancel()
        with trio.fail_after(WAIT):
            await self.done.wait()

    async def crash(self) -> None:
        """Stop the member without leaving: its heartbeat simply stops."""
        self.member._leave_on_exit = False
        await self.stop()


async def start_member(
    nursery: trio.Nursery, redis: Redis, member_id: str, **options: Any
) -> Running:
    scope = trio.CancelScope()
    done = trio.Event()
    kwargs = {"partitions": 8, **FAST, **options}

    async def run(*, task_status: trio.TaskStatus[Membership]) -> None:
        try:
            with scope:
                async with open_membership(redis, GROUP, member_id=member_id, **kwargs) as m:
                    task_status.started(m)
                    await trio.sleep_forever()
        finally:
            done.set()

    with trio.fail_after(WAIT):
        member: Membership = await nursery.start(run)
    return Running(member, scope, done)


async def all_see(members: list[Membership], predicate: Callable[[Assignment], bool]) -> None:
    with trio.fail_after(WAIT):
        for m in members:
            await m.assignment.wait_value(predicate)


def with_members(*ids: str) -> Callable[[Assignment], bool]:
    return lambda a: set(a.members) == set(ids)


def assert_balanced(assignment: Assignment, partitions: int = 8) -> None:
    owned = sorted(p for ps in assignment.members.values() for p in ps)
    assert owned == list(range(partitions))
    sizes = [len(ps) for ps in assignment.members.values()]
    assert max(sizes) - min(sizes) <= 1


async def control_events(redis: Redis) -> list[dict[str | bytes, str | bytes]]:
    entries = await redis.xrange(membership_keys(GROUP).control)
    return [dict(e.field_values) for e in entries]


@pytest.fixture
async def nursery(redis: Redis) -> AsyncIterator[trio.Nursery]:
    # Depends on ``redis`` so that members leave before the client closes.
    async with trio.open_nursery() as n:
        yield n
        n.cancel_scope.cancel()


@pytest.mark.cluster
async def test_three_members_share_the_partitions(redis: Redis, nursery: trio.Nursery) -> None:
    a, b, c = [(await start_member(nursery, redis, i)).member for i in "abc"]
    await all_see([a, b, c], with_members("a", "b", "c"))
    final = a.assignment.value
    assert b.assignment.value == c.assignment.value == final
    assert final.generation == 3
    assert_balanced(final)
    for m in (a, b, c):
        assert m.partitions.value == frozenset(final.of(m.id))

    snapshot = await read_membership(redis, GROUP)
    assert snapshot is not None
    assert snapshot.assignment == final
    assert [info.id for info in snapshot.members] == ["a", "b", "c"]
    assert all(info.heartbeat_ttl is not None for info in snapshot.members)
    assert [e[b"event"] for e in await control_events(redis)] == [b"join"] * 3
    assert "generation 3, 3 members" in repr(a)


@pytest.mark.cluster
async def test_a_leave_moves_only_the_leavers_partitions(
    redis: Redis, nursery: trio.Nursery
) -> None:
    a = (await start_member(nursery, redis, "a")).member
    b = await start_member(nursery, redis, "b")
    c = (await start_member(nursery, redis, "c")).member
    await all_see([a, b.member, c], with_members("a", "b", "c"))
    before = a.assignment.value

    await b.stop()
    await all_see([a, c], with_members("a", "c"))
    after = a.assignment.value
    assert after.generation == before.generation + 1
    assert_balanced(after)
    assert set(before.of("a")) <= set(after.of("a"))
    assert set(before.of("c")) <= set(after.of("c"))
    moved = (set(after.of("a")) - set(before.of("a"))) | (set(after.of("c")) - set(before.of("c")))
    assert moved == set(before.of("b"))
    assert b.member.partitions.value == frozenset()
    assert (await control_events(redis))[-1] == {
        b"event": b"leave",
        b"member": b"b",
        b"generation": str(after.generation).encode(),
    }
    assert await redis.exists([membership_keys(GROUP).heartbeat("b")]) == 0


@pytest.mark.cluster
async def test_a_dead_member_is_reaped(redis: Redis, nursery: trio.Nursery) -> None:
    a = (await start_member(nursery, redis, "a")).member
    b = await start_member(nursery, redis, "b")
    c = (await start_member(nursery, redis, "c")).member
    await all_see([a, b.member, c], with_members("a", "b", "c"))
    before = a.assignment.value

    await b.crash()
    # Nothing told the group: b is still a member until its heartbeat expires.
    snapshot = await read_membership(redis, GROUP)
    assert snapshot is not None
    assert "b" in snapshot.assignment.members

    await all_see([a, c], with_members("a", "c"))
    after = a.assignment.value
    assert after.generation == before.generation + 1
    assert_balanced(after)
    assert set(before.of("a")) <= set(after.of("a"))
    assert set(before.of("c")) <= set(after.of("c"))
    assert a.statistics().reaped + c.statistics().reaped == 1
    last = (await control_events(redis))[-1]
    assert last[b"event"] == b"reap"
    assert last[b"member"] == b"b"


def test_each_member_watches_the_next_three_and_is_watched_by_three() -> None:
    members = [f"m{i:02d}" for i in range(10)]
    watches = {m: _watched_by(m, members) for m in members}
    assert watches["m03"] == ["m04", "m05", "m06"]
    assert watches["m09"] == ["m00", "m01", "m02"]
    for m in members:
        assert len(watches[m]) == REAP_WATCHES
        assert sum(m in w for w in watches.values()) == REAP_WATCHES
    # A small group: everybody else; a member not (yet) listed: the ones after its place.
    assert _watched_by("b", ["a", "b", "c"]) == ["a", "c"]
    assert _watched_by("m035", members) == ["m04", "m05", "m06"]


async def test_dead_members_of_a_bigger_group_are_reaped_even_with_a_watcher(
    redis: Redis, nursery: trio.Nursery
) -> None:
    """Six members, each watching three: two neighbours crash together (one of them a
    watcher of the other); the others reap both."""
    ids = ["a", "b", "c", "d", "e", "f"]
    running = [await start_member(nursery, redis, m) for m in ids]
    await all_see([r.member for r in running], with_members(*ids))
    await running[1].crash()
    await running[2].crash()
    alive = [r.member for r in running if r.member.id not in {"b", "c"}]
    await all_see(alive, with_members("a", "d", "e", "f"))
    assert_balanced(alive[0].assignment.value)


async def test_a_static_member_back_within_its_grace_moves_nothing(
    redis: Redis, nursery: trio.Nursery
) -> None:
    a = (await start_member(nursery, redis, "a")).member
    s = await start_member(nursery, redis, "s", static=True, static_grace=10.0)
    await all_see([a, s.member], with_members("a", "s"))
    before = a.assignment.value
    events_before = await control_events(redis)

    await s.stop()
    # Still a member, its heartbeat now lasting static_grace instead of session_timeout.
    snapshot = await read_membership(redis, GROUP)
    assert snapshot is not None
    assert snapshot.assignment == before
    ttl = {info.id: info.heartbeat_ttl for info in snapshot.members}["s"]
    assert ttl is not None
    assert ttl > FAST["session_timeout"]

    again = (await start_member(nursery, redis, "s", static=True, static_grace=10.0)).member
    assert again.assignment.value == before
    assert again.partitions.value == frozenset(before.of("s"))
    # Several session timeouts later, still the same generation: no reap, no join.
    with trio.move_on_after(3 * FAST["session_timeout"]):
        await a.assignment.wait_value(lambda v: v != before)
    assert a.assignment.value == before
    assert await control_events(redis) == events_before


async def test_a_static_member_not_back_in_time_is_reaped(
    redis: Redis, nursery: trio.Nursery
) -> None:
    a = (await start_member(nursery, redis, "a")).member
    s = await start_member(nursery, redis, "s", static=True, static_grace=0.3)
    await all_see([a, s.member], with_members("a", "s"))
    await s.stop()
    await all_see([a], with_members("a"))
    assert a.partitions.value == frozenset(range(8))
    assert (await control_events(redis))[-1][b"event"] == b"reap"


async def test_watchers_follow_changes(redis: Redis, nursery: trio.Nursery) -> None:
    a = (await start_member(nursery, redis, "a")).member
    seen: list[frozenset[int]] = []
    changed = trio.Event()

    async def follow() -> None:
        nonlocal changed
        async for parts in a.partitions.eventual_values():
            seen.append(parts)
            changed.set()
            changed = trio.Event()

    async def wait_seen(count: int) -> None:
        with trio.fail_after(WAIT):
            while len(seen) < count:
                await changed.wait()

    nursery.start_soon(follow)
    await wait_seen(1)
    b = await start_member(nursery, redis, "b")
    await wait_seen(2)
    await b.stop()
    await wait_seen(3)
    half = seen[1]
    assert seen == [frozenset(range(8)), half, frozenset(range(8))]
    assert len(half) == 4


@pytest.mark.cluster
async def test_concurrent_joins_are_atomic(redis: Redis, nursery: trio.Nursery) -> None:
    ids = [f"m{i}" for i in range(5)]
    members: dict[str, Membership] = {}

    async def join(member_id: str) -> None:
        members[member_id] = (await start_member(nursery, redis, member_id)).member

    async with trio.open_nursery() as joining:
        for member_id in ids:
            joining.start_soon(join, member_id)

    await all_see(list(members.values()), with_members(*ids))
    final = members["m0"].assignment.value
    # One generation per join: no join overwrote another's.
    assert final.generation == 5
    assert_balanced(final)
    for m in members.values():
        assert m.assignment.value == final
        assert m.partitions.value == frozenset(final.of(m.id))
    snapshot = await read_membership(redis, GROUP)
    assert snapshot is not None
    assert snapshot.assignment == final
    assert sorted(e[b"generation"] for e in await control_events(redis)) == [
        str(g).encode() for g in range(1, 6)
    ]


@pytest.mark.cluster
async def test_a_member_removed_behind_its_back_rejoins(
    redis: Redis, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    a = (await start_member(nursery, redis, "a")).member
    b = (await start_member(nursery, redis, "b")).member
    await all_see([a, b], with_members("a", "b"))

    # As if b had been paused past its session and reaped by someone else.
    keys = membership_keys(GROUP)
    state = GroupState.decode(await redis.get(keys.state))
    removed = plan_removal(state, ["b"], a.assignor)
    assert removed is not None
    with caplog.at_level(logging.WARNING, logger="streamkit.membership"):
        await redis.set(keys.state, removed.encode())
        await redis.xadd(keys.control, {"event": "reap", "member": "b", "generation": "3"})
        with trio.fail_after(WAIT):
            await b.assignment.wait_value(lambda v: v.generation == 4 and "b" in v.members)
    assert b.statistics().joins == 2
    assert any("rejoining" in r.getMessage() for r in caplog.records)
    await all_see([a, b], lambda v: v.generation == 4)
    assert_balanced(a.assignment.value)


async def test_partition_mismatch_is_refused(redis: Redis, nursery: trio.Nursery) -> None:
    await start_member(nursery, redis, "a", partitions=4)
    with pytest.raises(MetadataMismatch) as info:
        async with open_membership(redis, GROUP, partitions=5, **FAST):
            pytest.fail("must not join")
    assert info.value.recorded == [0, 1, 2, 3]


async def test_an_empty_group_takes_new_partitions(redis: Redis) -> None:
    async with open_membership(redis, GROUP, partitions=4, **FAST) as m:
        assert m.partitions.value == frozenset(range(4))
    async with open_membership(redis, GROUP, partitions=[10, 11], **FAST) as m:
        assert m.partitions.value == frozenset({10, 11})
        assert m.assignment.value.generation == 3


async def test_settings_are_validated(redis: Redis) -> None:
    with pytest.raises(ConfigError, match="session_timeout"):
        async with open_membership(
            redis, GROUP, partitions=4, heartbeat_interval=1, session_timeout=1
        ):
            pass
    with pytest.raises(ConfigError, match="group"):
        async with open_membership(redis, "a{b}", partitions=4):
            pass
    with pytest.raises(ConfigError, match="partitions"):
        async with open_membership(redis, GROUP, partitions=0):
            pass
    with pytest.raises(ConfigError, match="member_id"):
        async with open_membership(redis, GROUP, partitions=4, member_id=""):
            pass


async def test_a_broken_assignor_is_reported(redis: Redis) -> None:
    def greedy(partitions: Any, members: Any, previous: Any) -> dict[str, tuple[int, ...]]:
        return {"somebody-else": tuple(partitions)}

    with pytest.raises(ConfigError, match="assignor"):
        async with open_membership(redis, GROUP, partitions=4, assignor=greedy, **FAST):
            pass


async def test_an_error_in_the_block_propagates_unwrapped_and_leaves(redis: Redis) -> None:
    with pytest.raises(KeyError, match="boom"):
        async with open_membership(redis, GROUP, partitions=4, member_id="a", **FAST):
            raise KeyError("boom")
    snapshot = await read_membership(redis, GROUP)
    assert snapshot is not None
    assert snapshot.members == ()


async def heartbeats(m: Membership, count: int) -> None:
    """Wait for ``count`` heartbeats of ``m`` sent from now on."""
    since = trio.current_time()
    await m.last_heartbeat.wait_value(lambda sent_at: sent_at is not None and sent_at >= since)
    for _ in range(count - 1):
        await m.last_heartbeat.wait_transition()


@pytest.mark.cluster
async def test_heartbeats_keep_the_member_alive(redis: Redis) -> None:
    async with open_membership(redis, GROUP, partitions=4, member_id="a", **FAST) as m:
        with trio.fail_after(WAIT):
            await heartbeats(m, 8)  # well past the session timeout
        ttl = await redis.pttl(membership_keys(GROUP).heartbeat("a"))
        assert 0 < ttl <= 500
        stats = m.statistics()
        assert stats.generation == 1
        assert stats.partitions == frozenset(range(4))
        assert stats.connected
        assert stats.heartbeats >= 8


async def test_an_outage_keeps_the_last_assignment(
    private_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_redis(private_redis.url) as redis:
        async with open_membership(redis, GROUP, partitions=4, member_id="a", **FAST) as m:
            with caplog.at_level(logging.DEBUG, logger="streamkit"):
                await trio.to_thread.run_sync(private_redis.stop)
                with trio.fail_after(WAIT):
                    await m.connected.wait_value(False)
                assert m.partitions.value == frozenset(range(4))
                # The client's outage log warns (once for the process); the member's
                # own line, at debug level, says what it does about it.
                assert any("keeping the last known" in r.getMessage() for r in caplog.records)
                assert any(
                    r.levelno == logging.WARNING and "unreachable" in r.getMessage()
                    for r in caplog.records
                )

                await trio.to_thread.run_sync(private_redis.start)
                with trio.fail_after(WAIT):
                    await heartbeats(m, 3)
                assert m.connected.value
            assert m.partitions.value == frozenset(range(4))
            assert m.assignment.value.generation == 1
        snapshot = await read_membership(redis, GROUP)
        assert snapshot is not None
        assert snapshot.members == ()


async def test_a_hung_server_counts_as_unreachable(private_redis: RedisServer) -> None:
    async with (
        open_redis(private_redis.url) as redis,
        open_membership(redis, GROUP, partitions=4, member_id="a", **FAST) as m,
    ):
        private_redis.pause()
        try:
            with trio.fail_after(WAIT):
                await m.connected.wait_value(False)
            assert m.partitions.value == frozenset(range(4))
        finally:
            private_redis.resume()
        with trio.fail_after(WAIT):
            await heartbeats(m, 3)
        assert m.connected.value
        assert m.statistics().heartbeat_failures > 0
        assert m.assignment.value.generation == 1


async def test_the_reapers_probe_meets_an_unreachable_server_as_an_outage(
    private_redis: RedisServer,
) -> None:
    """Once the fast path finds a heartbeat missing, the reaper probes each silent
    member's: that probe's refused connection is :class:`RedisUnavailable`, which the
    reaper rides out, not the client library's own error, which ended the member and
    the worker (seen in ``tests/test_cluster_failover.py``: just after a master was
    killed, the probe still went to it)."""
    async with (
        open_redis(private_redis.url) as redis,
        open_membership(redis, GROUP, partitions=4, member_id="a", **FAST) as m,
    ):
        await trio.to_thread.run_sync(private_redis.stop)
        try:
            with pytest.raises(RedisUnavailable):
                await m._transact_reap(["a", "b"])
        finally:
            await trio.to_thread.run_sync(private_redis.start)
        with trio.fail_after(WAIT):
            await heartbeats(m, 2)


async def test_entering_gives_up_after_the_session_timeout_or_rides_the_outage_out(
    private_redis: RedisServer,
) -> None:
    """An unreachable Redis while entering: a member gives up after its session timeout,
    or, with ``ride_out_outages`` (a worker starting its processors), waits for Redis
    for as long as it takes and joins once it is back."""
    async with open_redis(private_redis.url) as redis:
        await trio.to_thread.run_sync(private_redis.stop)
        try:
            with trio.fail_after(WAIT), pytest.raises(RedisUnavailable):
                async with open_membership(redis, GROUP, partitions=4, member_id="a", **FAST):
                    pass
            entered = trio.Event()

            async def join() -> None:
                async with open_membership(
                    redis, GROUP, partitions=4, member_id="b", ride_out_outages=True, **FAST
                ) as m:
                    assert m.partitions.value == frozenset(range(4))
                    entered.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(join)
                # the outage: three times the session timeout the other gave up after
                await trio.sleep(3 * FAST["session_timeout"])
                assert not entered.is_set()
                await trio.to_thread.run_sync(private_redis.start)
                with trio.fail_after(WAIT):
                    await entered.wait()
        finally:
            if not private_redis.running:
                await trio.to_thread.run_sync(private_redis.start)


@pytest.mark.cluster
async def test_read_and_reset(redis: Redis) -> None:
    assert await read_membership(redis, GROUP) is None
    async with open_membership(redis, GROUP, partitions=2, member_id="a", static=True, **FAST) as m:
        pass
    assert m.partitions.value == frozenset()
    assert await read_membership(redis, GROUP) is not None
    await reset_membership(redis, GROUP)
    assert await read_membership(redis, GROUP) is None
    assert await redis.keys("*{" + GROUP + "}*") == set()
