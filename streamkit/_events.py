"""Events: what a processor receives for one partition.

An :class:`Events` object hands out the partition's events in order, through
:meth:`Events.records`, :meth:`Events.take` or :meth:`Events.raw`, and acknowledges
each one only after the processor has moved past it (at-least-once). Acknowledgements
are batched and *fenced*: a Lua script acknowledges only while the partition's lock
still holds this executor's lease, so a worker that lost its partition (a GC pause,
SIGSTOP) can no longer acknowledge anything.

The hot path works on whole batches: the fetcher hands over lists of entries, records
are decoded lazily, one at a time, and there is no channel operation per event.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

import trio

from ._errors import DecodeError, LockLost, StreamkitError
from ._locks import local_deadline

if TYPE_CHECKING:
    from ._codec import Codec
    from ._fetcher import Fetcher, _PartitionState
    from ._streams import Stream

__all__ = ["Event", "Events", "Middleware"]

R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("streamkit.events")

_UNSET: Any = object()


class Event(Generic[R]):
    """One entry of a partition, as fetched.

    Attributes:
        partition: the partition number.
        entry_id: the Redis entry id (``"1700000000000-0"``).
        fields: the entry's fields, as stored.
        delivery_count: how many times Redis delivered the entry, this delivery
            included: 1 for a first delivery, more after a takeover or crash.
    """

    __slots__ = (
        "_codec",
        "_record",
        "_stream",
        "delivery_count",
        "entry_id",
        "fields",
        "partition",
    )

    def __init__(
        self,
        partition: int,
        entry_id: str,
        fields: dict[bytes, bytes],
        delivery_count: int,
        codec: Codec[R],
        stream: str,
    ) -> None:
        self.partition = partition
        self.entry_id = entry_id
        self.fields = fields
        self.delivery_count = delivery_count
        self._codec = codec
        self._stream = stream
        self._record: R = _UNSET

    @property
    def stream(self) -> str:
        """The stream's name."""
        return self._stream

    @property
    def record(self) -> R:
        """The decoded record, decoded on first access.

        Raises:
            DecodeError: the entry is not a valid encoding of the stream's record.
        """
        record = self._record
        if record is _UNSET:
            record = self._record = self._codec.decode(
                self.fields, stream=self._stream, partition=self.partition, entry_id=self.entry_id
            )
        return record

    def __repr__(self) -> str:
        return (
            f"<Event {self._stream} partition {self.partition} {self.entry_id} "
            f"delivered {self.delivery_count}x>"
        )


Middleware: TypeAlias = Callable[[AsyncIterator[Event[Any]]], AsyncIterator[Event[Any]]]
"""Wraps the raw event iterator: ``def m(events: AsyncIterator[Event]) -> AsyncIterator[Event]``."""

# Called for an event that must not reach the processor: (event, error or None, reason).
DivertHook: TypeAlias = Callable[[Event[Any], BaseException | None, str], Awaitable[None]]


class _Stop(Exception):
    """Internal: the iterators are to stop (draining, or the middleware chain ended)."""


