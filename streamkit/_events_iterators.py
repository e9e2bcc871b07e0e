"""The iterators a processor uses: one event at a time, or batches of up to ``n``.

Both drive a :class:`~streamkit._events_delivery.Delivery` and its ledger through
their verbs. Asking for the next event (or batch) moves past the previous one: it is
done, and committed with the partition's next read once ``ack_batch`` are done (and
before every wait). Both hand out records straight from a buffer that is all decoded
and free of poison (see :class:`~streamkit._events_ledger.Ledger`): no event object is
made for them. The one-by-one iterator hands them out along the ledger's run: per
event, one verb (:meth:`~streamkit._events_ledger.Ledger.next_record`), the draining
flag, the cancellation check and the lease against its cached local deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from ._errors import DecodeError
from ._events_delivery import Stop
from ._events_ledger import NO_RECORD
from ._meter import TIMING
from ._validate import non_negative_number

if TYPE_CHECKING:
    from ._event import Event
    from ._events_delivery import Delivery
    from ._feed import Batch
    from ._tracing import ProcessorSpans

__all__ = ["Batches", "Entries", "EntrySpan", "OneByOne", "Traced"]


class EntrySpan:
    """Entries as :class:`Entries` hands them out: their ids, and their flat field
    lists (:attr:`fields`), or the values of their one field (:meth:`values_of`).

    Attributes:
        ids: the entries' ids, in order.
        records: their records, if the iterator decodes them (else ``None``).
    """

    __slots__ = ("_batch", "_fields", "_hi", "_lo", "ids", "records")

    def __init__(
        self,
        ids: list[bytes],
        fields: list[list[bytes]] | None = None,
        batch: Batch | None = None,
        lo: int = 0,
        hi: int = 0,
        records: list[Any] | None = None,
    ) -> None:
        self.ids = ids
        self._fields = fields
        self._batch = batch
        self._lo = lo
        self._hi = hi
        self.records = records

    @property
    def fields(self) -> list[list[bytes]]:
        """Each entry's flat field list ``[name, value, ...]``."""
        fields = self._fields
        if fields is None:
            assert self._batch is not None
            fields = self._fields = self._batch.fields[self._lo : self._hi]
        return fields

    def values_of(self, field: bytes) -> list[bytes] | None:
        """Each entry's value of ``field``, if that is every entry's one field (without
        a list per entry), else ``None``."""
        if self._batch is not None and self._fields is None:
            return self._batch.values_of(field, self._lo, self._hi)
        fields = self.fields
        if all(len(f) == 2 and f[0] == field for f in fields):
            return [f[1] for f in fields]
        return None


T = TypeVar("T")


