"""Events' delivery bookkeeping, on a canned feed: no Redis, no fetcher.

:class:`~streamkit.Events` talks to Redis only through its
:class:`~streamkit.PartitionFeed`, so these tests drive it with
:class:`tests.canned.CannedFeed` and look at what it acknowledged, and when: ordering,
acknowledgement after moving past, batching of acknowledgements, ``done()`` for
backpressure, commit / rewind / skip, poison and undecodable entries, draining,
middleware, the lease check. The property tests at the end run random batches, random
processor failures and random exception policies through
:func:`~streamkit.run_processor` and check the delivery invariants.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Literal

import attrs
import pytest
import trio
import trio.testing
import trio_util
from hypothesis import HealthCheck, given, settings, strategies as st

from streamkit import (
    Backoff,
    DecodeError,
    ExceptionPolicy,
    HeldLease,
    Lease,
    LockLost,
    ProcessorHalted,
    open_events,
    run_processor,
)
from streamkit.lowlevel import Batch, FeedEnded
from tests.canned import KEYS, CannedFeed, batches, entry_id, number_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

    from streamkit import Event, Events, Middleware
    from tests.canned import Rec


class Boom(Exception):
    pass


def ids(numbers: Iterable[int]) -> list[bytes]:
    return [entry_id(n) for n in numbers]


def numbers(events: Iterable[Event[Any]]) -> list[int]:
    return [number_of(e.entry_id) for e in events]


class Diverted:
    """A divert hook that records what it was given."""

    def __init__(self, feed: CannedFeed | None = None) -> None:
        self.calls: list[tuple[int, str, type[BaseException] | None]] = []
        self._feed = feed
        self.acked_during: list[list[bytes]] = []

    async def __call__(self, event: Event[Any], error: BaseException | None, reason: str) -> None:
        self.calls.append(
            (number_of(event.entry_id), reason, None if error is None else type(error))
        )
        if self._feed is not None:
            self.acked_during.append(self._feed.handed_over)
        await trio.lowlevel.checkpoint()


async def consume(
    events: Events[Any],
    seen: list[int],
    *,
    fail_at: int | None = None,
    stop_at: int | None = None,
) -> None:
    """Process records into ``seen``: raise :class:`Boom` at ``fail_at``, return
    after ``stop_at``."""
    async for rec in events.records():
        seen.append(rec.n)
        if rec.n == fail_at:
            raise Boom(rec.n)
        if rec.n == stop_at:
            return


async def consume_batches(
    events: Events[Any], n: int, got: list[list[int]], *, fail: bool = False
) -> None:
    """Process the batches of ``take(n)`` into ``got``; with ``fail``, raise
    :class:`Boom` on the first."""
    async for batch in events.take(n):
        got.append([r.n for r in batch])
        if fail:
            raise Boom(batch[0].n)


async def in_events(
    feed: CannedFeed,
    opened: list[Events[Any]],
    body: Callable[[Events[Any]], Awaitable[None]],
    **options: Any,
) -> None:
    """Run ``body(events)`` in ``open_events(feed, **options)``; keep ``events`` in
    ``opened``."""
    async with open_events(feed, **options) as events:
        opened.append(events)
        await body(events)


# --- records(): order and acknowledgement ------------------------------------------


async def test_records_in_order_each_acknowledged_once_the_next_is_asked_for() -> None:
    feed = CannedFeed(batches([2, 3, 1]), then="wait")
    seen: list[int] = []
    with trio.fail_after(5):
        async with open_events(feed, ack_batch=1) as events:
            async for rec in events.records():
                seen.append(rec.n)
                # Everything before this record is acknowledged; this one is not.
                assert feed.handed_over == ids(range(1, rec.n))
                if rec.n == 6:
                    break
            assert feed.handed_over == ids(range(1, 6))
    assert seen == [1, 2, 3, 4, 5, 6]
    # Leaving the block normally: the last record counts as processed.
    assert feed.acked == ids(range(1, 7))
    assert events.acknowledged == 6


async def test_records_last_one_stays_pending_when_the_block_raises() -> None:
    feed = CannedFeed(batches([5]), then="wait")
    seen: list[int] = []
    opened: list[Events[Any]] = []
    with trio.fail_after(5), pytest.raises(Boom):
        await in_events(feed, opened, lambda events: consume(events, seen, fail_at=3))
    assert seen == [1, 2, 3]
    # 1 and 2 were moved past (flushed on the way out); 3 failed, 4 and 5 never came.
    assert feed.sent == [ids([1, 2])]
    assert opened[0].acknowledged == 2


async def test_records_last_one_stays_pending_when_cancelled() -> None:
    feed = CannedFeed(batches([5]), then="wait")
    with trio.fail_after(5):
        with trio.CancelScope() as scope:
            async with open_events(feed) as events:
                async for rec in events.records():
                    if rec.n == 3:
                        scope.cancel()
                        await trio.sleep_forever()
        assert scope.cancelled_caught
    assert feed.acked == ids([1, 2])


async def test_records_cancelled_in_the_ask_for_the_next_hands_nothing_out() -> None:
    """Cancelled while asking for the next record: the record moved past is done, the
    next one was never handed out (not in flight) and comes with the next ask."""
    feed = CannedFeed(batches([5]), then="wait")
    with trio.fail_after(5):
        async with open_events(feed) as events:
            records = events.records()
            with trio.CancelScope() as scope:
                async for rec in records:
                    if rec.n == 3:
                        scope.cancel()
            assert scope.cancelled_caught
            assert events.in_flight == ()
            assert (await anext(records)).n == 4
    assert feed.acked == ids([1, 2, 3, 4])


async def test_raw_hands_out_events_with_ids_and_delivery_counts() -> None:
    feed = CannedFeed(batches([3], deliveries={2: 4}), then="wait")
    got: list[tuple[str, int, int]] = []
    with trio.fail_after(5):
        async with open_events(feed) as events:
            async for event in events.raw():
                got.append((event.entry_id, event.delivery_count, event.record.n))
                if len(got) == 3:
                    break
    assert got == [("1-0", 1, 1), ("2-0", 4, 2), ("3-0", 1, 3)]
    assert feed.acked == ids([1, 2, 3])


# --- take() ------------------------------------------------------------------------


async def test_take_hands_out_full_batches_across_feed_batches() -> None:
    feed = CannedFeed(batches([4, 4, 4, 4, 4, 4]), then="wait")
    got: list[list[int]] = []
    with trio.fail_after(5):
        async with open_events(feed) as events:
            async for batch in events.take(10):
                got.append([r.n for r in batch])
                # The previous batch was acknowledged (handed over before the wait
                # for the feed's next batch), not this one.
                assert feed.handed_over == ids(range(1, len(got) * 10 - 9))
                assert [e.entry_id for e in events.in_flight] == [f"{r.n}-0" for r in batch]
                if len(got) == 2:
                    break
    assert got == [list(range(1, 11)), list(range(11, 21))]
    assert feed.acked == ids(range(1, 21))


async def test_take_rejects_bad_sizes() -> None:
    feed = CannedFeed(batches([1]))
    with trio.fail_after(5):
        async with open_events(feed) as events:
            with pytest.raises(ValueError, match="positive batch size"):
                events.take(0)
            with pytest.raises(ValueError, match="within"):
                events.take(2, within=-1)
        with pytest.raises(ValueError, match="ack_batch"):
            await in_events(feed, [], lambda events: consume(events, []), ack_batch=0)


async def test_take_within_yields_partial_batches_on_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    feed = CannedFeed(batches([3]), then="wait")
    got: list[tuple[float, list[int]]] = []

    async def produce() -> None:
        await trio.sleep(2)
        feed.push(*batches([2], start=4))
        await trio.sleep(0.25)
        feed.push(*batches([12], start=6))

    with trio.fail_after(60):
        async with open_events(feed) as events, trio.open_nursery() as nursery:
            start = trio.current_time()
            nursery.start_soon(produce)
            async for batch in events.take(5, within=0.5):
                got.append((trio.current_time() - start, [r.n for r in batch]))
                if len(got) == 4:
                    break
    assert got == [
        # 0.5 s after its first record arrived, with what there was.
        (0.5, [1, 2, 3]),
        # 4 and 5 arrived at 2.0; the batch filled up at 2.25, before its deadline.
        (2.25, [4, 5, 6, 7, 8]),
        (2.25, [9, 10, 11, 12, 13]),
        (2.75, [14, 15, 16, 17]),
    ]


async def test_take_without_within_waits_for_a_full_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    feed = CannedFeed(batches([3]), then="wait")
    got: list[tuple[float, list[int]]] = []

    async def produce() -> None:
        await trio.sleep(7)
        feed.push(*batches([2], start=4))

    with trio.fail_after(60):
        async with open_events(feed) as events, trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            async for batch in events.take(5):
                got.append((trio.current_time(), [r.n for r in batch]))
                break
    assert got == [(7.0, [1, 2, 3, 4, 5])]


# --- done() and acknowledgement batching -------------------------------------------


async def test_done_once_per_batch_after_its_last_event_was_handed_out() -> None:
    sent = batches([2, 3, 1])
    feed = CannedFeed(sent, then="wait")
    seen: list[int] = []
    handed_when_done: list[list[int]] = []
    feed.on_done = lambda batch: handed_when_done.append(list(seen))
    with trio.fail_after(5):
        async with open_events(feed) as events:
            async for rec in events.records():
                seen.append(rec.n)
                if rec.n == 6:
                    break
    assert [id(b) for b in feed.done_calls] == [id(b) for b in sent]
    # Done when the processor asked for the first record of the next batch (before it
    # was handed out), and the last batch when the block was left.
    assert handed_when_done == [[1, 2], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]]


async def test_done_once_per_batch_with_take() -> None:
    sent = batches([3, 3, 3, 3])
    feed = CannedFeed(sent, then="wait")
    with trio.fail_after(5):
        async with open_events(feed) as events:
            async for batch in events.take(5):
                if batch[-1].n == 10:
                    break
    # The last batch was half handed out: it is reported when the block is left.
    assert [id(b) for b in feed.done_calls] == [id(b) for b in sent]


async def test_acks_flushed_in_chunks_of_ack_batch_and_before_waiting() -> None:
    feed = CannedFeed(batches([10]), then="wait")
    chunks_at: dict[int, list[list[bytes]]] = {}

    async def process(events: Events[Rec]) -> None:
        async for rec in events.records():
            chunks_at[rec.n] = [chunk for _, chunk in feed.handovers]

    with trio.fail_after(5):
        async with open_events(feed, ack_batch=3) as events, trio.open_nursery() as nursery:
            nursery.start_soon(process, events)
            await feed.wait_waiting()
            # Before waiting for more, the 10th was handed over on its own.
            assert feed.handovers == [
                ("later", ids([1, 2, 3])),
                ("later", ids([4, 5, 6])),
                ("later", ids([7, 8, 9])),
                ("later", ids([10])),
            ]
            # ... and all of them went with the read that found nothing new.
            assert feed.acked == ids(range(1, 11))
            assert events.acknowledged == 10
            nursery.cancel_scope.cancel()
    assert chunks_at[3] == []
    assert chunks_at[4] == [ids([1, 2, 3])]
    assert chunks_at[10] == [ids([1, 2, 3]), ids([4, 5, 6]), ids([7, 8, 9])]
    # Cancelled while waiting: nothing more to send.
    assert feed.acked == ids(range(1, 11))


# --- the policy runner's API: commit, rewind, skip ---------------------------------


async def test_rewind_hands_the_in_flight_events_out_again_first_in_order() -> None:
    feed = CannedFeed(batches([8]), then="wait")
    with trio.fail_after(5):
        async with open_events(feed, ack_batch=1) as events:
            with pytest.raises(Boom):
                await consume_batches(events, 3, [], fail=True)
            assert numbers(events.in_flight) == [1, 2, 3]
            events.rewind()
            assert events.in_flight == ()
            # Again, first, one by one too.
            got: list[int] = []
            async for rec in events.records():
                got.append(rec.n)
                if rec.n == 2:
                    break
            assert got == [1, 2]
            assert feed.handed_over == ids([1])
            # Rewinding a single record, then taking a batch: 2 first, then onwards.
            events.rewind()
            async for batch in events.take(3):
                assert [r.n for r in batch] == [2, 3, 4]
                break
            assert feed.handed_over == ids([1])
            events.rewind()
            async for batch in events.take(2):
                # n=2 < len(replay)=3: the replay is handed out across batches.
                assert [r.n for r in batch] == [2, 3]
                break
            async for batch in events.take(2):
                assert [r.n for r in batch] == [4, 5]
                break
            assert feed.handed_over == ids([1, 2, 3])
    assert feed.acked == ids([1, 2, 3, 4, 5])


async def test_commit_counts_the_in_flight_events_as_processed() -> None:
    feed = CannedFeed(batches([5]), then="wait")
    with trio.fail_after(5):
        async with open_events(feed) as events:
            with pytest.raises(Boom):
                await consume_batches(events, 2, [], fail=True)
            assert numbers(events.in_flight) == [1, 2]
            events.commit()
            assert events.in_flight == ()
            # Counted, not yet acknowledged: that waits for the next flush.
            assert feed.handovers == []
            await events.flush()
            assert feed.handovers == [("now", ids([1, 2]))]
            assert feed.sent == [ids([1, 2])]
            assert events.acknowledged == 2
            events.commit()  # nothing in flight: nothing happens
            await events.flush()
            assert feed.sent == [ids([1, 2])]
            async for rec in events.records():
                assert rec.n == 3
                break
            # Leaving with an error: 3 stays pending.
            with pytest.raises(Boom):
                await consume(events, [], fail_at=4)
            assert numbers(events.in_flight) == [4]
    # The block ended normally: the in-flight 4 counts as processed.
    assert feed.acked == ids([1, 2, 3, 4])


async def test_skip_acknowledges_an_event_that_never_reached_the_processor() -> None:
    feed = CannedFeed(batches([4], deliveries={2: 9}), then="wait")
    hook = Diverted(feed)
    with trio.fail_after(5):
        async with open_events(feed, max_deliveries=3, divert=hook) as events:
            async for rec in events.records():
                if rec.n == 3:
                    break
            # 2 was diverted while 1 was pending: not acknowledged by the hook's time.
            assert hook.acked_during == [[]]
            await events.flush()
            assert feed.acked == ids([1, 2])
            assert events.acknowledged == 2
    assert feed.acked == ids([1, 2, 3])


# --- poison and undecodable entries ------------------------------------------------


@pytest.mark.parametrize("how", ["records", "take"])
async def test_poison_events_go_to_the_hook_and_are_acknowledged(how: str) -> None:
    feed = CannedFeed(batches([3, 3], deliveries={2: 5, 4: 4, 6: 3}), then="wait")
    hook = Diverted()
    seen: list[int] = []
    with trio.fail_after(5):
        async with open_events(feed, max_deliveries=3, divert=hook, ack_batch=1) as events:
            if how == "records":
                async for rec in events.records():
                    seen.append(rec.n)
                    if rec.n == 6:
                        break
            else:
                async for batch in events.take(4):
                    seen += [r.n for r in batch]
                    break
    assert hook.calls == [(2, "poison", None), (4, "poison", None)]
    assert seen == [1, 3, 5, 6]  # delivered 3 times is not more than 3
    assert sorted(feed.acked) == ids(range(1, 7))
    assert len(feed.acked) == 6


async def test_undecodable_entry_raises_without_a_hook() -> None:
    feed = CannedFeed(batches([3], undecodable=[2]), then="wait")
    seen: list[int] = []
    got: list[list[int]] = []
    with trio.fail_after(5):
        async with open_events(feed) as events:
            with pytest.raises(DecodeError) as caught:
                await consume(events, seen)
            assert caught.value.entry_id == "2-0"
            assert caught.value.stream == "s"
            # The undecodable entry is the one in flight: a policy runner decides.
            assert numbers(events.in_flight) == [2]
            events.rewind()
            with pytest.raises(DecodeError):
                await consume_batches(events, 3, got)
            # With take(), the batch gathered so far is in flight with it.
            assert numbers(events.in_flight) == [2]
    assert seen == [1]
    assert got == []


async def test_undecodable_entry_in_a_batch_puts_the_batch_in_flight() -> None:
    feed = CannedFeed(batches([4], undecodable=[3]), then="wait")
    with trio.fail_after(5):
        async with open_events(feed) as events:
            with pytest.raises(DecodeError):
                async for _ in events.take(4):
                    pass
            assert numbers(events.in_flight) == [1, 2, 3]
            events.commit()
            # 4 was put back, not lost.
            async for batch in events.take_raw(4, within=0):
                assert numbers(batch) == [4]
                break
    assert feed.acked == ids([1, 2, 3, 4])


@pytest.mark.parametrize("how", ["records", "take"])
async def test_undecodable_entry_goes_to_the_hook(how: str) -> None:
    feed = CannedFeed(batches([2, 3], undecodable=[2, 4]), then="wait")
    hook = Diverted()
    seen: list[int] = []
    with trio.fail_after(5):
        async with open_events(feed, divert=hook) as events:
            if how == "records":
                async for rec in events.records():
                    seen.append(rec.n)
                    if rec.n == 5:
                        break
            else:
                async for batch in events.take(3):
                    seen += [r.n for r in batch]
                    break
    assert hook.calls == [(2, "undecodable", DecodeError), (4, "undecodable", DecodeError)]
    assert seen == [1, 3, 5]
    assert sorted(feed.acked) == ids(range(1, 6))


async def test_raw_hands_out_undecodable_entries_and_decodes_lazily() -> None:
    feed = CannedFeed(batches([2], undecodable=[1]), then="wait")
    hook = Diverted()
    with trio.fail_after(5):
        async with open_events(feed, divert=hook) as events:
            async for event in events.raw():
                assert event.fields == {b"data": b"not json"}
                with pytest.raises(DecodeError):
                    _ = event.record
                break
    assert hook.calls == []


async def test_a_hook_that_raises_ends_the_iteration() -> None:
    feed = CannedFeed(batches([3], deliveries={2: 9}), then="wait")

    async def refuse(event: Event[Any], error: BaseException | None, reason: str) -> None:
        raise Boom(reason)

    seen: list[int] = []
    with trio.fail_after(5):
        async with open_events(feed, max_deliveries=1, divert=refuse) as events:
            with pytest.raises(Boom, match="poison"):
                await consume(events, seen)
            assert events.failure is None  # the hook's error is no machinery failure
    assert seen == [1]
    assert feed.acked == ids([1])


@pytest.mark.parametrize(
    ("how", "kind"),
    [
        ("take", "poison"),
        ("take", "undecodable"),
        ("records", "poison"),
        ("records", "undecodable"),
    ],
)
async def test_a_long_run_of_diverted_events_does_not_recurse(how: str, kind: str) -> None:
    # A regression test: take() used to recurse once per batch of diverted events.
    count = 5_000
    sizes = [100] * (count // 100)
    if kind == "poison":
        sent = batches(sizes, deliveries=dict.fromkeys(range(1, count + 1), 7))
    else:
        sent = batches(sizes, undecodable=range(1, count + 1))
    sent += batches([3, 7], start=count + 1)
    feed = CannedFeed(sent, then="wait")
    hook = Diverted()
    seen: list[int] = []
    with trio.fail_after(30):
        async with open_events(feed, max_deliveries=3, divert=hook) as events:
            if how == "take":
                async for batch in events.take(10):
                    seen += [r.n for r in batch]
                    break
            else:
                async for rec in events.records():
                    seen.append(rec.n)
                    if rec.n == count + 10:
                        break
    assert seen == list(range(count + 1, count + 11))
    assert [n for n, _, _ in hook.calls] == list(range(1, count + 1))
    assert sorted(feed.acked, key=number_of) == ids(range(1, count + 11))


async def test_take_of_only_diverted_events_in_one_feed_batch() -> None:
    count = 5_000
    feed = CannedFeed(
        batches([count + 2], deliveries=dict.fromkeys(range(1, count + 1), 7)), then="wait"
    )
    hook = Diverted()
    with trio.fail_after(30):
        async with open_events(feed, max_deliveries=3, divert=hook, ack_batch=64) as events:
            async for batch in events.take(2):
                assert [r.n for r in batch] == [count + 1, count + 2]
                break
    assert len(hook.calls) == count
    assert len(feed.acked) == count + 2
    # Handed over in chunks while diverting, not all at the end.
    assert max(len(chunk) for _, chunk in feed.handovers) == 64


# --- draining ----------------------------------------------------------------------


async def test_draining_stops_the_iterator_after_the_current_event() -> None:
    feed = CannedFeed(batches([10]), then="wait")
    draining = trio_util.AsyncBool(False)
    seen: list[int] = []
    with trio.fail_after(5):
        async with open_events(feed, draining=draining) as events:
            async for rec in events.records():
                seen.append(rec.n)
                if rec.n == 3:
                    draining.value = True
            # Stopped with 3 acknowledged, before the block ends.
            assert feed.acked == ids([1, 2, 3])
            assert events.draining
            # Every later iterator stops at once.
            async for _ in events.take(5):
                pytest.fail("handed out while draining")
    assert seen == [1, 2, 3]
    assert feed.acked == ids([1, 2, 3])


async def test_draining_wakes_an_iterator_waiting_for_events() -> None:
    feed = CannedFeed(batches([2]), then="wait")
    draining = trio_util.AsyncBool(False)
    seen: list[int] = []
    with trio.fail_after(5):
        async with open_events(feed, draining=draining) as events, trio.open_nursery() as nursery:
            nursery.start_soon(consume, events, seen)
            await feed.wait_waiting()
            draining.value = True
    assert seen == [1, 2]
    assert feed.acked == ids([1, 2])


async def test_draining_yields_the_partial_batch_of_take_then_stops() -> None:
    feed = CannedFeed(batches([3]), then="wait")
    draining = trio_util.AsyncBool(False)
    got: list[list[int]] = []
    with trio.fail_after(5):
        async with open_events(feed, draining=draining) as events, trio.open_nursery() as nursery:
            nursery.start_soon(consume_batches, events, 10, got)
            await feed.wait_waiting()
            assert got == []
            draining.value = True
    assert got == [[1, 2, 3]]
    assert feed.acked == ids([1, 2, 3])


# --- middleware --------------------------------------------------------------------


def keep_odd(events: AsyncIterator[Event[Any]]) -> AsyncIterator[Event[Any]]:
    async def odd() -> AsyncIterator[Event[Any]]:
        async for event in events:
            if number_of(event.entry_id) % 2:
                yield event

    return odd()


async def test_filtered_events_are_acknowledged_once_a_later_event_is_moved_past() -> None:
    feed = CannedFeed(batches([3, 4]), then="wait")
    acked_at: dict[int, list[bytes]] = {}
    with trio.fail_after(5):
        async with open_events(feed, middleware=[keep_odd], ack_batch=1) as events:
            async for rec in events.records():
                acked_at[rec.n] = feed.handed_over
                if rec.n == 7:
                    break
    # 2 was dropped: acknowledged together with 3, once 3 was moved past.
    assert acked_at == {1: [], 3: ids([1]), 5: ids([1, 2, 3]), 7: ids([1, 2, 3, 4, 5])}
    assert feed.acked == ids(range(1, 8))


async def test_rewind_with_middleware_acknowledges_the_dropped_events_before() -> None:
    feed = CannedFeed(batches([6]), then="wait")
    seen: list[int] = []
    with trio.fail_after(5):
        async with open_events(feed, middleware=[keep_odd], ack_batch=1) as events:
            with pytest.raises(Boom):
                await consume(events, seen, fail_at=3)
            events.rewind()
            await events.flush()
            # 2 was dropped before the rewound 3: done.
            assert feed.acked == ids([1, 2])
            await consume(events, seen, stop_at=5)
    assert seen == [1, 3, 3, 5]
    assert feed.acked == ids([1, 2, 3, 4, 5])


def failing_once(at: int, *, lookahead: int = 0) -> tuple[Middleware, list[list[int]]]:
    """A middleware that, the first time only, takes ``at`` (and ``lookahead`` more)
    and raises; it records what each of its runs was given."""
    runs: list[list[int]] = []

    def middleware(events: AsyncIterator[Event[Any]]) -> AsyncIterator[Event[Any]]:
        given: list[int] = []
        runs.append(given)

        async def chain() -> AsyncIterator[Event[Any]]:
            async for event in events:
                n = number_of(event.entry_id)
                given.append(n)
                if len(runs) == 1 and n == at:
                    given.extend(
                        [number_of((await anext(events)).entry_id) for _ in range(lookahead)]
                    )
                    raise Boom(f"middleware failed at {n}")
                yield event

        return chain()

    return middleware, runs


@pytest.mark.parametrize("lookahead", [0, 2])
async def test_a_middleware_error_reaches_the_processor_and_its_events_come_again(
    lookahead: int,
) -> None:
    middleware, runs = failing_once(3, lookahead=lookahead)
    feed = CannedFeed(batches([2, 2, 2]), then="wait")
    seen: list[int] = []
    with trio.fail_after(5):
        async with open_events(feed, middleware=[middleware]) as events:
            with pytest.raises(Boom, match="middleware failed at 3"):
                await consume(events, seen)
            # 2 was moved past when the processor asked for the next record.
            assert events.in_flight == ()
            assert events.failure is None
            await consume(events, seen, stop_at=6)
    assert seen == [1, 2, 3, 4, 5, 6]
    assert runs[0] == [1, 2, 3, 4, 5][: 3 + lookahead]
    assert runs[1][:3] == [3, 4, 5]
    assert feed.acked == ids(range(1, 7))


async def test_a_middleware_error_during_take_hands_the_gathered_events_out_again() -> None:
    middleware, _ = failing_once(3)
    feed = CannedFeed(batches([6]), then="wait")
    got: list[list[int]] = []
    with trio.fail_after(5):
        async with open_events(feed, middleware=[middleware]) as events:
            with pytest.raises(Boom):
                await consume_batches(events, 4, got)
            assert events.in_flight == ()
            async for batch in events.take(4):
                got.append([r.n for r in batch])
                break
    assert got == [[1, 2, 3, 4]]
    assert feed.acked == ids([1, 2, 3, 4])


def passing(events: AsyncIterator[Event[Any]]) -> AsyncIterator[Event[Any]]:
    async def chain() -> AsyncIterator[Event[Any]]:
        async for event in events:
            yield event

    return chain()


@pytest.mark.parametrize(
    "middleware",
    [
        pytest.param([], id="no middleware"),
        pytest.param(
            [passing],
            id="middleware",
        ),
    ],
)
async def test_acks_are_handed_over_before_an_idle_wait(
    middleware: list[Middleware], autojump_clock: trio.testing.MockClock
) -> None:
    feed = CannedFeed(batches([3]), then="wait")
    seen: list[int] = []
    with trio.fail_after(60):
        async with (
            open_events(feed, middleware=middleware) as events,
            trio.open_nursery() as nursery,
        ):

            async def process() -> None:
                async for rec in events.records():
                    seen.append(rec.n)
                    await trio.sleep(1)  # processing takes a while

            nursery.start_soon(process)
            await trio.sleep(10)
            assert seen == [1, 2, 3]
            # The partition has been idle since 3.0: everything processed by then
            # is on its way to Redis.
            assert feed.handed_over == ids([1, 2, 3])
            nursery.cancel_scope.cancel()


def recording(name: str, ran: list[tuple[str, bool]]) -> Middleware:
    """A middleware that records, in its ``finally``, that it ran and whether it ran
    in a task of the test's own (not, say, in a Trio system task, later)."""
    test_task = trio.lowlevel.current_task()

    def ours() -> bool:
        task: trio.lowlevel.Task | None = trio.lowlevel.current_task()
        while task is not None and task is not test_task:
            task = task.parent_nursery.parent_task if task.parent_nursery else None
        return task is test_task

    def middleware(events: AsyncIterator[Event[Any]]) -> AsyncIterator[Event[Any]]:
        async def chain() -> AsyncIterator[Event[Any]]:
            try:
                async for event in events:
                    yield event
            finally:
                ran.append((name, ours()))

        return chain()

    return middleware


