"""The renewals of one lock manager's holds: on one grid, sent together, each answered
for its own lease; on a real Redis (and the schedule on a mock clock)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

import attrs
import pytest
import trio
import trio.testing

from streamkit import LockLost, RedisUnavailable
from streamkit._locks import Lease, keep_lease_alive
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import LockManager, Redis
    from streamkit._locks import HeldLease


async def test_aligned_renewals_fall_on_the_grid(autojump_clock: trio.testing.MockClock) -> None:
    """Leases of one TTL acquired at different moments renew at the same instants,
    ``k * ttl / 3``, the first sooner than a period after the acquisition."""
    await trio.sleep(10.7)
    sent: list[float] = []

    async def extend(lease: Lease) -> Lease:
        sent.append(round(trio.current_time(), 6))
        if len(sent) == 3:
            raise RedisUnavailable("redis://test", "gone")
        return attrs.evolve(lease, valid_until=trio.current_time() + lease.ttl)

    lease = Lease("jobs", "__lock:{jobs}", "alice", 7, 3.0, trio.current_time() + 3.0)
    with trio.move_on_after(2.5):
        await keep_lease_alive(lease, extend, aligned=True)
    assert sent[:2] == [11.0, 12.0]


async def evalsha_calls(redis: Redis) -> int:
    stats = cast("dict[str, Any]", await redis.info("commandstats"))
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_managers_holds_renew_in_few_calls(redis: Redis, locks: LockManager) -> None:
    """Forty holds of one manager: every lease kept, each extended again and again, in
    a handful of script calls instead of one per extension."""
    held: list[HeldLease] = []
    with trio.fail_after(10):
        async with contextlib.AsyncExitStack() as stack:
            held.extend(
                [
                    await stack.enter_async_context(locks.hold(f"many.{n}", ttl=0.6))
                    for n in range(40)
                ]
            )
            before_calls = await evalsha_calls(redis)
            before = sum(h.extensions for h in held)
            await wait_until(
                lambda: all(h.extensions >= 3 for h in held), what="3 extensions each", within=5
            )
            calls = await evalsha_calls(redis) - before_calls
            extensions = sum(h.extensions for h in held) - before
            assert not any(h.lost.value for h in held)
    assert extensions >= 80
    assert calls * 5 <= extensions, (calls, extensions)


async def test_a_refused_extension_loses_its_own_lease_only(
    redis: Redis, locks: LockManager
) -> None:
    """One of the leases renewed together was taken over: its hold's body is
    cancelled with the refusal; the others stay held and keep being extended."""
    lost = trio.Event()

    async def hold_and_lose() -> None:
        async with locks.hold("together.0", ttl=0.6) as mine:
            await redis.set(mine.lease.key, b"someone-else:999")
            await trio.sleep_forever()

    async def taken_over() -> None:
        with pytest.raises(LockLost) as info:
            await hold_and_lose()
        assert "someone-else" in str(info.value)
        lost.set()

    with trio.fail_after(10):
        async with contextlib.AsyncExitStack() as stack:
            others = [
                await stack.enter_async_context(locks.hold(f"together.{n}", ttl=0.6))
                for n in range(1, 10)
            ]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(taken_over)
                await lost.wait()
            counts = [h.extensions for h in others]
            await wait_until(
                lambda: all(h.extensions > c for h, c in zip(others, counts, strict=True)),
                what="the others extended again",
                within=5,
            )
            assert not any(h.lost.value for h in others)
