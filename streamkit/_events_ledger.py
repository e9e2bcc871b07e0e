"""The ledger of one partition's delivery: which events are buffered, handed out, done.

Pure bookkeeping, no I/O and no waiting: :class:`~streamkit.Events` and its iterators
drive it with the verbs below, and the commit of a partition takes what it holds.

* the current batch's events are *buffered*, handed out from :attr:`Ledger.pos` on;
* events handed to the processor are *in flight* (:attr:`Ledger.inflight`);
* once the processor moves past them they are *done* (:meth:`Ledger.move_past`): their
  ids wait in :attr:`Ledger.done` for the next commit, which acknowledges them;
* a policy runner may *rewind* in-flight events instead (:meth:`Ledger.rewind`): they
  are *replayed*, handed out again first and in order;
* an event that never reached the processor (poison, undecodable) can be *skipped*
  (:meth:`Ledger.skip`): done without being processed.

The buffer is the batch itself, its ids and its records decoded at once, not one
:class:`~streamkit.Event` per entry: an event object is made only when something asks
for one (:meth:`Ledger.event_at`: ``raw()``, the middleware, a poison or undecodable
entry, a policy runner looking at the events in flight). The iterators' fast paths
hand out records straight from the buffer, and what is in flight is then a *span* of
the buffer, :attr:`Ledger.span_lo` to :attr:`Ledger.span_hi`, made into event objects
only if something asks for them.

The *effects* of the events (a stateful processor's table writes and emitted
records, see :mod:`streamkit._state`) follow them: promoted when the processor moves
past the events in flight, discarded when they are rewound.

With middleware, the chain may drop events: the ledger keeps the events given to the
chain in :attr:`Ledger.dispatched`, and moving past an event the chain yielded makes
everything it was given before that event done too.
"""

from __future__ import annotations

import collections
import contextlib
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._event import Event
    from ._feed import Batch

__all__ = ["Effects", "Ledger"]

R = TypeVar("R")


class Effects(Protocol):
    """The effects of the events in flight (:class:`~streamkit._state.PartitionState`)."""

    def promote(self) -> None:
        """The events in flight were processed: their effects are done."""
        ...

    def discard(self) -> None:
        """The events in flight failed: forget their effects."""
        ...