@pytest.mark.parametrize("how", ["normally", "raising", "buffer empty"])
async def test_nothing_of_a_middleware_outlives_the_block(how: str) -> None:
    ran: list[tuple[str, bool]] = []
    feed = CannedFeed(batches([2 if how == "buffer empty" else 10]), then="wait")
    draining = trio_util.AsyncBool(False)
    before = trio.lowlevel.current_statistics().tasks_living
    with trio.fail_after(5):
        try:
            async with open_events(
                feed, middleware=[recording("m", ran)], draining=draining
            ) as events:
                if how == "buffer empty":
                    async with trio.open_nursery() as nursery:

                        async def process() -> None:
                            async for _ in events.records():
                                pass

                        nursery.start_soon(process)
                        await feed.wait_waiting()
                        nursery.cancel_scope.cancel()
                else:
                    async for rec in events.records():
                        if rec.n == 2:
                            if how == "raising":
                                raise Boom
                            break
        except Boom:
            pass
        # Checked at once: closed by the block's own tasks, no task left behind.
        assert ran == [("m", True)]
        assert trio.lowlevel.current_statistics().tasks_living == before


async def test_nothing_of_stacked_middleware_outlives_the_block() -> None:
    ran: list[tuple[str, bool]] = []
    feed = CannedFeed(batches([10]), then="wait")
    with trio.fail_after(5):
        async with open_events(
            feed, middleware=[recording("inner", ran), recording("outer", ran)]
        ) as events:
            async for rec in events.records():
                if rec.n == 2:
                    break
        assert sorted(ran) == [("inner", True), ("outer", True)]