class OneByOne(AsyncIterator[T]):
    """``records()`` (decoded) and ``raw()`` (:class:`~streamkit.Event` objects)."""

    __slots__ = (
        "_decode",
        "_delivery",
        "_direct",
        "_draining",
        "_feed",
        "_held",
        "_lease_until",
        "_ledger",
        "_now",
    )

    def __init__(self, delivery: Delivery[Any], *, decode: bool) -> None:
        self._delivery = delivery
        self._ledger = delivery.ledger
        self._decode = decode
        self._feed = delivery.feed
        self._held = delivery.feed.held
        # Without middleware, events come straight from the buffer.
        self._direct = not delivery.middleware
        self._draining = delivery.drain_source
        # The clock's own current_time() once running (a few calls fewer per event),
        # and the lease's local deadline as last checked (Delivery.check_lease).
        self._now = trio.current_time
        self._lease_until = -math.inf
        delivery.start_iterator(decode=decode, by_batch=False)

    async def __anext__(self) -> T:
        # The fast path: the next record of the ledger's run (handing it out moves
        # past the one before), unless the partition is draining.
        source = self._draining
        if source is None or not source.value:
            ledger = self._ledger
            record = ledger.next_record()
            if record is not NO_RECORD:
                try:
                    await trio.lowlevel.checkpoint_if_cancelled()
                    if not (
                        self._held.lost_reason is None
                        and self._now() < self._lease_until
                        and self._feed.failure is None
                    ):
                        self._lease_until = self._delivery.check_lease()
                except BaseException:
                    ledger.take_back()
                    raise
                return record  # type: ignore[no-any-return]
        return await self._next()

    async def _next(self) -> T:
        """The general path: between runs, with draining, middleware, replayed events,
        a buffer that is not clean, and for ``raw()``."""
        delivery = self._delivery
        ledger = self._ledger
        self._now = trio.lowlevel.current_clock().current_time
        while True:
            # Move past the previous event.
            if ledger.has_inflight():
                ledger.move_past()
                await delivery.settle_and_commit_if_due()
            if delivery.is_draining():
                delivery.drain()
                await delivery.stop()
            direct = self._direct and not ledger.has_replay()
            if direct and not ledger.has_buffered():
                # The buffer is used up: load the next batch.
                try:
                    await delivery.next_batch(math.inf, wake=True)
                except Stop:
                    await delivery.stop()
                continue
            if direct and self._decode and ledger.start_run(delivery.ack_batch):
                # Decoded with its batch, and no poison: the records, no events.
                record = ledger.next_record()
                try:
                    await trio.lowlevel.checkpoint_if_cancelled()
                    self._check_lease()
                except BaseException:
                    ledger.take_back()
                    raise
                return record  # type: ignore[no-any-return]
            if direct:
                await trio.lowlevel.checkpoint_if_cancelled()
                buffered = ledger.next_buffered()
                assert buffered is not None
                event = buffered
                if event.delivery_count > delivery.max_deliveries and await delivery.screen(event):
                    continue
            else:
                try:
                    next_event = await delivery.next_event()
                except Stop:
                    await delivery.stop()
                assert next_event is not None
                event = next_event
            self._check_lease()
            ledger.hand_out([event])
            if not self._decode:
                return event  # type: ignore[return-value]
            try:
                return event.record  # type: ignore[no-any-return]
            except DecodeError as exc:
                if delivery.divert is None:
                    raise
                ledger.hand_out([])
                await delivery.divert_event(event, exc, "undecodable")

    def _check_lease(self) -> None:
        # The lease, against its cached local deadline (Delivery.check_lease).
        if not (
            self._held.lost_reason is None
            and self._now() < self._lease_until
            and self._feed.failure is None
        ):
            self._lease_until = self._delivery.check_lease()


class Batches(AsyncIterator[list[T]]):
    """``take(n)`` (decoded records) and ``take_raw(n)`` (:class:`~streamkit.Event` s)."""

    __slots__ = ("_decode", "_delivery", "_direct", "_handed_at", "_n", "_stopped", "_within")

    def __init__(
        self, delivery: Delivery[Any], n: int, within: float | None, *, decode: bool
    ) -> None:
        if not (isinstance(n, int) and n >= 1):
            raise ValueError(f"take() needs a positive batch size, got {n!r}")
        non_negative_number.or_none().check("within", within)
        self._delivery = delivery
        self._n = n
        self._within = math.inf if within is None else within
        self._decode = decode
        self._direct = not delivery.middleware
        self._stopped = False
        # When the batch in flight was handed out, if latencies are timed (else 0).
        self._handed_at = 0.0
        delivery.start_iterator(decode=decode, by_batch=True)

    async def __anext__(self) -> list[T]:
        delivery = self._delivery
        ledger = delivery.ledger
        if ledger.has_inflight():
            if self._handed_at:
                delivery.time_batch(ledger.inflight_ids(), self._handed_at)
                self._handed_at = 0.0
            ledger.move_past()
            await delivery.settle_and_commit_if_due()
        # Every event gathered may be diverted: then gather again, until a batch has
        # something to yield or the iteration stops.
        while True:
            if self._stopped or delivery.is_draining():
                await delivery.stop()
            if self._decode and self._direct and not ledger.has_replay():
                # A whole batch of records straight from a clean buffer: no events.
                await trio.lowlevel.checkpoint_if_cancelled()
                if not ledger.has_buffered():
                    try:
                        await delivery.next_batch(math.inf, wake=True)
                    except Stop:
                        self._stopped = True
                        continue
                lo, hi = ledger.take_span(self._n)
                if hi > lo:
                    delivery.check_lease()
                    records = ledger.hand_out_span(lo, hi)
                    if TIMING.on:
                        self._handed_at = time.perf_counter()
                    return records
            batch, out = await self._gather()
            if batch:
                delivery.check_lease()
                ledger.hand_out(batch)
                if TIMING.on:
                    self._handed_at = time.perf_counter()
                return out if self._decode else batch  # type: ignore[return-value]

    async def _gather(self) -> tuple[list[Event[Any]], list[Any]]:
        """Up to ``n`` events (and their records), screened; may be empty."""
        delivery = self._delivery
        ledger = delivery.ledger
        n = self._n
        decode = self._decode
        max_deliveries = delivery.max_deliveries
        batch: list[Event[Any]] = []
        out: list[Any] = []
        deadline = math.inf
        while len(batch) < n:
            ready = delivery.take_ready(n - len(batch))
            if not ready:
                try:
                    event = await delivery.next_event(deadline)
                except Stop:
                    self._stopped = True
                    break
                if event is None:
                    break
                ready = [event]
            if deadline == math.inf:
                deadline = trio.current_time() + self._within
            for i, event in enumerate(ready):
                handed_out = False
                try:
                    if event.delivery_count > max_deliveries and await delivery.screen(event):
                        continue
                    if decode:
                        try:
                            out.append(event.record)
                        except DecodeError as exc:
                            if delivery.divert is None:
                                ledger.hand_out([*batch, event])
                                handed_out = True
                                raise
                            await delivery.divert_event(event, exc, "undecodable")
                            continue
                except BaseException:
                    if handed_out:
                        # An undecodable record with no hook: the batch so far and
                        # the event are in flight, for the caller to settle.
                        ledger.put_back(ready[i + 1 :])
                    else:
                        # The divert hook raised: nothing gathered was settled.
                        ledger.put_back([*batch, *ready[i:]])
                    raise
                batch.append(event)
        return batch, out