class Ledger(Generic[R]):
    """The buffered, in-flight, replayed and done events of one partition.

    Attributes:
        batch: the batch the buffer holds, until it is reported finished.
        ids: the ids of the buffered batch's entries.
        records: their records, decoded with the batch (an entry the batch decoding
            missed holds :data:`~streamkit._event.UNDECODED`), or ``None`` when the
            batch was not decoded.
        size: the number of buffered entries.
        pos: the next buffered entry to hand on.
        clean: whether every entry of the buffer is decoded and none is poison: the
            iterators may hand out its records straight.
        span_lo: with :attr:`span_hi`, the buffer positions in flight that no event
            object stands for (the iterators' fast paths); none when equal.
        span_hi: see :attr:`span_lo`.
        replay: rewound (or taken but not handed out) events, handed out first.
        handed: the in-flight event objects (besides the span).
        done: ids of the events that are done and not yet committed.
        dispatched: with middleware, the events given to the chain and not settled.
        effects: the effects of the events in flight, if the processor keeps state.
    """

    __slots__ = (
        "_events",
        "_front",
        "_make",
        "batch",
        "clean",
        "dispatched",
        "done",
        "effects",
        "handed",
        "ids",
        "pos",
        "records",
        "replay",
        "size",
        "span_hi",
        "span_lo",
    )

    def __init__(
        self,
        effects: Effects | None = None,
        make_events: Callable[[Batch, list[Any] | None], list[Event[R]]] | None = None,
    ) -> None:
        self.effects = effects
        # Makes the event objects of a batch, given its records if decoded (pure).
        self._make = make_events
        self.batch: Batch | None = None
        self.ids: list[bytes] = []
        self.records: list[Any] | None = None
        self.size = 0
        self.pos = 0
        self.clean = False
        # The buffer's event objects, once made.
        self._events: list[Event[R]] | None = None
        # Events a dead middleware chain had taken, handed on before the buffer.
        self._front: list[Event[R]] = []
        self.span_lo = 0
        self.span_hi = 0
        self.replay: list[Event[R]] = []
        self.handed: list[Event[R]] = []
        self.done: list[bytes] = []
        self.dispatched: collections.deque[Event[R]] | None = None

    # -- the buffer --

    def load(self, batch: Batch, records: list[Any] | None = None, *, clean: bool = False) -> None:
        """Buffer ``batch``, to be handed on from its first entry.

        Args:
            batch: the batch.
            records: its entries' records, decoded at once (or ``None``).
            clean: whether every record is decoded and no entry is poison.
        """
        if self.span_hi > self.span_lo:
            # Events of the batch before stay in flight: as objects from now on.
            self.handed = self.inflight
        self.batch = batch
        self.ids = batch.ids
        self.records = records
        self.size = len(batch.ids)
        self.pos = 0
        self.clean = clean and records is not None
        self._events = None

    def finish_batch(self) -> Batch | None:
        """Forget the current batch; return it if there was one (to report it done)."""
        batch, self.batch = self.batch, None
        return batch

    def event_at(self, index: int) -> Event[R]:
        """The event object of buffered entry ``index`` (the buffer's are made at once,
        the first time one is asked for)."""
        events = self._events
        if events is None:
            assert self.batch is not None
            assert self._make is not None
            events = self._events = self._make(self.batch, self.records)
        return events[index]

    def has_buffered(self) -> bool:
        """Whether buffered events remain to be handed on."""
        return self.pos < self.size or bool(self._front)

    def next_buffered(self) -> Event[R] | None:
        """The next buffered event (no replay, no middleware), or ``None``."""
        if self._front:
            return self._front.pop(0)
        pos = self.pos
        if pos < self.size:
            self.pos = pos + 1
            return self.event_at(pos)
        return None

    def take_ready(self, n: int, *, direct: bool) -> list[Event[R]]:
        """Up to ``n`` events available without waiting: replayed ones first, then (if
        ``direct``, that is without middleware) buffered ones."""
        if self.replay:
            ready, self.replay = self.replay[:n], self.replay[n:]
            return ready
        if not direct:
            return []
        ready = self._front[:n]
        del self._front[:n]
        pos = self.pos
        end = min(self.size, pos + n - len(ready))
        ready.extend(self.event_at(i) for i in range(pos, end))
        self.pos = end
        return ready

    def take_span(self, n: int) -> tuple[int, int]:
        """Take the next ``n`` buffered entries, if the buffer is clean and holds that
        many, for a fast path that hands out their records straight; ``(lo, hi)``
        positions, empty if not."""
        pos = self.pos
        if self.clean and not self.replay and not self._front and self.size - pos >= n:
            self.pos = pos + n
            return pos, pos + n
        return pos, pos

    def next_replayed(self) -> Event[R] | None:
        """The first replayed event, or ``None``."""
        return self.replay.pop(0) if self.replay else None

    def put_back(self, events: list[Event[R]]) -> None:
        """Hand ``events`` (taken but not handed out) out next, before anything else."""
        if events:
            self.replay[:0] = events

    # -- handing out and moving past --

    @property
    def inflight(self) -> list[Event[R]]:
        """The events the processor holds and has not moved past, as event objects."""
        lo, hi = self.span_lo, self.span_hi
        if hi > lo:
            self.span_lo = self.span_hi = 0
            self.handed = [*self.handed, *(self.event_at(i) for i in range(lo, hi))]
        return self.handed

    def has_inflight(self) -> bool:
        """Whether the processor holds events it has not moved past."""
        return self.span_hi > self.span_lo or bool(self.handed)

    def inflight_count(self) -> int:
        """How many events the processor holds and has not moved past."""
        return self.span_hi - self.span_lo + len(self.handed)

    def hand_out(self, events: list[Event[R]]) -> None:
        """``events`` are now in flight (the processor holds them)."""
        self.span_lo = self.span_hi = 0
        self.handed = events

    def hand_out_span(self, lo: int, hi: int) -> None:
        """Buffer positions ``lo`` to ``hi`` are now in flight (no event objects)."""
        self.handed = []
        self.span_lo = lo
        self.span_hi = hi

    def inflight_ids(self) -> list[bytes]:
        """The ids of the events in flight."""
        if self.span_hi > self.span_lo:
            return self.ids[self.span_lo : self.span_hi]
        return [e._id for e in self.handed]

    def move_past(self) -> None:
        """The processor moved past the in-flight events: they are done."""
        if self.effects is not None:
            self.effects.promote()
        lo, hi = self.span_lo, self.span_hi
        if hi > lo:
            # Straight from the buffer: no middleware, nothing else in flight.
            self.span_lo = self.span_hi = 0
            self.done.extend(self.ids[lo:hi])
            return
        inflight = self.handed
        if not inflight:
            return
        self.handed = []
        dispatched = self.dispatched
        if dispatched is None:
            self.done.extend([e._id for e in inflight])
            return
        # Everything the middleware was given up to the last event it yielded is
        # done: the events before it that never reached the processor were dropped.
        last = inflight[-1]
        while dispatched:
            event = dispatched.popleft()
            self.done.append(event._id)
            if event is last:
                return
        # Replayed events the current chain never saw.
        seen = set(self.done)
        self.done.extend([e._id for e in inflight if e._id not in seen])

    def rewind(self) -> None:
        """Hand the in-flight events out again, first and in order; their effects are
        discarded."""
        if self.effects is not None:
            self.effects.discard()
        inflight = self.inflight
        if not inflight:
            return
        self.handed = []
        dispatched = self.dispatched
        if dispatched is not None:
            # Events the middleware was given before the first in-flight one were
            # dropped by it: done.
            while dispatched and dispatched[0] is not inflight[0]:
                self.done.append(dispatched.popleft()._id)
        self.replay[:0] = inflight

    def discard(self) -> None:
        """The processing of the in-flight events failed: discard their effects."""
        if self.effects is not None:
            self.effects.discard()

    def skip(self, event: Event[R]) -> None:
        """``event`` never reached the processor and counts as done."""
        if self.dispatched is not None:
            with contextlib.suppress(ValueError):
                self.dispatched.remove(event)
        self.done.append(event._id)

    # -- committing --

    def take_done(self) -> list[bytes]:
        """The done ids, handed over to be committed (and forgotten here)."""
        done, self.done = self.done, []
        return done

    def restore_done(self, ids: list[bytes]) -> None:
        """Put back ``ids`` whose commit failed, in front of any done since."""
        self.done[:0] = ids

    # -- middleware --

    def start_dispatching(self) -> None:
        """A middleware chain takes the events from now on."""
        self.dispatched = collections.deque()

    def dispatch(self, event: Event[R]) -> None:
        """``event`` was given to the middleware chain."""
        assert self.dispatched is not None
        self.dispatched.append(event)

    def requeue_dispatched(self) -> None:
        """Put events a dead middleware chain had taken back in front of the buffer."""
        dispatched = self.dispatched
        if dispatched:
            self._front[:0] = dispatched
            dispatched.clear()

    def __repr__(self) -> str:
        return (
            f"<Ledger buffered {self.size - self.pos + len(self._front)}, replay "
            f"{len(self.replay)}, in flight {self.inflight_count()}, done {len(self.done)}>"
        )