# --- the lease -----------------------------------------------------------------------


async def test_a_lost_lease_stops_the_iterators() -> None:
    feed = CannedFeed(batches([5]), then="wait")
    seen: list[int] = []
    opened: list[Events[Any]] = []

    async def process(events: Events[Any]) -> None:
        async for rec in events.records():
            seen.append(rec.n)
            if rec.n == 2:
                feed.lose_lease("taken over")

    with trio.fail_after(5), pytest.raises(LockLost, match="taken over") as caught:
        await in_events(feed, opened, process)
    assert seen == [1, 2]
    assert opened[0].failure is caught.value
    # Nothing acknowledged: the lease is gone (and the feed would refuse anyway).
    assert feed.sent == []


async def test_a_lost_lease_stops_take() -> None:
    feed = CannedFeed(batches([5]), then="wait")
    with trio.fail_after(5):
        async with open_events(feed) as events:
            async for _ in events.take(2):
                break
            feed.lose_lease()
            got: list[list[int]] = []
            with pytest.raises(LockLost):
                await consume_batches(events, 2, got)
            assert isinstance(events.failure, LockLost)
            seen: list[int] = []
            with pytest.raises(LockLost):
                await consume(events, seen)
            assert got == []
            assert seen == []
        # The block ended normally, but acknowledging needs the lease: nothing is.
    assert feed.sent == []