class Entries(Batches[Any]):
    """Batches of up to ``n`` entries as stored, their ids and flat field lists, for
    streamkit's own processors that read entries as they are (a join's forwarders and
    the join): straight from the buffer, no event objects, whatever is buffered (up to
    ``n``) at once; else gathered as :class:`Batches` gathers events (replayed events,
    poison to screen), and given the same way.

    With ``decode``, each span carries its entries' records too, decoded a batch at a
    time as :meth:`~streamkit.Events.records` decodes them; a batch with an entry that
    does not decode is gathered, and that entry diverted (dead-lettered, by default)
    alone, as by ``records()``."""

    __slots__ = ()

    def __init__(self, delivery: Delivery[Any], n: int, *, decode: bool = False) -> None:
        super().__init__(delivery, n, 0, decode=decode)

    def __aiter__(self) -> Entries:
        return self

    async def __anext__(self) -> EntrySpan:  # type: ignore[override]
        delivery = self._delivery
        ledger = delivery.ledger
        if ledger.has_inflight():
            if self._handed_at:
                delivery.time_batch(ledger.inflight_ids(), self._handed_at)
                self._handed_at = 0.0
            ledger.move_past()
            await delivery.settle_and_commit_if_due()
        while True:
            if self._stopped or delivery.is_draining():
                await delivery.stop()
            if self._direct and not ledger.has_replay():
                await trio.lowlevel.checkpoint_if_cancelled()
                if not ledger.has_buffered():
                    try:
                        await delivery.next_batch(math.inf, wake=True)
                    except Stop:
                        self._stopped = True
                        continue
                decode = self._decode
                span = ledger.take_entry_span(self._n, decoded=decode)
                if span is not None:
                    delivery.check_lease()
                    if TIMING.on:
                        self._handed_at = time.perf_counter()
                    batch, lo, hi = span
                    records = ledger.records_of(lo, hi) if decode else None
                    return EntrySpan(batch.ids[lo:hi], batch=batch, lo=lo, hi=hi, records=records)
            events, out = await self._gather()
            if events:
                delivery.check_lease()
                ledger.hand_out(events)
                if TIMING.on:
                    self._handed_at = time.perf_counter()
                return EntrySpan(
                    [e._id for e in events],
                    [e.flat for e in events],
                    records=out if self._decode else None,
                )


class Traced(AsyncIterator[T]):
    """An iterator of :class:`OneByOne` or :class:`Batches` whose every item is handled
    in a span (:class:`~streamkit._tracing.ProcessorSpans`): asking for the next one
    ends the span of the one before, and opens the next one's once it is handed out.
    Used only with a tracer provider set; the iterators themselves know nothing of it."""

    __slots__ = ("_batch", "_inner", "_spans")

    def __init__(self, inner: AsyncIterator[T], spans: ProcessorSpans, *, batch: bool) -> None:
        self._inner = inner
        self._spans = spans
        self._batch = batch

    async def __anext__(self) -> T:
        self._spans.end()
        item = await self._inner.__anext__()
        self._spans.begin(batch=self._batch)
        return item
