"""Events: records(), take(), raw(), acknowledgement, draining and middleware."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import pytest
import trio
import trio.lowlevel
import trio_util

from streamkit.testing import wait_until
from tests.consume import GROUP, events_of, pending_ids, send

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Event, Redis, Stream
    from tests.consume import Tick


async def test_take_yields_full_batches_at_once(redis: Redis, ticks: Stream[Tick]) -> None:
    await send(ticks, range(25))
    batches: list[list[int]] = []
    with trio.fail_after(10):
        async with events_of(redis, ticks) as events:
            async for batch in events.take(10, within=0.05):
                batches.append([t.n for t in batch])
                if sum(map(len, batches)) == 25:
                    break
    # Two full batches straight from the buffer, then the rest once `within` passed.
    assert batches == [list(range(10)), list(range(10, 20)), list(range(20, 25))]


async def test_take_without_within_waits_for_a_full_batch(
    redis: Redis, ticks: Stream[Tick]
) -> None:
    await send(ticks, range(3))
    batches: list[list[int]] = []
    with trio.fail_after(10):
        async with events_of(redis, ticks, batch_size=2) as events, trio.open_nursery() as nursery:

            async def fetched() -> bool:
                return bool(cast("Any", await redis.xpending(ticks.key(0), GROUP)).pending >= 3)

            async def later() -> None:
                # Sent only once the first three were fetched.
                await wait_until(fetched, what="three events fetched", within=5, interval=0.005)
                await send(ticks, range(3, 5))

            nursery.start_soon(later)
            async for batch in events.take(5):
                batches.append([t.n for t in batch])
                break
    assert batches == [[0, 1, 2, 3, 4]]


async def test_partial_batch_after_within(redis: Redis, ticks: Stream[Tick]) -> None:
    await send(ticks, range(3))
    with trio.fail_after(10):
        async with events_of(redis, ticks) as events:
            async for batch in events.take(100, within=0.02):
                assert [t.n for t in batch] == [0, 1, 2]
                break


async def test_acknowledged_only_after_moving_past(redis: Redis, ticks: Stream[Tick]) -> None:
    ids = await send(ticks, range(5))
    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            async with events_of(redis, ticks) as events:
                async for tick in events.records():
                    if tick.n == 3:
                        # Killed while processing record 3.
                        scope.cancel()
                        await trio.sleep_forever()
    # 0..2 acknowledged (flushed on the way out); 3 and the rest still pending.
    assert await pending_ids(redis, ticks) == ids[3:]


async def test_normal_return_acknowledges_the_last_event(redis: Redis, ticks: Stream[Tick]) -> None:
    ids = await send(ticks, range(5))
    with trio.fail_after(10):
        async with events_of(redis, ticks) as events:
            async for tick in events.records():
                if tick.n == 2:
                    break
    assert await pending_ids(redis, ticks) == ids[3:]


async def test_take_batch_acknowledged_when_the_next_is_asked_for(
    redis: Redis, ticks: Stream[Tick]
) -> None:
    ids = await send(ticks, range(6))
    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            async with events_of(redis, ticks) as events:
                async for batch in events.take(3):
                    if batch[0].n == 3:
                        scope.cancel()
                        await trio.sleep_forever()
    assert await pending_ids(redis, ticks) == ids[3:]


async def test_draining_stops_after_the_current_event(redis: Redis, ticks: Stream[Tick]) -> None:
    ids = await send(ticks, range(10))
    draining = trio_util.AsyncBool(False)
    seen: list[int] = []
    with trio.fail_after(10):
        async with events_of(redis, ticks, draining=draining) as events:
            async for tick in events.records():
                seen.append(tick.n)
                if tick.n == 4:
                    draining.value = True
                    await trio.lowlevel.checkpoint()  # the watcher runs; the current event finishes
            assert events.draining
            # Stopped after event 4, which was acknowledged before stopping.
            assert await pending_ids(redis, ticks) == ids[5:]
    assert seen == [0, 1, 2, 3, 4]


async def test_draining_wakes_a_waiting_processor(redis: Redis, ticks: Stream[Tick]) -> None:
    await send(ticks, range(2))
    draining = trio_util.AsyncBool(False)
    seen: list[int] = []
    with trio.fail_after(10):
        async with events_of(redis, ticks, draining=draining) as events, trio.open_nursery() as n:
            count = trio_util.AsyncValue(0)

            async def drain_once_idle() -> None:
                await count.wait_value(2)
                draining.value = True

            n.start_soon(drain_once_idle)
            async for tick in events.records():
                seen.append(tick.n)
                count.value = len(seen)
            # The loop ended normally: both acknowledged.
            assert await pending_ids(redis, ticks) == []
    assert seen == [0, 1]


async def test_raw_events_carry_metadata(redis: Redis, ticks: Stream[Tick]) -> None:
    ids = await send(ticks, range(2))
    with trio.fail_after(10):
        async with events_of(redis, ticks) as events:
            got: list[Event[Tick]] = []
            async for event in events.raw():
                got.append(event)
                if len(got) == 2:
                    break
    assert [e.entry_id for e in got] == ids
    assert [e.record.n for e in got] == [0, 1]
    assert {(e.partition, e.delivery_count, e.stream) for e in got} == {(0, 1, "ticks")}
    assert b"data" in got[0].fields
    assert "ticks partition 0" in repr(got[0])


async def test_middleware_applied_in_order(redis: Redis, ticks: Stream[Tick]) -> None:
    ids = await send(ticks, range(6))
    log: list[str] = []

    async def only_even(events: AsyncIterator[Event[Any]]) -> AsyncIterator[Event[Any]]:
        async for event in events:
            log.append(f"filter {event.record.n}")
            if event.record.n % 2 == 0:
                yield event

    async def logging_(events: AsyncIterator[Event[Any]]) -> AsyncIterator[Event[Any]]:
        async for event in events:
            log.append(f"log {event.record.n}")
            yield event

    seen: list[int] = []
    with trio.fail_after(10):
        async with events_of(redis, ticks, middleware=[only_even, logging_]) as events:
            async for tick in events.records():
                seen.append(tick.n)
                if tick.n == 4:
                    break
    assert seen == [0, 2, 4]
    # The first middleware sees every event; the second only what the first passed.
    assert log[:6] == ["filter 0", "log 0", "filter 1", "filter 2", "log 2", "filter 3"]
    # Filtered events count as processed: only 5 (never asked for) stays pending.
    assert await pending_ids(redis, ticks) == ids[5:]


async def test_middleware_with_take_and_deadline(redis: Redis, ticks: Stream[Tick]) -> None:
    await send(ticks, range(3))

    async def passthrough(events: AsyncIterator[Event[Any]]) -> AsyncIterator[Event[Any]]:
        async for event in events:
            yield event

    with trio.fail_after(10):
        async with events_of(redis, ticks, middleware=[passthrough]) as events:
            batches = [[t.n for t in b] async for b in _first(events.take(10, within=0.02), 1)]
            await send(ticks, range(3, 5))
            batches += [[t.n for t in b] async for b in _first(events.take(10, within=0.02), 1)]
    assert batches == [[0, 1, 2], [3, 4]]


async def _first(iterator: AsyncIterator[Any], n: int) -> AsyncIterator[Any]:
    count = 0
    async for item in iterator:
        yield item
        count += 1
        if count == n:
            return


async def test_take_rejects_bad_sizes(redis: Redis, ticks: Stream[Tick]) -> None:
    async with events_of(redis, ticks) as events:
        with pytest.raises(ValueError, match="positive"):
            events.take(0)
        with pytest.raises(ValueError, match="within"):
            events.take(1, within=-1)