async def test_a_lease_past_its_local_deadline_stops_the_iterators(
    autojump_clock: trio.testing.MockClock,
) -> None:
    name = KEYS.lock_name(0)
    lease = Lease(name=name, key=name, owner="o", token=1, ttl=1.0, valid_until=10.0)
    feed = CannedFeed(batches([5]), then="wait", held=HeldLease(lease))
    seen: list[float] = []
    opened: list[Events[Any]] = []

    async def process(events: Events[Any]) -> None:
        async for _ in events.records():
            seen.append(trio.current_time())
            await trio.sleep(4)

    with trio.fail_after(60), pytest.raises(LockLost, match="ran out") as caught:
        await in_events(feed, opened, process)
    # Handed out at 0, 4 and 8; at 12 the lease (valid until 10 minus a drift
    # allowance) had run out unnoticed.
    assert seen == [0.0, 4.0, 8.0]
    assert opened[0].failure is caught.value


async def test_a_refused_acknowledgement_stops_the_iterators() -> None:
    # ack_later() never raises: the refusal stops the feed, and the iterators raise
    # the feed's failure before handing out another event, even one already
    # buffered: the lease is no longer ours, a new owner may be processing it.
    feed = CannedFeed(batches([3, 2]), then="wait")
    feed.fail_acks = True
    seen: list[int] = []
    opened: list[Events[Any]] = []
    with trio.fail_after(5), pytest.raises(LockLost) as caught:
        await in_events(feed, opened, lambda events: consume(events, seen), ack_batch=1)
    assert feed.failure is caught.value
    # (Leaving the block tried once more, and recorded that refusal too.)
    assert isinstance(opened[0].failure, LockLost)
    assert seen == [1]
    assert feed.handovers == []
    assert feed.sent == []


