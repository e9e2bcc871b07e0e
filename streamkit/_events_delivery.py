"""Delivery: the machinery behind one partition's :class:`~streamkit.Events`.

A :class:`Delivery` takes batches from the partition's feed into its
:class:`~streamkit._events_ledger.Ledger`, screens poison and undecodable events,
refuses to hand anything out once the lease is gone, notices draining, and hands what
is done to the feed: with the partition's next read (:meth:`Delivery.commit_soon`) or
at once (:meth:`Delivery.commit_now`). Those two verbs are the partition's commit
point. The iterators of :mod:`streamkit._events_iterators` and the middleware pump
drive it through the verbs below; :class:`~streamkit.Events` is its public face.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
import time
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attrs
import trio

from ._errors import ConfigError, LockLost, StreamkitError
from ._event import UNDECODED, Event
from ._events_ledger import Ledger
from ._locks import local_deadline
from ._meter import TIMING
from ._tracing import processor_spans
from ._validate import positive_int

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import trio_util

    from ._event import Decoder, DivertHook, Middleware
    from ._feed import Batch, PartitionFeed
    from ._meter import PartitionMeter
    from ._state import PartitionState
    from ._tracing import ProcessorSpans

    BatchDecoder = Callable[[list[Any]], tuple[list[Any], int]]

__all__ = ["Delivery", "Stop"]

R = TypeVar("R")

log = logging.getLogger("streamkit.events")

#: Acknowledgements are flushed once this many accumulate (and before every wait).
DEFAULT_ACK_BATCH = 500


class Pump(Protocol):
    """The middleware chain's end, as the delivery pulls from it."""

    async def next(self, deadline: float) -> Event[Any] | None:
        """The next event the chain yields; ``None`` once ``deadline`` passed.

        Raises:
            Stop: the chain ended, or draining began.
        """
        ...

    def stop(self) -> None:
        """Stop the chain's task."""
        ...


class Stop(Exception):
    """The iterators are to stop (draining began, or the middleware chain ended)."""


def _no_limit(max_deliveries: int | None) -> int:
    return sys.maxsize if max_deliveries is None else max_deliveries


def _stages(middleware: Sequence[Middleware]) -> tuple[Middleware, ...]:
    return tuple(middleware)


