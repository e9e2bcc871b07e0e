"""The lock manager and the membership store behind a link cut one way.

Through a :class:`~tests.netfaults.FaultProxy` whose replies are blackholed, requests
still reach Redis: every command lands and nobody hears it did. A lease loop that
kept sending acquire attempts would keep taking the lock (a new token each TTL) and a
member that kept heartbeating would stay listed: the others could never take over.
Both must fall silent once they have heard nothing for a lease period (a session
timeout), and come back when the link heals. What landed is read on a direct
connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from streamkit._locks import fence_key, lock_key, open_lock_manager
from streamkit._membership import open_membership
from streamkit._membership_state import membership_keys
from streamkit._redis import open_redis
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from streamkit._locks import Lease
    from streamkit._redis import Redis
    from tests.netfaults import FaultProxies

pytestmark = pytest.mark.timeout(30)


def absent(redis: Redis, key: str) -> Callable[[], Awaitable[bool]]:
    """A condition for ``wait_until``: ``key`` does not exist."""

    async def check() -> bool:
        return await redis.exists([key]) == 0

    return check


async def test_waiting_acquire_stops_taking_the_lock_unheard(
    fault_proxies: FaultProxies, redis: Redis
) -> None:
    ttl = 0.5
    proxy = await fault_proxies.open()
    async with open_redis(proxy.url) as cut, open_lock_manager(cut) as locks:
        proxy.blackhole("replies")
        got: list[Lease] = []

        async def acquire() -> None:
            got.append(await locks.acquire("job", ttl=ttl, wait=None))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(acquire)
            # The first attempt (heard from Redis within a TTL) lands unheard.
            await wait_until(
                lambda: redis.exists([lock_key("job")]), what="the first attempt", within=5
            )
            await wait_until(absent(redis, lock_key("job")), what="its TTL over", within=5)
            # Silence for longer than a lease: nothing taken again (it only asks).
            with pytest.raises(trio.TooSlowError):
                await wait_until(
                    lambda: redis.exists([lock_key("job")]), what="a re-take", within=4 * ttl
                )
            assert int(await redis.get(fence_key("job")) or 0) == 1
            proxy.heal()
        # Heard again: the next attempt takes the lock, and says so.
        [lease] = got
        assert lease.token == 2
        assert await redis.get(lock_key("job")) == lease.value


async def test_member_stops_heartbeating_unheard_and_comes_back(
    fault_proxies: FaultProxies, redis: Redis
) -> None:
    session = 0.5
    proxy = await fault_proxies.open()
    async with (
        open_redis(proxy.url) as cut,
        open_membership(
            cut, "app.orders.proc", partitions=4, heartbeat_interval=0.05, session_timeout=session
        ) as member,
    ):
        beat = membership_keys("app.orders.proc").heartbeat(member.id)
        # A heartbeat heard first (its script loaded: a NOSCRIPT would land nothing).
        with trio.fail_after(5):
            await member.last_heartbeat.wait_value(lambda at: at is not None)
        proxy.blackhole("replies")
        # The heartbeat in flight lands and lasts its session timeout; then none.
        await wait_until(absent(redis, beat), what="the heartbeat over", within=5)
        with pytest.raises(trio.TooSlowError):
            await wait_until(lambda: redis.exists([beat]), what="a heartbeat", within=4 * session)
        beats = member.statistics().heartbeats
        proxy.heal()
        await wait_until(lambda: redis.exists([beat]), what="heartbeats again", within=5)
        await wait_until(
            lambda: member.statistics().heartbeats > beats, what="a heartbeat heard", within=5
        )