async def test_a_refused_acknowledgement_when_leaving_normally_is_raised() -> None:
    feed = CannedFeed(batches([5]), then="wait")

    async def process(events: Events[Any]) -> None:
        await consume(events, [], stop_at=2)
        feed.fail_acks = True

    with trio.fail_after(5), pytest.raises(LockLost):
        await in_events(feed, [], process)
    assert feed.sent == []


async def test_a_refused_acknowledgement_keeps_the_ids_for_later() -> None:
    feed = CannedFeed(batches([5]), then="wait")
    with trio.fail_after(5):
        async with open_events(feed) as events:
            async for rec in events.records():
                if rec.n == 3:
                    break
            events.commit()
            feed.fail_acks = True
            with pytest.raises(LockLost):
                await events.flush()
            feed.fail_acks = False
            await events.flush()
    assert feed.sent == [ids([1, 2, 3])]
    assert events.acknowledged == 3


async def test_run_processor_lets_a_refused_acknowledgement_through() -> None:
    feed = CannedFeed(batches([5]), then="wait")
    calls = 0

    async def process(events: Events[Rec]) -> None:
        nonlocal calls
        calls += 1
        async for rec in events.records():
            if rec.n == 2:
                feed.fail_acks = True

    policy = ExceptionPolicy(action="retry", on_exhausted="ignore")
    with trio.fail_after(5), pytest.raises(LockLost):
        await run_processor(process, feed, policy, ack_batch=1)
    assert calls == 1
    assert feed.handed_over == ids([1])
    assert feed.sent == []


