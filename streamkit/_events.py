"""Events: what a processor receives for one partition.

An :class:`Events` object hands out a partition's events in order, through
:meth:`Events.records`, :meth:`Events.take` or :meth:`Events.raw`, and acknowledges
each one only after the processor has moved past it (at-least-once). It takes its
batches from a :class:`~streamkit.PartitionFeed` and gives acknowledgements back to it;
it knows nothing else of Redis or of the fetcher.

Delivery bookkeeping, in one place:

* an event handed to the processor is *in flight*;
* when the processor asks for the next event (or batch), or returns normally, the
  in-flight events are *committed*: their ids join the acknowledgements, handed to the
  feed in batches of ``ack_batch`` and before every wait for new events (the feed
  sends them with the partition's next read), and flushed when the block is left;
* a policy runner may instead *rewind* them (they are handed out again, first, in
  order) or let them stay pending by leaving the processor with an exception;
* an event that must not reach the processor (poison, undecodable) is given to the
  ``divert`` hook and then *skipped*: acknowledged without being processed.

The hot path works on whole batches: records are decoded straight from Redis's field
lists, one at a time, the lease deadline is compared with a cached value, and there is
no channel operation per event.

Middleware (``m(iterator) -> iterator`` over :class:`Event` objects) runs in a pump
task of the nursery that :func:`open_events` opens in the caller's own task: nothing of
a partition outlives the ``async with`` block.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

import trio

from ._errors import ConfigError, DecodeError, LockLost, StreamkitError
from ._groups import open_service_nursery
from ._locks import local_deadline
from ._meter import TIMING
from ._validate import non_negative_number, positive_int
from ._wire import field_pairs

if TYPE_CHECKING:
    from collections.abc import Sequence

    import trio_util

    from ._feed import Batch, PartitionFeed
    from ._meter import PartitionMeter
    from ._spec import ProcessorKeys, StreamSpec

__all__ = ["DivertHook", "Event", "Events", "Middleware", "open_events"]

R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("streamkit.events")

#: Acknowledgements are flushed once this many accumulate (and before every wait).
DEFAULT_ACK_BATCH = 500
#: Leaving a partition flushes its acknowledgements for at most this long (shielded).
ACK_FLUSH_TIMEOUT = 2.0
#: Closing a middleware chain (its ``aclose``) may take at most this long.
MIDDLEWARE_CLOSE_TIMEOUT = 1.0

_UNSET: Any = object()

# Decodes an entry's flat field list; the id is for the error message.
_Decoder: TypeAlias = Callable[[list[bytes], bytes], Any]


class Event(Generic[R]):
    """One entry of a partition, as fetched.

    Attributes:
        partition: the partition number.
        delivery_count: how many times Redis delivered the entry, this delivery
            included: 1 for a first delivery, more after a takeover or crash.
        stream: the stream's name.
    """

    __slots__ = ("_decode", "_flat", "_id", "_record", "delivery_count", "partition", "stream")

    def __init__(
        self,
        partition: int,
        entry_id: bytes,
        flat: list[bytes],
        delivery_count: int,
        decode: _Decoder,
        stream: str,
    ) -> None:
        self.partition = partition
        self.delivery_count = delivery_count
        self.stream = stream
        self._id = entry_id
        self._flat = flat
        self._decode = decode
        self._record: R = _UNSET

    @property
    def entry_id(self) -> str:
        """The Redis entry id (``"1700000000000-0"``)."""
        return self._id.decode()

    @property
    def fields(self) -> dict[bytes, bytes]:
        """The entry's fields, as stored."""
        return field_pairs(self._flat)

    @property
    def record(self) -> R:
        """The decoded record, decoded on first access.

        Raises:
            DecodeError: the entry is not a valid encoding of the stream's record.
        """
        record = self._record
        if record is _UNSET:
            record = self._record = self._decode(self._flat, self._id)
        return record

    def __repr__(self) -> str:
        return (
            f"<Event {self.stream} partition {self.partition} {self.entry_id} "
            f"delivered {self.delivery_count}x>"
        )


Middleware: TypeAlias = Callable[[AsyncIterator[Event[Any]]], AsyncIterator[Event[Any]]]
"""Wraps the raw event iterator: ``def m(events: AsyncIterator[Event]) -> AsyncIterator[Event]``.

A middleware may drop events (they count as processed once a later event is) and must
yield the :class:`Event` objects it was given, in order.
"""