@attrs.define(eq=False)
class Delivery(Generic[R]):
    """Hands one partition's events out in order and commits what is done.

    Its state is private: the iterators, the middleware pump and
    :class:`~streamkit.Events` drive it through its verbs.

    Attributes:
        feed: the partition's feed.
        drain_source: what tells that the partition is being moved away, if anything
            (``draining=`` to the constructor).
        ack_batch: hand the done events over once this many accumulate.
        max_deliveries: events delivered more often than this are poison (``None`` to
            the constructor: no limit).
        divert: the hook poison and undecodable events go to, if any.
        middleware: the middleware chain's stages, outermost last.
        state: the processor's tables and outputs of the partition, if it keeps state.
        ledger: the bookkeeping of buffered, in-flight, replayed and done events.
        meter: the partition's meter, when the feed has one (streamkit.metrics).
        decode: decodes one entry (its flat fields and id) into its record.
        spans: the processor's spans, with a tracer provider set (else ``None``: no
            span, no cost; see :mod:`streamkit._tracing`).
    """

    feed: PartitionFeed
    drain_source: trio_util.AsyncBool | None = attrs.field(kw_only=True, alias="draining")
    ack_batch: int = attrs.field(kw_only=True, validator=positive_int)
    max_deliveries: int = attrs.field(kw_only=True, converter=_no_limit)
    divert: DivertHook | None = attrs.field(kw_only=True)
    middleware: tuple[Middleware, ...] = attrs.field(kw_only=True, converter=_stages)
    state: PartitionState | None = attrs.field(kw_only=True)
    ledger: Ledger[R] = attrs.field(init=False)
    meter: PartitionMeter | None = attrs.field(init=False)
    decode: Decoder = attrs.field(init=False)
    spans: ProcessorSpans | None = attrs.field(init=False)
    _decode_batch: BatchDecoder = attrs.field(init=False)
    _decode_payloads: BatchDecoder | None = attrs.field(init=False)
    # Whether each batch is decoded as it is loaded (an iterator of records runs).
    _decoding: bool = attrs.field(init=False, default=False)
    # Whether take() times its batches itself (else the batches' events are timed).
    _by_batch: bool = attrs.field(init=False, default=False)
    _acknowledged: int = attrs.field(init=False, default=0)
    _failure: BaseException | None = attrs.field(init=False, default=None)
    # Starts the middleware pump, while open_events' nursery runs.
    _pump_factory: Callable[[], Pump] | None = attrs.field(init=False, default=None)
    _pump: Pump | None = attrs.field(init=False, default=None)
    _draining: bool = attrs.field(init=False, default=False)
    # When the current batch was loaded, if latencies are timed (else 0).
    _loaded_at: float = attrs.field(init=False, default=0.0)
    # The lease's local deadline, as last looked up.
    _lease_deadline: float = attrs.field(init=False, default=-math.inf)
    _wait_scope: trio.CancelScope | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.max_deliveries != sys.maxsize and self.divert is None:
            # Poison events would otherwise be skipped without a word, left pending.
            raise ConfigError("max_deliveries", "needs a divert hook to hand the poison events to")
        self.ledger = Ledger(self.state, self._make_events)
        if self.state is not None and self.state.expiring:
            # Expiry's clock: the time of the event the processor holds.
            self.state.event_id = self.ledger.newest_inflight_id
        feed = self.feed
        self.meter = feed.meter
        codec = feed.stream.codec
        self.decode = codec.entry_decoder(stream=feed.stream.name, partition=feed.partition)
        self._decode_batch = codec.batch_decoder(UNDECODED)
        self._decode_payloads = codec.payload_decoder(UNDECODED)
        self.spans = processor_spans(
            self.ledger.inflight_entries, feed.stream.name, feed.keys.group, feed.partition
        )

    # -- what it is doing --

    @property
    def acknowledged(self) -> int:
        """Events handed over as done so far."""
        return self._acknowledged

    @property
    def failure(self) -> BaseException | None:
        """The machinery's failure that stopped the iterators, if any."""
        return self._failure

    @property
    def draining(self) -> bool:
        """Whether draining began (:meth:`drain`, or noticed by :meth:`is_draining`)."""
        return self._draining

    def start_iterator(self, *, decode: bool, by_batch: bool) -> None:
        """An iterator starts handing out the events: of records (``decode``: each batch
        is decoded as it is loaded) or event objects, one at a time or ``by_batch``
        (``take()``, which times its batches itself)."""
        self._decoding = decode
        self._by_batch = by_batch

    def set_pump_factory(self, factory: Callable[[], Pump] | None) -> None:
        """How to start the middleware pump (``open_events``, while its nursery runs);
        ``None``: no pump can start any more."""
        self._pump_factory = factory

    # -- draining --

    def is_draining(self) -> bool:
        """Whether the partition is being moved away (the iterators stop)."""
        if not self._draining:
            source = self.drain_source
            if source is not None and source.value:
                self._draining = True
        return self._draining

    def drain(self) -> None:
        """Stop the iterators after the current event or batch; wakes a waiting one."""
        self._draining = True
        # records() takes its general path next, which stops.
        self.ledger.end_run()
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    # -- the lease --

    def check_lease(self) -> float:
        """Refuse to hand out another event once the lease is gone.

        Reads and acknowledgements are fenced in Redis, but events already fetched
        sit in the buffer: a worker frozen past its lease (SIGSTOP, a long GC pause)
        would otherwise process them on waking, before its lease keeper (frozen too)
        notices, although a new owner may be processing the same events. The lease's
        local deadline tells without a round trip; it is looked up again only once
        the cached one has passed (the keeper extends the lease meanwhile).

        Returns:
            The lease's local deadline: no need to look again before it (unless the
            lease is lost or the feed fails).

        Raises:
            LockLost: the lease was lost, or its local deadline has passed.
        """
        held = self.feed.held
        now = trio.current_time()
        failure = self.feed.failure
        if failure is not None:
            # A refused read or acknowledgement: the lease is not ours any more,
            # whatever the local clock says.
            raise self.failed(failure)
        if held.lost_reason is None and now < self._lease_deadline:
            return self._lease_deadline
        if held.lost_reason is None:
            self._lease_deadline = local_deadline(held.lease)
            if now < self._lease_deadline:
                return self._lease_deadline
            log.warning(
                "lease on %r ran out unnoticed (was the process paused?); handing out no "
                "more events of %s partition %d",
                held.name,
                self.feed.stream.name,
                self.feed.partition,
            )
            raise self.failed(LockLost(held.name, "the lease ran out before it could be extended"))
        raise self.failed(LockLost(held.name, held.lost_reason))

    def failed(self, error: BaseException) -> BaseException:
        """Record ``error`` as the machinery's failure; return it, to raise."""
        self._failure = error
        return error

    # -- committing what is done --

    def commit_soon(self) -> None:
        """Hand the done events (and their effects) to the feed, to be committed with
        its next read."""
        ids = self.ledger.take_done()
        state = self.state
        if state is None:
            self.feed.ack_later(ids)
        else:
            if ids and state.expiring:
                state.note_done(ids[-1])
            self.feed.ack_later(ids, state.take_changes())
        self._acknowledged += len(ids)

    def commit_if_due(self) -> None:
        """:meth:`commit_soon` once :attr:`ack_batch` done events have accumulated."""
        if self.ledger.done_count() >= self.ack_batch:
            self.commit_soon()

    async def settle_and_commit_if_due(self) -> None:
        """:meth:`commit_if_due`, closing the windows due (and expiring the keys due)
        first, as between batches: a window closed before the commit goes from memory
        straight to its results, where one closed after it would have its values
        written by this commit only for the next to remove them."""
        if self.ledger.done_count() < self.ack_batch:
            return
        state = self.state
        if state is not None and state.settles:
            try:
                await state.settle()
            except StreamkitError as exc:
                raise self.failed(exc) from None
        self.commit_soon()

    async def commit_now(self) -> None:
        """Commit the done events (and their effects) now, fenced by the lease.

        Error handling:
            :class:`~streamkit.LockLost` or :class:`~streamkit.RedisUnavailable`
            from the feed; the ids are kept for a later attempt (they are pending in
            Redis either way) and the error is recorded as :attr:`failure`. A failed
            commit with effects stops the feed: the partition starts over.
        """
        # Even with nothing new: the feed may hold acknowledgements handed over
        # earlier for its next read, and sends them now.
        state = self.state
        if state is not None and state.settles:
            await state.settle()
        ids = self.ledger.take_done()
        try:
            if state is None:
                await self.feed.ack(ids)
            else:
                if ids and state.expiring:
                    state.note_done(ids[-1])
                await self.feed.ack(ids, state.take_changes())
        except BaseException as exc:
            self.ledger.restore_done(ids)
            if isinstance(exc, StreamkitError) and self._failure is None:
                self._failure = exc
            raise
        self._acknowledged += len(ids)

    async def stop(self) -> None:
        """Commit what is done and end the iteration."""
        await self.commit_now()
        raise StopAsyncIteration

    # -- batches --

    def finish_batch(self) -> None:
        """Report the batch handed out to the feed (room to read ahead); time it."""
        finished = self.ledger.finish_batch()
        if finished is not None:
            batch, handed_on = finished
            self.feed.done(batch)
            if self._loaded_at:
                self._time_events(batch.ids, handed_on)

    def _time_events(self, ids: list[bytes], done: int) -> None:
        """Time the first ``done`` events of the batch just finished (``records()``,
        ``raw()``), of ids ``ids``."""
        began, self._loaded_at = self._loaded_at, 0.0
        meter = self.meter
        if meter is None or done == 0 or self._by_batch:
            return
        processor = meter.processor
        processor.event_seconds.observe((time.perf_counter() - began) / done, done)
        processor.observe_end_to_end(ids[0], ids[done - 1], done, time.time())

    def time_batch(self, ids: list[bytes], began: float) -> None:
        """Time a batch of ``take()`` (its events' ids) that the processor has finished."""
        meter = self.meter
        if meter is None or not ids:
            return
        processor = meter.processor
        processor.batch_seconds.observe(time.perf_counter() - began)
        processor.observe_end_to_end(ids[0], ids[-1], len(ids), time.time())

    def _make_events(self, batch: Batch, records: list[Any] | None) -> list[Event[R]]:
        """The event objects of ``batch``, given its records if decoded (for the ledger)."""
        feed = self.feed
        partition = feed.partition
        decode = self.decode
        name = feed.stream.name
        deliveries = batch.deliveries or itertools.repeat(1)
        decoded = records or itertools.repeat(UNDECODED)
        # Event(...), not Event[R](...): a subscripted class is called through typing,
        # several times slower per event.
        # (Not strict: the counts and records may repeat one value without end.)
        return [
            Event(partition, i, f, d, decode, name, r)
            for i, f, d, r in zip(batch.ids, batch.fields, deliveries, decoded, strict=False)
        ]

    def _load(self, batch: Batch) -> list[Any] | None:
        records = None
        clean = False
        deliveries = batch.deliveries
        screened = deliveries is None or max(deliveries) <= self.max_deliveries
        if self._decoding:
            # The whole batch at once; what the batch decoding misses is decoded (and
            # refused) one by one, when handed out.
            payloads = batch.payloads() if self._decode_payloads is not None else None
            if payloads is not None:
                assert self._decode_payloads is not None
                records, missed = self._decode_payloads(payloads)
            else:
                records, missed = self._decode_batch(batch.fields)
            clean = not missed and screened
        self.ledger.load(batch, records, clean=clean, screened=screened)
        if TIMING.on:
            self._loaded_at = time.perf_counter()
        return records

    async def next_batch(self, deadline: float, *, wake: bool) -> bool:
        """Load the next batch into the ledger; ``False`` if ``deadline`` passed first.

        Args:
            deadline: give up waiting at this time.
            wake: whether draining may cut the wait short (the processor's own wait;
                the middleware pump's is cut short by the pump stopping instead).

        Raises:
            Stop: draining began (only with ``wake``).
            StreamkitError: the feed stopped (the lease was lost, say).
        """
        feed = self.feed
        ledger = self.ledger
        state = self.state
        if wake and self._draining:
            if ledger.done_count() or state is not None:
                self.commit_soon()
            self.finish_batch()
            raise Stop
        try:
            batch = feed.receive_nowait()
        except trio.WouldBlock:
            # Nothing ready: the feed sends the acknowledgements with its next read,
            # or before it waits for new entries, whichever comes first.
            await self._hand_over()
            while True:
                if wake and self._draining:
                    # Draining began while the windows settled or ticked (awaits that
                    # drain() could not cut short): stop rather than wait.
                    raise Stop from None
                # A partition with windows wakes when the wall clock would close one.
                idle_at = state.idle_deadline() if state is not None else math.inf
                with trio.CancelScope(deadline=min(deadline, idle_at)) as scope:
                    if wake:
                        self._wait_scope = scope
                    try:
                        batch = await feed.receive()
                    except StreamkitError as exc:
                        raise self.failed(exc) from None
                    finally:
                        if wake:
                            self._wait_scope = None
                if not scope.cancelled_caught:
                    break
                if wake and self._draining:
                    raise Stop from None
                try:
                    # A batch that came as the wait's deadline passed: a deadline passed
                    # cancels a receive whatever is ready. The partition was not idle.
                    batch = feed.receive_nowait()
                except trio.WouldBlock:
                    pass
                else:
                    break
                if state is None or trio.current_time() >= deadline:
                    return False
                if not feed.caught_up:
                    # Not quiet, only unread (an outage, say): that time is not idle.
                    state.restart_idle()
                    continue
                await state.tick()
                await self.commit_now()
        except StreamkitError as exc:
            raise self.failed(exc) from None
        else:
            # The next batch is here already: the acknowledgements go with the
            # partition's next read, which the room made below lets happen.
            await self._hand_over()
            # Let the fetcher run (and refill) between batches.
            await trio.lowlevel.checkpoint()
        records = self._load(batch)
        if records and state is not None and state.prefetches:
            # The batch's keys, read in one round trip per table, not one per event.
            await state.prefetch(records)
        return True

    async def _hand_over(self) -> None:
        """Between batches: close the windows due, hand what is done to the feed (for
        its next read) and report the batch finished (room to read ahead)."""
        state = self.state
        if state is not None:
            if state.settles:
                await state.settle()
            self.commit_soon()
        elif self.ledger.done_count():
            self.commit_soon()
        self.finish_batch()

    # -- screening --

    def is_poison(self, event: Event[R]) -> bool:
        """Whether ``event`` was delivered more often than :attr:`max_deliveries`."""
        return event.delivery_count > self.max_deliveries

    async def screen(self, event: Event[R]) -> bool:
        """Divert ``event`` if it is poison; return whether it was."""
        if event.delivery_count <= self.max_deliveries:
            return False
        await self.divert_event(event, None, "poison")
        return True

    async def divert_event(self, event: Event[R], error: BaseException | None, reason: str) -> None:
        """Hand an event that must not reach the processor to the hook, then skip it.

        Without a hook, ``error`` (if any) is raised.
        """
        if self.divert is None:
            if error is not None:
                raise error
            return
        await self.divert(event, error, reason)
        self.ledger.skip(event)
        self.commit_if_due()

    # -- the next event --

    async def next_fetched(self, deadline: float, *, wake: bool) -> Event[R] | None:
        """The next fetched event (poison diverted); ``None`` once ``deadline`` passed."""
        ledger = self.ledger
        while True:
            event = ledger.next_buffered()
            if event is not None:
                if event.delivery_count > self.max_deliveries and await self.screen(event):
                    continue
                return event
            if not await self.next_batch(deadline, wake=wake):
                return None

    async def next_event(self, deadline: float = math.inf) -> Event[R] | None:
        """The next event for the processor: replayed first, then through the middleware
        (if any) or straight from the feed; ``None`` once ``deadline`` passed.

        Raises:
            Stop: the iterators are to stop.
        """
        replayed = self.ledger.next_replayed()
        if replayed is not None:
            await trio.lowlevel.checkpoint_if_cancelled()
            return replayed
        if not self.middleware:
            await trio.lowlevel.checkpoint_if_cancelled()
            return await self.next_fetched(deadline, wake=True)
        if self._pump is None:
            self._pump = self._start_pump()
        return await self._pump.next(deadline)

    def _start_pump(self) -> Pump:
        if self._pump_factory is None:
            raise RuntimeError("middleware needs the events opened by `open_events()`")
        return self._pump_factory()

    def stop_pump(self) -> None:
        """Stop the middleware pump, if it runs."""
        if self._pump is not None:
            self._pump.stop()
            self._pump = None

    def take_ready(self, n: int) -> list[Event[R]]:
        """Up to ``n`` events available without waiting (not screened)."""
        return self.ledger.take_ready(n, direct=not self.middleware)

    def wait_scope(self, deadline: float) -> trio.CancelScope:
        """A scope for waiting until ``deadline`` that draining cancels."""
        scope = trio.CancelScope(deadline=deadline)
        self._wait_scope = scope
        return scope

    def end_wait(self) -> None:
        """The wait opened by :meth:`wait_scope` is over."""
        self._wait_scope = None

    def __repr__(self) -> str:
        ledger = self.ledger
        return (
            f"<Delivery {self.feed.stream.name} partition {self.feed.partition} "
            f"in flight {ledger.inflight_count()}, unacknowledged {ledger.done_count()}, "
            f"acknowledged {self._acknowledged}{', draining' if self._draining else ''}>"
        )