# --- run_processor on a canned feed ------------------------------------------------


async def test_run_processor_retries_in_place_with_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    feed = CannedFeed(batches([4]), then="wait")
    handed: list[tuple[float, int]] = []

    async def process(events: Events[Rec]) -> None:
        async for rec in events.records():
            handed.append((trio.current_time(), rec.n))
            if rec.n == 2 and len(handed) < 4:
                raise Boom
            if rec.n == 4:
                return

    policy = ExceptionPolicy(
        action="retry",
        retries=3,
        backoff=Backoff(initial=0.25, maximum=10, jitter=0),
        on_exhausted="halt",
    )
    with trio.fail_after(60):
        await run_processor(process, feed, policy)
    assert handed == [(0.0, 1), (0.0, 2), (0.25, 2), (0.75, 2), (0.75, 3), (0.75, 4)]
    assert feed.acked == ids([1, 2, 3, 4])


async def test_run_processor_without_redis_halts_on_an_undecodable_entry() -> None:
    # The default dead-letters undecodable entries; with no Redis client to write
    # the dead letter, it halts rather than drop the entry.
    feed = CannedFeed(batches([3], undecodable=[2]), then="wait")
    seen: list[int] = []
    with trio.fail_after(5), pytest.raises(ProcessorHalted) as caught:
        await run_processor(lambda events: consume(events, seen), feed, ExceptionPolicy())
    assert caught.value.entry_ids == ("2-0",)
    assert seen == [1]
    assert feed.acked == ids([1])


