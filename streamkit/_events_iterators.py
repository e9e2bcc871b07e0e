"""The iterators a processor uses: one event at a time, or batches of up to ``n``.

Both drive a :class:`~streamkit._events_delivery.Delivery` and its ledger through
their verbs. Asking for the next event (or batch) moves past the previous one: it is
done, and committed with the partition's next read once ``ack_batch`` are done (and
before every wait). The one-by-one iterator keeps its hot path to a few attribute
reads per event when the next event is already buffered.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from ._errors import DecodeError
from ._events_delivery import Stop
from ._meter import TIMING
from ._validate import non_negative_number

if TYPE_CHECKING:
    from ._event import Event
    from ._events_delivery import Delivery

__all__ = ["Batches", "OneByOne"]

T = TypeVar("T")


class OneByOne(AsyncIterator[T]):
    """``records()`` (decoded) and ``raw()`` (:class:`~streamkit.Event` objects)."""

    __slots__ = ("_decode", "_delivery", "_held")

    def __init__(self, delivery: Delivery[Any], *, decode: bool) -> None:
        self._delivery = delivery
        self._decode = decode
        self._held = delivery.feed.held
        delivery.by_batch = False

    async def __anext__(self) -> T:
        delivery = self._delivery
        ledger = delivery.ledger
        while True:
            # Move past the previous event.
            inflight = ledger.inflight
            if inflight:
                if len(inflight) == 1 and ledger.dispatched is None:
                    ledger.done.append(inflight[0]._id)
                    ledger.inflight = []
                    if ledger.effects is not None:
                        ledger.effects.promote()
                else:
                    ledger.move_past()
                if len(ledger.done) >= delivery.ack_batch:
                    delivery.commit_soon()
            if delivery.draining or delivery.is_draining():
                await delivery.stop()
            # The next event: straight from the batch when nothing else comes first.
            pos = ledger.pos
            buffer = ledger.buffer
            if pos < len(buffer) and not ledger.replay and not delivery.middleware:
                await trio.lowlevel.checkpoint_if_cancelled()
                event = buffer[pos]
                ledger.pos = pos + 1
                if event.delivery_count > delivery.max_deliveries and await delivery.screen(event):
                    continue
            else:
                try:
                    next_event = await delivery.next_event()
                except Stop:
                    await delivery.stop()
                assert next_event is not None
                event = next_event
            # The lease, against its cached local deadline.
            if not (
                self._held.lost_reason is None
                and trio.current_time() < delivery.lease_deadline
                and delivery.feed.failure is None
            ):
                delivery.check_lease()
            ledger.inflight = [event]
            if not self._decode:
                return event  # type: ignore[return-value]
            try:
                return event._decode(event._flat, event._id)  # type: ignore[no-any-return]
            except DecodeError as exc:
                if delivery.divert is None:
                    raise
                ledger.inflight = []
                await delivery.divert_event(event, exc, "undecodable")


class Batches(AsyncIterator[list[T]]):
    """``take(n)`` (decoded records) and ``take_raw(n)`` (:class:`~streamkit.Event` s)."""

    __slots__ = ("_decode", "_delivery", "_handed_at", "_n", "_stopped", "_within")

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
        self._stopped = False
        # When the batch in flight was handed out, if latencies are timed (else 0).
        self._handed_at = 0.0
        delivery.by_batch = True

    async def __anext__(self) -> list[T]:
        delivery = self._delivery
        ledger = delivery.ledger
        if ledger.inflight:
            if self._handed_at:
                delivery.time_batch(ledger.inflight, self._handed_at)
                self._handed_at = 0.0
            ledger.move_past()
            delivery.commit_if_due()
        # Every event gathered may be diverted: then gather again, until a batch has
        # something to yield or the iteration stops.
        while True:
            if self._stopped or delivery.is_draining():
                await delivery.stop()
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
                try:
                    if event.delivery_count > max_deliveries and await delivery.screen(event):
                        continue
                    if decode:
                        try:
                            out.append(event.record)
                        except DecodeError as exc:
                            if delivery.divert is None:
                                ledger.hand_out([*batch, event])
                                raise
                            await delivery.divert_event(event, exc, "undecodable")
                            continue
                except BaseException:
                    if ledger.inflight and ledger.inflight[-1] is event:
                        # An undecodable record with no hook: the batch so far and
                        # the event are in flight, for the caller to settle.
                        ledger.put_back(ready[i + 1 :])
                    else:
                        # The divert hook raised: nothing gathered was settled.
                        ledger.put_back([*batch, *ready[i:]])
                    raise
                batch.append(event)
        return batch, out