class _PumpError:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Events(Generic[R]):
    """The events of one partition, as handed to a processor.

    Get one from :meth:`Fetcher.partition`. Iterate it with :meth:`records`,
    :meth:`take` or :meth:`raw`; one iterator at a time, from one task.

    Acknowledgement:
        An event is acknowledged once the processor has moved past it: when it asks
        any iterator for the next event, or returns normally. An event whose
        processing raised or was cancelled stays pending and is delivered again
        (to this processor after a retry, or to the partition's next owner).

    Attributes:
        partition: the partition number.
        stream: the stream.
        group: the consumer group.
    """

    def __init__(
        self,
        fetcher: Fetcher[R],
        state: _PartitionState,
        *,
        middleware: tuple[Middleware, ...] = (),
        ack_batch: int = 500,
    ) -> None:
        self.partition: int = state.partition
        self.stream: Stream[R] = fetcher.stream
        self.group: str = fetcher.group
        self._fetcher = fetcher
        self._state = state
        self._middleware = middleware
        self._ack_batch = ack_batch
        self._buffer: list[Event[R]] = []
        self._pos = 0
        self._holding = 0  # entries of the batch held in _buffer, for accounting
        self._replay: list[Event[R]] = []
        self._inflight: list[Event[R]] = []
        self._acks: list[str] = []
        self._draining = False
        # The rebalancer's flag, read directly so that draining takes effect at the
        # very next event; a watcher task also wakes a processor waiting for events.
        self._drain_source: Any = None
        self._wait_scope: trio.CancelScope | None = None
        # Errors of the machinery (lease lost, Redis gone): never handled by a policy.
        self._failure: BaseException | None = None
        self._max_deliveries = sys.maxsize
        self._divert: DivertHook | None = None
        # Middleware runs in a pump task; _dispatched tracks what it was given.
        self._dispatched: collections.deque[Event[R]] | None = None
        self._pump_receive: trio.MemoryReceiveChannel[Event[R] | _PumpError] | None = None
        self._pump_scope: trio.CancelScope | None = None
        self.acknowledged = 0

    # -- public iterators --

    def records(self) -> AsyncIterator[R]:
        """Iterate over the partition's records, decoded, in order.

        Stops (after acknowledging the last record) when the partition is being
        drained away. An undecodable entry raises :class:`DecodeError` (under
        :func:`run_processor`, it goes through the exception policy instead).
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
    def draining(self) -> bool:
        """Whether the partition is being moved away (the iterators will stop)."""
        return self._is_draining()

    def _is_draining(self) -> bool:
        if self._draining:
            return True
        source = self._drain_source
        if source is not None and source.value:
            self._draining = True
        return self._draining

    def __repr__(self) -> str:
        return (
            f"<Events {self.stream.name} partition {self.partition} "
            f"in flight {len(self._inflight)}, unacknowledged {len(self._acks)}, "
            f"acknowledged {self.acknowledged}{', draining' if self._draining else ''}>"
        )

    # -- the source of events --

    def _internal(self, error: BaseException) -> BaseException:
        self._failure = error
        return error

    def _release(self) -> None:
        """Give the used-up batch back to the fetcher's accounting."""
        if self._holding:
            state = self._state
            state.batches_out -= 1
            state.entries_out -= self._holding
            self._holding = 0
            self._fetcher._room_freed(state)

    def _check_lease(self) -> None:
        """Refuse to hand out another event once the lease is gone.

        Reads and acknowledgements are fenced in Redis, but events already fetched
        sit in the buffer: a worker frozen past its lease (SIGSTOP, a long GC pause)
        would otherwise process them on waking, before its lease keeper (frozen too)
        notices, although a new owner may be processing the same events. The lease's
        local deadline tells without a round trip.

        Raises:
            LockLost: the lease was lost, or its local deadline has passed.
        """
        held = self._state.held
        if held.lost_reason is None and trio.current_time() < local_deadline(held.lease):
            return
        if held.lost_reason is None:
            log.warning(
                "lease on %r ran out unnoticed (was the process paused?); handing out no "
                "more events of %s partition %d",
                held.name,
                self.stream.name,
                self.partition,
            )
            held._lose("the lease ran out before it could be extended")
        assert held.lost_reason is not None
        raise self._internal(LockLost(held.name, held.lost_reason))

    def _check_failure(self) -> None:
        failure = self._state.failure
        if failure is not None:
            raise self._internal(failure)

    async def _next_batch(self, deadline: float, *, wake: bool) -> bool:
        """Load the next batch into the buffer; ``False`` if ``deadline`` passed first.

        Raises:
            _Stop: draining began (only with ``wake``).
            StreamkitError: the fetcher stopped serving the partition (lease lost).
        """
        if self._acks:
            await self._flush()
        self._release()
        state = self._state
        while True:
            self._check_failure()
            if wake and self._draining:
                raise _Stop
            try:
                batch = state.receive.receive_nowait()
                # Let the fetcher run (and refill) between batches.
                await trio.lowlevel.checkpoint()
            except trio.WouldBlock:
                with trio.CancelScope(deadline=deadline) as scope:
                    if wake:
                        self._wait_scope = scope
                    try:
                        batch = await state.receive.receive()
                    except trio.EndOfChannel:
                        continue
                    finally:
                        if wake:
                            self._wait_scope = None
                if scope.cancelled_caught:
                    if wake and self._draining:
                        raise _Stop from None
                    return False
            except trio.EndOfChannel:
                self._check_failure()
                raise self._internal(
                    StreamkitError(f"partition {self.partition} is no longer served")
                ) from None
            self._buffer = batch
            self._pos = 0
            self._holding = len(batch)
            return True

    async def _screen(self, event: Event[R]) -> bool:
        """Divert a poison event; return whether it was diverted."""
        if event.delivery_count > self._max_deliveries:
            await self._divert_event(event, None, "poison")
            return True
        return False

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

    # -- middleware pump --

    async def _next_from_pump(self, deadline: float) -> Event[R] | None:
        if self._pump_receive is None:
            self._start_pump()
        assert self._pump_receive is not None
        if self._draining:
            raise _Stop
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
        nursery = self._fetcher._nursery
        if nursery is None:
            raise StreamkitError("the fetcher is closed")
        self._dispatched = collections.deque()
        chain: AsyncIterator[Event[Any]] = _Base(self)
        for middleware in self._middleware:
            chain = middleware(chain)
        send, receive = trio.open_memory_channel[Event[R] | _PumpError](0)
        self._pump_receive = receive
        self._pump_scope = trio.CancelScope()
        nursery.start_soon(self._pump, chain, send, self._pump_scope)

    async def _pump(
        self,
        chain: AsyncIterator[Event[R]],
        send: trio.MemorySendChannel[Event[R] | _PumpError],
        scope: trio.CancelScope,
    ) -> None:
        with scope, send:
            try:
                async for event in chain:
                    await send.send(event)
            except Exception as exc:
                await send.send(_PumpError(exc))
            finally:
                aclose = getattr(chain, "aclose", None)
                if aclose is not None:
                    with trio.move_on_after(1) as closing:
                        closing.shield = True
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

    # -- acknowledgement --

    def _move_past_now(self) -> None:
        """Mark the in-flight events done (acknowledged at the next flush)."""
        inflight = self._inflight
        self._inflight = []
        dispatched = self._dispatched
        if dispatched is None:
            if len(inflight) == 1:
                self._acks.append(inflight[0].entry_id)
            else:
                self._acks.extend([e.entry_id for e in inflight])
            return
        # Everything the middleware was given up to the last event yielded is done:
        # events before it that never reached us were filtered out.
        last = inflight[-1]
        while dispatched:
            event = dispatched.popleft()
            self._acks.append(event.entry_id)
            if event is last:
                return
        # A replayed event that the current chain never saw.
        for event in inflight:
            if event.entry_id not in self._acks:
                self._acks.append(event.entry_id)

    async def _move_past(self) -> None:
        self._move_past_now()
        if len(self._acks) >= self._ack_batch:
            await self._flush()

    async def _divert_event(
        self, event: Event[R], error: BaseException | None, reason: str
    ) -> None:
        """Hand an event that must not reach the processor to the policy hook, then ack it."""
        if self._divert is None:
            if error is not None:
                raise error
            return
        await self._divert(event, error, reason)
        if self._dispatched is not None:
            with contextlib.suppress(ValueError):
                self._dispatched.remove(event)
        self._acks.append(event.entry_id)
        if len(self._acks) >= self._ack_batch:
            await self._flush()

    def _rewind(self) -> None:
        """Deliver the in-flight events again, first (a retry in place)."""
        inflight = self._inflight
        self._inflight = []
        dispatched = self._dispatched
        if dispatched is not None and inflight:
            # Events before the first in-flight one were filtered out: done.
            while dispatched and dispatched[0] is not inflight[0]:
                self._acks.append(dispatched.popleft().entry_id)
        self._replay = inflight + self._replay

    async def _flush(self) -> None:
        """Acknowledge the events moved past (fenced)."""
        if not self._acks:
            return
        ids, self._acks = self._acks, []
        try:
            await self._fetcher._ack(self._state, ids)
        except BaseException as exc:
            # Keep them for a later attempt; they are pending in Redis either way.
            self._acks[:0] = ids
            if isinstance(exc, StreamkitError):
                self._internal(exc)
            raise
        self.acknowledged += len(ids)

    async def _stop(self) -> None:
        """Flush and end the iteration."""
        await self._flush()
        raise StopAsyncIteration

    def _drain(self) -> None:
        self._draining = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    async def _finish(self, *, commit: bool) -> None:
        """Leaving the partition: stop the pump, flush (committing in-flight if ``commit``)."""
        self._stop_pump()
        if commit and self._inflight:
            self._move_past_now()
        self._release()
        if self._state.held.lost_reason is None:
            await self._flush()


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
    __slots__ = ("_decode", "_events")

    def __init__(self, events: Events[Any], *, decode: bool) -> None:
        self._events = events
        self._decode = decode

    async def __anext__(self) -> T:
        events = self._events
        while True:
            if events._inflight:
                await events._move_past()
            if events._draining or events._is_draining():
                await events._stop()
            try:
                event = await events._next()
            except _Stop:
                await events._stop()
            assert event is not None
            events._check_lease()
            events._inflight = [event]
            if not self._decode:
                return event  # type: ignore[return-value]
            try:
                return event.record  # type: ignore[no-any-return]
            except DecodeError as exc:
                if events._divert is None:
                    raise
                events._inflight = []
                await events._divert_event(event, exc, "undecodable")


class _Batches(AsyncIterator[list[T]]):
    __slots__ = ("_decode", "_events", "_n", "_stopped", "_within")

    def __init__(self, events: Events[Any], n: int, within: float | None, *, decode: bool) -> None:
        if not (isinstance(n, int) and n >= 1):
            raise ValueError(f"take() needs a positive batch size, got {n!r}")
        if within is not None and not within >= 0:
            raise ValueError(f"within must be a number of seconds >= 0, got {within!r}")
        self._events = events
        self._n = n
        self._within = math.inf if within is None else within
        self._decode = decode
        self._stopped = False

    async def __anext__(self) -> list[T]:
        events = self._events
        if events._inflight:
            await events._move_past()
        if self._stopped or events._is_draining():
            await events._stop()
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
                    if not batch:
                        await events._stop()
                    self._stopped = True
                    break
                if event is None:
                    break
                ready = [event]
            if deadline == math.inf:
                deadline = trio.current_time() + self._within
            for event in ready:
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
                batch.append(event)
        if batch:
            events._check_lease()
        events._inflight = batch
        if not batch:
            # Every event was diverted, and the deadline passed: nothing to yield.
            return await self.__anext__()
        return out if decode else batch  # type: ignore[return-value]