DivertHook: TypeAlias = Callable[[Event[Any], BaseException | None, str], Awaitable[None]]
"""Called for an event that must not reach the processor: ``(event, error, reason)``,
where reason is ``"poison"`` or ``"undecodable"``. When it returns, the event is
skipped (acknowledged); when it raises, the exception ends the iteration."""


class _Stop(Exception):
    """Internal: the iterators are to stop (draining, or the middleware chain ended)."""


class _PumpError:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Events(Generic[R]):
    """The events of one partition, as handed to a processor.

    Get one from :func:`open_events` (or, with an exception policy, from
    :func:`~streamkit.run_processor`, which opens it for you). Iterate it with
    :meth:`records`, :meth:`take` or :meth:`raw`; one iterator at a time, from one task.

    Acknowledgement:
        An event is acknowledged once the processor has moved past it: when it asks
        any iterator for the next event, or returns normally. An event whose
        processing raised or was cancelled stays pending and is delivered again
        (to this processor after a retry, or to the partition's next owner).

    Policy runners (such as :func:`~streamkit.run_processor`) steer the bookkeeping
    with :attr:`in_flight`, :meth:`commit`, :meth:`rewind`, :meth:`skip` and
    :meth:`flush`.

    Attributes:
        partition: the partition number.
        stream: the stream's description.
        keys: the processor's keys (consumer group, dead-letter stream, lock names).
        acknowledged: events acknowledged so far.
    """

    def __init__(
        self,
        feed: PartitionFeed,
        *,
        draining: trio_util.AsyncBool | None = None,
        ack_batch: int = DEFAULT_ACK_BATCH,
        max_deliveries: int | None = None,
        divert: DivertHook | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        positive_int.check("ack_batch", ack_batch)
        if max_deliveries is not None and divert is None:
            # Poison events would otherwise be skipped without a word, left pending.
            raise ConfigError("max_deliveries", "needs a divert hook to hand the poison events to")
        self.partition: int = feed.partition
        self.stream: StreamSpec[R] = feed.stream
        self.keys: ProcessorKeys = feed.keys
        self.acknowledged = 0
        self._feed = feed
        # A fetcher's feed carries the partition's meter (streamkit.metrics); a feed
        # of one's own need not.
        self._meter: PartitionMeter | None = getattr(feed, "meter", None)
        # When the current batch was loaded, if latencies are timed (else 0), and
        # whether take() times them per batch of its own instead.
        self._loaded_at = 0.0
        self._by_batch = False
        self._decode: _Decoder = feed.stream.codec.entry_decoder(
            stream=feed.stream.name, partition=feed.partition
        )
        self._ack_batch = ack_batch
        self._max_deliveries = sys.maxsize if max_deliveries is None else max_deliveries
        self._divert = divert
        self._middleware = tuple(middleware)
        self._drain_source = draining
        self._draining = False
        # The batch being handed out: its events, the next position, the batch itself.
        self._buffer: list[Event[R]] = []
        self._pos = 0
        self._batch: Batch | None = None
        self._replay: list[Event[R]] = []  # rewound events, handed out first
        self._inflight: list[Event[R]] = []
        self._acks: list[bytes] = []
        self._deadline = -math.inf  # the lease's local deadline, as last looked up
        self._wait_scope: trio.CancelScope | None = None
        self._failure: BaseException | None = None
        # Middleware: the pump's nursery (set by open_events), its channel and the
        # events it was given that are not settled yet.
        self._nursery: trio.Nursery | None = None
        self._pump_receive: trio.MemoryReceiveChannel[Event[R] | _PumpError] | None = None
        self._pump_scope: trio.CancelScope | None = None
        self._dispatched: collections.deque[Event[R]] | None = None

    # -- public iterators --

    def records(self) -> AsyncIterator[R]:
        """Iterate over the partition's records, decoded, in order.

        Stops (after acknowledging the last record) when the partition is being
        drained away. An undecodable entry raises :class:`DecodeError` (under
        :func:`~streamkit.run_processor`, it goes through the exception policy instead).
        """
        return _OneByOne(self, decode=True)

    def raw(self) -> AsyncIterator[Event[R]]:
        """Iterate over the partition's :class:`Event` objects, in order.

        Records are decoded only when ``event.record`` is read.
        """
        return _OneByOne(self, decode=False)

    def take(self, n: int, *, within: float | None = None) -> AsyncIterator[list[R]]:
        """Iterate over batches of up to ``n`` records, in order.

        A batch is yielded as soon as it is full, or, with ``within``, once
        ``within`` seconds have passed since its first event arrived (a partial
        batch). Batches are never empty. The whole batch is acknowledged when the
        processor asks for the next one.
        """
        return _Batches(self, n, within, decode=True)

    def take_raw(self, n: int, *, within: float | None = None) -> AsyncIterator[list[Event[R]]]:
        """As :meth:`take`, yielding lists of :class:`Event` objects."""
        return _Batches(self, n, within, decode=False)

    @property
    def group(self) -> str:
        """The consumer group."""
        return self.keys.group

    @property
    def draining(self) -> bool:
        """Whether the partition is being moved away (the iterators will stop)."""
        return self._is_draining()

    @property
    def failure(self) -> BaseException | None:
        """The failure of the machinery (lease lost, feed ended, Redis gone) that
        stopped the iterators, if any. Such errors are never the events' fault: a
        policy runner lets them propagate."""
        return self._failure

    # -- the policy runner's API --

    @property
    def in_flight(self) -> tuple[Event[R], ...]:
        """The events handed to the processor that it has not moved past yet."""
        return tuple(self._inflight)

    def commit(self) -> None:
        """Count the in-flight events as processed: they are acknowledged at the next
        flush (see :meth:`flush`)."""
        inflight = self._inflight
        if not inflight:
            return
        self._inflight = []
        dispatched = self._dispatched
        if dispatched is None:
            self._acks.extend([e._id for e in inflight])
            return
        # Everything the middleware was given up to the last event it yielded is
        # done: the events before it that never reached the processor were dropped.
        last = inflight[-1]
        while dispatched:
            event = dispatched.popleft()
            self._acks.append(event._id)
            if event is last:
                return
        # Replayed events the current chain never saw.
        seen = set(self._acks)
        self._acks.extend([e._id for e in inflight if e._id not in seen])

    def rewind(self) -> None:
        """Hand the in-flight events out again, first and in order (a retry in place)."""
        inflight = self._inflight
        if not inflight:
            return
        self._inflight = []
        dispatched = self._dispatched
        if dispatched is not None:
            # Events the middleware was given before the first in-flight one were
            # dropped by it: done.
            while dispatched and dispatched[0] is not inflight[0]:
                self._acks.append(dispatched.popleft()._id)
        self._replay[:0] = inflight

    def skip(self, event: Event[R]) -> None:
        """Count ``event``, which never reached the processor, as done (acknowledged
        at the next flush)."""
        if self._dispatched is not None:
            with contextlib.suppress(ValueError):
                self._dispatched.remove(event)
        self._acks.append(event._id)

    async def flush(self) -> None:
        """Acknowledge the events counted as done so far (fenced by the lease).

        Error handling:
            :class:`~streamkit.LockLost` or :class:`~streamkit.RedisUnavailable`
            from the feed; the ids are kept for a later attempt (they are pending in
            Redis either way) and the error is recorded as :attr:`failure`.
        """
        # Even with nothing new: the feed may hold acknowledgements handed over
        # earlier for its next read, and sends them now.
        ids, self._acks = self._acks, []
        try:
            await self._feed.ack(ids)
        except BaseException as exc:
            self._acks[:0] = ids
            if isinstance(exc, StreamkitError) and self._failure is None:
                self._failure = exc
            raise
        self.acknowledged += len(ids)

    def _ack_soon(self) -> None:
        """Hand the acknowledgements to the feed, to go with its next read."""
        ids, self._acks = self._acks, []
        self._feed.ack_later(ids)
        self.acknowledged += len(ids)

    def __repr__(self) -> str:
        return (
            f"<Events {self.stream.name} partition {self.partition} "
            f"in flight {len(self._inflight)}, unacknowledged {len(self._acks)}, "
            f"acknowledged {self.acknowledged}{', draining' if self._draining else ''}>"
        )

    # -- internals --

    def _is_draining(self) -> bool:
        if not self._draining:
            source = self._drain_source
            if source is not None and source.value:
                self._draining = True
        return self._draining

    def _drain(self) -> None:
        self._draining = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    def _internal(self, error: BaseException) -> BaseException:
        self._failure = error
        return error

    def _check_lease(self) -> None:
        """Refuse to hand out another event once the lease is gone.

        Reads and acknowledgements are fenced in Redis, but events already fetched
        sit in the buffer: a worker frozen past its lease (SIGSTOP, a long GC pause)
        would otherwise process them on waking, before its lease keeper (frozen too)
        notices, although a new owner may be processing the same events. The lease's
        local deadline tells without a round trip; it is looked up again only once
        the cached one has passed (the keeper extends the lease meanwhile).

        Raises:
            LockLost: the lease was lost, or its local deadline has passed.
        """
        held = self._feed.held
        now = trio.current_time()
        failure = self._feed.failure
        if failure is not None:
            # A refused read or acknowledgement: the lease is not ours any more,
            # whatever the local clock says.
            raise self._internal(failure)
        if held.lost_reason is None and now < self._deadline:
            return
        if held.lost_reason is None:
            self._deadline = local_deadline(held.lease)
            if now < self._deadline:
                return
            log.warning(
                "lease on %r ran out unnoticed (was the process paused?); handing out no "
                "more events of %s partition %d",
                held.name,
                self.stream.name,
                self.partition,
            )
            raise self._internal(
                LockLost(held.name, "the lease ran out before it could be extended")
            )
        raise self._internal(LockLost(held.name, held.lost_reason))

    def _done_with_batch(self) -> None:
        batch = self._batch
        if batch is not None:
            self._batch = None
            self._feed.done(batch)
            if self._loaded_at:
                self._time_events()

    def _time_events(self) -> None:
        """Time the events of the batch just finished (``records()``, ``raw()``)."""
        began, self._loaded_at = self._loaded_at, 0.0
        meter = self._meter
        done = self._pos
        if meter is None or done == 0 or self._by_batch:
            return
        processor = meter.processor
        processor.event_seconds.observe((time.perf_counter() - began) / done, done)
        buffer = self._buffer
        processor.observe_end_to_end(buffer[0]._id, buffer[done - 1]._id, done, time.time())

    def _time_batch(self, batch: list[Event[R]], began: float) -> None:
        """Time a batch of ``take()`` that the processor has finished."""
        meter = self._meter
        if meter is None:
            return
        processor = meter.processor
        processor.batch_seconds.observe(time.perf_counter() - began)
        processor.observe_end_to_end(batch[0]._id, batch[-1]._id, len(batch), time.time())

    def _load(self, batch: Batch) -> None:
        partition = self.partition
        decode = self._decode
        name = self.stream.name
        deliveries = batch.deliveries
        if deliveries is None:
            self._buffer = [
                Event(partition, i, f, 1, decode, name)
                for i, f in zip(batch.ids, batch.fields, strict=True)
            ]
        else:
            self._buffer = [
                Event(partition, i, f, d, decode, name)
                for i, f, d in zip(batch.ids, batch.fields, deliveries, strict=True)
            ]
        self._pos = 0
        self._batch = batch
        if TIMING.on:
            self._loaded_at = time.perf_counter()

    async def _next_batch(self, deadline: float, *, wake: bool) -> bool:
        """Load the next batch into the buffer; ``False`` if ``deadline`` passed first.

        Raises:
            _Stop: draining began (only with ``wake``).
            StreamkitError: the feed stopped (the lease was lost, say).
        """
        feed = self._feed
        if wake and self._draining:
            if self._acks:
                self._ack_soon()
            self._done_with_batch()
            raise _Stop
        try:
            batch = feed.receive_nowait()
        except trio.WouldBlock:
            # Nothing ready: the feed sends the acknowledgements with its next read,
            # or before it waits for new entries, whichever comes first.
            if self._acks:
                self._ack_soon()
            self._done_with_batch()
            with trio.CancelScope(deadline=deadline) as scope:
                if wake:
                    self._wait_scope = scope
                try:
                    batch = await feed.receive()
                except StreamkitError as exc:
                    raise self._internal(exc) from None
                finally:
                    if wake:
                        self._wait_scope = None
            if scope.cancelled_caught:
                if wake and self._draining:
                    raise _Stop from None
                return False
        except StreamkitError as exc:
            raise self._internal(exc) from None
        else:
            # The next batch is here already: the acknowledgements go with the
            # partition's next read, which the room made below lets happen.
            if self._acks:
                self._ack_soon()
            self._done_with_batch()
            # Let the fetcher run (and refill) between batches.
            await trio.lowlevel.checkpoint()
        self._load(batch)
        return True

    async def _screen(self, event: Event[R]) -> bool:
        """Divert ``event`` if it is poison; return whether it was."""
        if event.delivery_count <= self._max_deliveries:
            return False
        await self._divert_event(event, None, "poison")
        return True

    async def _divert_event(
        self, event: Event[R], error: BaseException | None, reason: str
    ) -> None:
        """Hand an event that must not reach the processor to the hook, then skip it."""
        if self._divert is None:
            if error is not None:
                raise error
            return
        await self._divert(event, error, reason)
        self.skip(event)
        if len(self._acks) >= self._ack_batch:
            self._ack_soon()

    async def _next_base(self, deadline: float, *, wake: bool) -> Event[R] | None:
        """The next fetched event (poison diverted); ``None`` once ``deadline`` passed."""
        while True:
            pos = self._pos
            if pos < len(self._buffer):
                self._pos = pos + 1
                event = self._buffer[pos]
                if event.delivery_count > self._max_deliveries and await self._screen(event):
                    continue
                return event
            if not await self._next_batch(deadline, wake=wake):
                return None

    async def _next(self, deadline: float = math.inf) -> Event[R] | None:
        """The next event for the processor; ``None`` once ``deadline`` passed.

        Raises:
            _Stop: the iterators are to stop.
        """
        if self._replay:
            await trio.lowlevel.checkpoint_if_cancelled()
            return self._replay.pop(0)
        if not self._middleware:
            await trio.lowlevel.checkpoint_if_cancelled()
            return await self._next_base(deadline, wake=True)
        return await self._next_from_pump(deadline)

    def _take_ready(self, n: int) -> list[Event[R]]:
        """Up to ``n`` events available without waiting (not screened)."""
        if self._replay:
            ready, self._replay = self._replay[:n], self._replay[n:]
            return ready
        if self._middleware:
            return []
        pos = self._pos
        ready = self._buffer[pos : pos + n]
        self._pos = pos + len(ready)
        return ready

    def _put_back(self, events: list[Event[R]]) -> None:
        """Hand ``events`` (taken but not handed out) out next, before anything else."""
        if events:
            self._replay[:0] = events

    async def _stop(self) -> None:
        """Flush and end the iteration."""
        await self.flush()
        raise StopAsyncIteration

    # -- middleware pump --

    async def _next_from_pump(self, deadline: float) -> Event[R] | None:
        if self._pump_receive is None:
            self._start_pump()
        assert self._pump_receive is not None
        if self._draining:
            raise _Stop
        if self._acks:
            # The pump may be waiting for new events already: what the processor
            # moved past since must not wait with it.
            self._ack_soon()
        with trio.CancelScope(deadline=deadline) as scope:
            self._wait_scope = scope
            try:
                item = await self._pump_receive.receive()
            except trio.EndOfChannel:
                raise _Stop from None
            finally:
                self._wait_scope = None
        if scope.cancelled_caught:
            if self._draining:
                raise _Stop
            return None
        if isinstance(item, _PumpError):
            self._stop_pump()
            self._requeue_dispatched()
            raise item.error
        return item

    def _start_pump(self) -> None:
        if self._nursery is None:
            raise RuntimeError("middleware needs the events opened by `open_events()`")
        self._dispatched = collections.deque()
        stages: list[AsyncIterator[Event[Any]]] = [_Base(self)]
        for middleware in self._middleware:
            stages.append(middleware(stages[-1]))
        send, receive = trio.open_memory_channel[Event[R] | _PumpError](0)
        self._pump_receive = receive
        self._pump_scope = trio.CancelScope()
        self._nursery.start_soon(self._pump, stages, send, self._pump_scope)

    async def _pump(
        self,
        stages: list[AsyncIterator[Event[R]]],
        send: trio.MemorySendChannel[Event[R] | _PumpError],
        scope: trio.CancelScope,
    ) -> None:
        with scope, send:
            try:
                async for event in stages[-1]:
                    await send.send(event)
            except Exception as exc:
                await send.send(_PumpError(exc))
            finally:
                # Close every stage, outermost first, here and now: an inner one
                # left suspended would be finalized later, outside the partition.
                with trio.move_on_after(MIDDLEWARE_CLOSE_TIMEOUT) as closing:
                    closing.shield = True
                    for stage in reversed(stages):
                        aclose = getattr(stage, "aclose", None)
                        if aclose is not None:
                            with contextlib.suppress(Exception):
                                await aclose()

    def _stop_pump(self) -> None:
        if self._pump_scope is not None:
            self._pump_scope.cancel()
        self._pump_scope = None
        self._pump_receive = None

    def _requeue_dispatched(self) -> None:
        """Put events the dead middleware chain had taken back in front of the buffer."""
        dispatched = self._dispatched
        if dispatched:
            self._buffer = [*dispatched, *self._buffer[self._pos :]]
            self._pos = 0
            dispatched.clear()


class _Base(AsyncIterator[Event[R]]):
    """The raw event iterator that the first middleware wraps (runs in the pump)."""

    def __init__(self, events: Events[R]) -> None:
        self._events = events

    async def __anext__(self) -> Event[R]:
        events = self._events
        event = await events._next_base(math.inf, wake=False)
        assert event is not None
        assert events._dispatched is not None
        events._dispatched.append(event)
        return event


class _OneByOne(AsyncIterator[T]):
    __slots__ = ("_decode", "_events", "_held")

    def __init__(self, events: Events[Any], *, decode: bool) -> None:
        self._events = events
        self._decode = decode
        self._held = events._feed.held
        events._by_batch = False

    async def __anext__(self) -> T:
        events = self._events
        while True:
            # Move past the previous event.
            inflight = events._inflight
            if inflight:
                if len(inflight) == 1 and events._dispatched is None:
                    events._acks.append(inflight[0]._id)
                    events._inflight = []
                else:
                    events.commit()
                if len(events._acks) >= events._ack_batch:
                    events._ack_soon()
            if events._draining or events._is_draining():
                await events._stop()
            # The next event: straight from the batch when nothing else comes first.
            pos = events._pos
            buffer = events._buffer
            if pos < len(buffer) and not events._replay and not events._middleware:
                await trio.lowlevel.checkpoint_if_cancelled()
                event = buffer[pos]
                events._pos = pos + 1
                if event.delivery_count > events._max_deliveries and await events._screen(event):
                    continue
            else:
                try:
                    next_event = await events._next()
                except _Stop:
                    await events._stop()
                assert next_event is not None
                event = next_event
            # The lease, against its cached local deadline.
            if not (
                self._held.lost_reason is None
                and trio.current_time() < events._deadline
                and events._feed.failure is None
            ):
                events._check_lease()
            events._inflight = [event]
            if not self._decode:
                return event  # type: ignore[return-value]
            try:
                return event._decode(event._flat, event._id)  # type: ignore[no-any-return]
            except DecodeError as exc:
                if events._divert is None:
                    raise
                events._inflight = []
                await events._divert_event(event, exc, "undecodable")


class _Batches(AsyncIterator[list[T]]):
    __slots__ = ("_decode", "_events", "_handed_at", "_n", "_stopped", "_within")

    def __init__(self, events: Events[Any], n: int, within: float | None, *, decode: bool) -> None:
        if not (isinstance(n, int) and n >= 1):
            raise ValueError(f"take() needs a positive batch size, got {n!r}")
        non_negative_number.or_none().check("within", within)
        self._events = events
        self._n = n
        self._within = math.inf if within is None else within
        self._decode = decode
        self._stopped = False
        # When the batch in flight was handed out, if latencies are timed (else 0).
        self._handed_at = 0.0
        events._by_batch = True

    async def __anext__(self) -> list[T]:
        events = self._events
        if events._inflight:
            if self._handed_at:
                events._time_batch(events._inflight, self._handed_at)
                self._handed_at = 0.0
            events.commit()
            if len(events._acks) >= events._ack_batch:
                events._ack_soon()
        # Every event gathered may be diverted: then gather again, until a batch has
        # something to yield or the iteration stops.
        while True:
            if self._stopped or events._is_draining():
                await events._stop()
            batch, out = await self._gather()
            if batch:
                events._check_lease()
                events._inflight = batch
                if TIMING.on:
                    self._handed_at = time.perf_counter()
                return out if self._decode else batch  # type: ignore[return-value]

    async def _gather(self) -> tuple[list[Event[Any]], list[Any]]:
        """Up to ``n`` events (and their records), screened; may be empty."""
        events = self._events
        n = self._n
        decode = self._decode
        max_deliveries = events._max_deliveries
        batch: list[Event[Any]] = []
        out: list[Any] = []
        deadline = math.inf
        while len(batch) < n:
            ready = events._take_ready(n - len(batch))
            if not ready:
                try:
                    event = await events._next(deadline)
                except _Stop:
                    self._stopped = True
                    break
                if event is None:
                    break
                ready = [event]
            if deadline == math.inf:
                deadline = trio.current_time() + self._within
            for i, event in enumerate(ready):
                try:
                    if event.delivery_count > max_deliveries and await events._screen(event):
                        continue
                    if decode:
                        try:
                            out.append(event.record)
                        except DecodeError as exc:
                            if events._divert is None:
                                events._inflight = [*batch, event]
                                raise
                            await events._divert_event(event, exc, "undecodable")
                            continue
                except BaseException:
                    if events._inflight and events._inflight[-1] is event:
                        # An undecodable record with no hook: the batch so far and
                        # the event are in flight, for the caller to settle.
                        events._put_back(ready[i + 1 :])
                    else:
                        # The divert hook raised: nothing gathered was settled.
                        events._put_back([*batch, *ready[i:]])
                    raise
                batch.append(event)
        return batch, out


@contextlib.asynccontextmanager
async def open_events(
    feed: PartitionFeed,
    *,
    draining: trio_util.AsyncBool | None = None,
    middleware: Sequence[Middleware] = (),
    ack_batch: int = DEFAULT_ACK_BATCH,
    max_deliveries: int | None = None,
    divert: DivertHook | None = None,
) -> AsyncIterator[Events[Any]]:
    """Hand out ``feed``'s events to a processor while the block runs.

    Args:
        feed: the partition's feed (from :meth:`Fetcher.partition`).
        draining: when it turns true, the event iterators stop after the current
            event or batch (acknowledged), so the processor can return.
        middleware: wrappers of the raw event iterator, applied in order (the first
            is closest to Redis, the last closest to the processor).
        ack_batch: flush acknowledgements when this many accumulate; they are also
            flushed before waiting for events and when the block is left.
        max_deliveries: events delivered more often than this are *poison*: they
            go to ``divert`` instead of the processor (``None``: no limit; a limit
            needs a ``divert`` hook).
        divert: the hook for poison and undecodable events (see
            :data:`~streamkit.DivertHook`); without one an undecodable record raises
            :class:`~streamkit.DecodeError` from the iterator.

    Cancellation:
        Leaving the block stops the middleware and the draining watcher (both run in
        this task's nursery), then acknowledges what the processor moved past,
        shielded, for at most :data:`ACK_FLUSH_TIMEOUT` seconds. When the block ends
        normally the in-flight events count as processed; after an exception or a
        cancellation they stay pending, for the next delivery.

    Error handling:
        :class:`~streamkit.LockLost` (from the iterators) once the lease is gone;
        an acknowledgement failing on the way out is logged when the block raised,
        else raised.
    """
    events: Events[Any] = Events(
        feed,
        draining=draining,
        ack_batch=ack_batch,
        max_deliveries=max_deliveries,
        divert=divert,
        middleware=middleware,
    )
    ended_normally = False
    try:
        async with open_service_nursery(reason="events closed") as nursery:
            events._nursery = nursery
            if draining is not None:
                nursery.start_soon(_watch_draining, draining, events)
            yield events
        ended_normally = True
    finally:
        events._nursery = None
        events._stop_pump()
        await _leave(events, commit=ended_normally)


async def _watch_draining(draining: trio_util.AsyncBool, events: Events[Any]) -> None:
    await draining.wait_value(True)
    events._drain()


async def _leave(events: Events[Any], *, commit: bool) -> None:
    if commit:
        events.commit()
    events._done_with_batch()
    if events._feed.held.lost_reason is not None:
        return
    with trio.move_on_after(ACK_FLUSH_TIMEOUT) as scope:
        scope.shield = True
        try:
            await events.flush()
        except StreamkitError as exc:
            if commit:
                raise
            log.warning(
                "acknowledging events of %s partition %d failed: %s",
                events.stream.name,
                events.partition,
                exc,
            )
    if scope.cancelled_caught:
        log.warning(
            "acknowledging events of %s partition %d timed out; "
            "they stay pending and are delivered again",
            events.stream.name,
            events.partition,
        )