async def test_a_diverted_event_does_not_reset_the_retries_of_another(
    autojump_clock: trio.testing.MockClock,
) -> None:
    feed = CannedFeed(batches([1]), then="wait")
    handed: list[tuple[float, list[int]]] = []

    async def process(events: Events[Rec]) -> None:
        async for batch in events.take(2, within=0.5):
            handed.append((trio.current_time(), [r.n for r in batch]))
            if batch[0].n == 1:
                raise Boom  # 1 always fails
            return

    async def produce() -> None:
        await trio.sleep(1)  # during the backoff before the retry of 1
        feed.push(*batches([1], start=2, deliveries={2: 9}))
        await trio.sleep(9)
        feed.push(*batches([1], start=3))

    policy = ExceptionPolicy(
        action="retry",
        retries=1,
        backoff=Backoff(initial=1, maximum=1, jitter=0),
        on_exhausted="ignore",
        max_deliveries=3,
        on_poison="ignore",
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            await run_processor(process, feed, policy)
    # 1 fails at 0.5, is retried once at 1.5 (the poison 2 is diverted meanwhile),
    # fails again at 2.0 and is ignored: one retry, as configured.
    assert handed == [(0.5, [1]), (2.0, [1]), (10.5, [3])]
    assert feed.acked == ids([2, 1, 3])


# --- properties --------------------------------------------------------------------


@attrs.frozen
class Scenario:
    sizes: list[int]
    deliveries: dict[int, int]
    undecodable: frozenset[int]
    failures: dict[int, int]  # record number -> attempts that fail before one succeeds
    mode: Literal["records", "raw", "take"]
    take_n: int
    action: Literal["retry", "ignore", "halt"]
    retries: int
    max_deliveries: int | None
    ack_batch: int
    middleware: Literal["none", "pass", "filter"]
    dropped: frozenset[int]  # with the filtering middleware
    refuse_ack: int | None  # the ack call (1-based) at which the lease is lost

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def poison(self, n: int) -> bool:
        return self.max_deliveries is not None and self.deliveries.get(n, 1) > self.max_deliveries

    def diverted(self, n: int) -> bool:
        """Whether ``n`` must never reach the processor."""
        return self.poison(n) or (self.mode != "raw" and n in self.undecodable)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    sizes = draw(st.lists(st.integers(0, 6), max_size=7))
    numbers = st.integers(1, max(1, sum(sizes)))
    middleware: Literal["none", "pass", "filter"] = draw(
        st.sampled_from(["none", "pass", "filter"])
    )
    return Scenario(
        sizes=sizes,
        deliveries=draw(st.dictionaries(numbers, st.integers(2, 5), max_size=6)),
        undecodable=draw(st.frozensets(numbers, max_size=4)),
        failures=draw(st.dictionaries(numbers, st.integers(1, 4), max_size=8)),
        mode=draw(st.sampled_from(["records", "raw", "take"])),
        take_n=draw(st.integers(1, 4)),
        action=draw(st.sampled_from(["retry", "retry", "ignore", "halt"])),
        retries=draw(st.integers(0, 3)),
        max_deliveries=draw(st.sampled_from([None, 1, 2, 3])),
        ack_batch=draw(st.sampled_from([1, 2, 3, 500])),
        middleware=middleware,
        dropped=draw(st.frozensets(numbers, max_size=6)) if middleware == "filter" else frozenset(),
        refuse_ack=draw(st.none() | st.integers(1, 6)),
    )


#: How long (on the mock clock) the feed serves before it ends: far beyond the
#: backoff delays and the `within` deadlines of a scenario.
FEED_ENDS_AT = 100_000.0


@attrs.define
class Run:
    """What happened in one scenario, in order."""

    log: list[tuple[str, list[int]]] = attrs.Factory(list)
    outcome: BaseException | None = None
    done: list[int] = attrs.Factory(list)
    sent: list[int] = attrs.Factory(list)  # the ids that reached "Redis"
    lease_lost: bool = False


async def run_scenario(scenario: Scenario) -> Run:
    run = Run()
    log = run.log
    feed = CannedFeed(
        batches(scenario.sizes, deliveries=scenario.deliveries, undecodable=scenario.undecodable),
        then="wait",
    )
    feed.lose_lease_at = scenario.refuse_ack
    feed.on_handover = lambda acked: log.append(("ack", [number_of(i) for i in acked]))
    feed.on_done = lambda batch: run.done.append(id(batch))
    attempts: collections.Counter[int] = collections.Counter()

    async def step(handed: list[int], records: list[Rec] | None) -> None:
        log.append(("handed", handed))
        try:
            if records is not None:
                assert [r.n for r in records] == handed
            for n in handed:
                attempts[n] += 1
                if attempts[n] <= scenario.failures.get(n, 0):
                    raise Boom(n)
            await trio.lowlevel.checkpoint()
        except BaseException:
            log.append(("failed", handed))
            raise
        log.append(("ok", handed))

    async def process(events: Events[Rec]) -> None:
        if scenario.mode == "records":
            async for rec in events.records():
                await step([rec.n], [rec])
        elif scenario.mode == "raw":
            async for event in events.raw():
                n = number_of(event.entry_id)
                try:
                    record = event.record
                except DecodeError:
                    log.append(("handed", [n]))
                    log.append(("failed", [n]))
                    raise
                await step([n], [record])
        else:
            async for batch in events.take(scenario.take_n, within=1.0):
                await step([r.n for r in batch], batch)

    def drop(events: AsyncIterator[Event[Any]]) -> AsyncIterator[Event[Any]]:
        async def chain() -> AsyncIterator[Event[Any]]:
            async for event in events:
                if number_of(event.entry_id) not in scenario.dropped:
                    yield event

        return chain()

    policy = ExceptionPolicy(
        action=scenario.action,
        retries=scenario.retries,
        backoff=Backoff(initial=0.001, maximum=0.001, jitter=0),
        on_exhausted="ignore",
        max_deliveries=scenario.max_deliveries,
        # No Redis here: events that never reach the processor are ignored, or halt
        # the partition with "halt".
        on_undecodable="halt" if scenario.action == "halt" else "ignore",
        on_poison="halt" if scenario.action == "halt" else "ignore",
    )

    async def end_feed() -> None:
        await trio.sleep(FEED_ENDS_AT)
        feed.end()

    with trio.fail_after(FEED_ENDS_AT * 2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(end_feed)
            try:
                await run_processor(
                    process,
                    feed,
                    policy,
                    ack_batch=scenario.ack_batch,
                    middleware=[] if scenario.middleware == "none" else [drop],
                )
            except (FeedEnded, LockLost, ProcessorHalted) as exc:
                run.outcome = exc
            nursery.cancel_scope.cancel()
    run.sent = [number_of(i) for i in feed.acked]
    run.lease_lost = feed.held.lost_reason is not None
    return run


def check_invariants(scenario: Scenario, run: Run) -> None:
    everything = range(1, scenario.total + 1)
    acked = [n for kind, ns in run.log if kind == "ack" for n in ns]
    handed = [ns for kind, ns in run.log if kind == "handed"]
    if scenario.refuse_ack is None and scenario.action != "halt":
        assert isinstance(run.outcome, FeedEnded), run.outcome
    failed_any = any(kind == "failed" for kind, _ in run.log)
    if isinstance(run.outcome, ProcessorHalted):
        assert scenario.action == "halt"
        assert failed_any or any(
            n in scenario.undecodable or scenario.poison(n) for n in everything
        )

    # (a) Every entry is acknowledged exactly once overall (at most once when the run
    # stopped early; a dropped entry only once a later entry was moved past).
    assert len(acked) == len(set(acked)), acked
    assert set(acked) <= set(everything)
    assert len(run.sent) == len(set(run.sent))
    assert set(run.sent) <= set(acked)
    if isinstance(run.outcome, FeedEnded) and not run.lease_lost:
        assert set(acked) >= set(everything) - scenario.dropped
        assert sorted(run.sent) == sorted(acked)

    # (b) An entry is acknowledged only after the processor moved past it, and is
    # never handed out again afterwards.
    state: dict[int, str] = {}
    for kind, ns in run.log:
        if kind == "handed":
            for n in ns:
                state[n] = "processing"
        elif kind in ("ok", "failed"):
            for n in ns:
                assert state[n] == "processing"
                state[n] = "finished"
        else:
            for n in ns:
                if scenario.diverted(n):
                    assert n not in state
                elif n in scenario.dropped:
                    assert any(m > n and s == "finished" for m, s in state.items()), (n, state)
                else:
                    assert state.get(n) == "finished", (n, state)
    acked_so_far: set[int] = set()
    for kind, ns in run.log:
        if kind == "ack":
            acked_so_far.update(ns)
        elif kind == "handed":
            assert not acked_so_far & set(ns), ("handed out again after its ack", ns)

    # (c) In order: within a hand-out, and across them, except that the events in
    # flight when the processor failed may come again, first and in order.
    highest = 0
    last_failed: list[int] = []
    for kind, ns in run.log:
        if kind == "handed":
            assert ns, ns
            assert ns == sorted(set(ns)), ns
            again = [n for n in ns if n <= highest]
            assert again == ns[: len(again)], ns
            assert again in ([], last_failed), (ns, last_failed)
            highest = max(highest, *ns)
            last_failed = []
        elif kind == "failed":
            last_failed = ns

    # (d) Poison and undecodable entries never reach the processor; dropped ones
    # neither.
    for ns in handed:
        for n in ns:
            assert not scenario.diverted(n), n
            assert n not in scenario.dropped, n

    # Retries in place: records and raw() hand an entry out once, plus once per retry.
    # (Not checked when an event was diverted: a diversion resets the retry count of
    # the failing event, see test_a_diverted_event_does_not_reset_the_retries_of_another.)
    diversions = any(scenario.diverted(n) for n in everything)
    if scenario.mode != "take" and isinstance(run.outcome, FeedEnded) and not diversions:
        times = collections.Counter(n for ns in handed for n in ns)
        for n in everything:
            if scenario.diverted(n) or n in scenario.dropped:
                continue
            fails = 1 if n in scenario.undecodable else scenario.failures.get(n, 0)
            retried = scenario.action == "retry" and n not in scenario.undecodable
            expected = 1 + min(fails, scenario.retries) if retried else 1
            assert times[n] == expected, (n, times[n], expected)

    # done() once per batch, in order.
    assert len(run.done) == len(set(run.done))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_delivery_invariants(scenario: Scenario) -> None:
    run = trio.run(run_scenario, scenario, clock=trio.testing.MockClock(autojump_threshold=0))
    check_invariants(scenario, run)


# --- the fetcher's flat batches ----------------------------------------------------


def flat(batch: Batch) -> Batch:
    """``batch`` laid out as the fetcher's read script returns it (Batch.from_flat)."""
    widths = [len(f) for f in batch.fields]
    laid = [item for fields in batch.fields for item in fields]
    same = len(set(widths)) == 1
    return Batch.from_flat(batch.ids, laid, widths[0] if same else widths, batch.deliveries)


@pytest.mark.parametrize("layout", ["per entry", "flat"])
async def test_flat_batches_hand_out_and_acknowledge_as_per_entry_ones(layout: str) -> None:
    """records(), take() and raw(), a rewind, a redelivered (poison) entry and an
    undecodable one, on batches as the fetcher lays them out: the same records, events
    and acknowledgements as with one field list per entry."""
    canned = batches([4, 6, 5], deliveries={7: 9}, undecodable=[12])
    if layout == "flat":
        canned = [flat(b) for b in canned]
        assert canned[1].entry_fields(0) == batches([4, 6])[1].fields[0]
    feed = CannedFeed(canned, then="wait")
    diverted = Diverted()
    seen: list[object] = []
    with trio.fail_after(5):
        async with open_events(feed, ack_batch=1, max_deliveries=3, divert=diverted) as events:
            async for rec in events.records():
                seen.append(rec.n)
                if rec.n == 2:
                    break
            assert numbers(events.in_flight) == [2]
            events.rewind()
            async for batch in events.take(3):
                seen.append([r.n for r in batch])
                if batch[-1].n >= 8:
                    break
            async for event in events.raw():
                seen.append((number_of(event.entry_id), event.delivery_count, event.fields))
                if number_of(event.entry_id) == 11:
                    break
            async for rec in events.records():
                seen.append(rec.n)
                if rec.n == 15:
                    break
    fields = {n: fields_of(n) for n in (9, 10, 11)}
    assert seen == [
        1,
        2,
        [2, 3, 4],
        [5, 6, 8],
        (9, 1, fields[9]),
        (10, 1, fields[10]),
        (11, 1, fields[11]),
        13,
        14,
        15,
    ]
    assert diverted.calls == [(7, "poison", None), (12, "undecodable", DecodeError)]
    # Diverted entries are done when diverted, before the batch gathered around them.
    assert feed.acked == ids([1, 2, 3, 4, 7, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15])


def fields_of(n: int) -> dict[bytes, bytes]:
    """The fields of record number ``n`` as ``Event.fields`` gives them."""
    flat_fields = batches([1], start=n)[0].fields[0]
    return dict(zip(flat_fields[::2], flat_fields[1::2], strict=True))


def test_a_flat_batch_builds_its_entries_field_lists_on_demand() -> None:
    batch = Batch.from_flat([b"1-0", b"2-0"], [b"a", b"1", b"b", b"2", b"c", b"3"], [2, 4])
    assert batch.entry_fields(1) == [b"b", b"2", b"c", b"3"]
    assert batch.fields == [[b"a", b"1"], [b"b", b"2", b"c", b"3"]]
    assert batch.payloads() is None
    uniform = Batch.from_flat([b"1-0", b"2-0"], [b"data", b"x", b"data", b"y"], 2)
    assert uniform.payloads() == [b"x", b"y"]
    assert uniform.entry_fields(1) == [b"data", b"y"]
    assert Batch([b"1-0"], [[b"data", b"z"]]).payloads() == [b"z"]
    assert Batch([b"1-0"], [[b"other", b"z"]]).payloads() is None


async def test_entries_hand_out_spans_as_stored_and_fall_back_for_poison_and_replays() -> None:
    """The join's entry batches (``Events._entries``): clean buffers as spans (ids and
    fields, no event objects), whatever is buffered up to ``n``; a buffer with poison
    screened event by event (its poison to the hook); rewound events again first;
    each entry acknowledged once, after it was moved past."""
    feed = CannedFeed(batches([3, 4, 2], deliveries={5: 9}), then="wait")
    hook = Diverted()
    got: list[list[int]] = []
    with trio.fail_after(5):
        async with open_events(feed, max_deliveries=3, divert=hook, ack_batch=1) as events:
            entries = events._entries(2)
            async for span in entries:
                entry_ids, fields = span.ids, span.fields
                assert len(fields) == len(entry_ids)
                assert all(fields)
                assert span.values_of(b"data") == [f[1] for f in fields]
                assert span.values_of(b"other") is None
                got.append([number_of(i.decode()) for i in entry_ids])
                if len(got) == 1:
                    assert events._decode_entry(fields[0], entry_ids[0]).n == 1
                    events.rewind()  # 1 and 2 again, first
                if got[-1][-1] == 9:
                    break
    # (The fallback gathers across feed batches, as take() does: 7 and 8.)
    assert got == [[1, 2], [1, 2], [3], [4, 6], [7, 8], [9]]
    assert hook.calls == [(5, "poison", None)]
    assert sorted(feed.acked) == ids(range(1, 10))
    assert len(feed.acked) == 9
