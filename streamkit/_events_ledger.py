"""The ledger of one partition's delivery: which events are buffered, handed out, done.

Pure bookkeeping, no I/O and no waiting: :class:`~streamkit.Events` and its iterators
drive it with the verbs below, and the commit of a partition takes what it holds.

* the current batch's events are *buffered*, handed out in order;
* events handed to the processor are *in flight* (:attr:`Ledger.inflight`);
* once the processor moves past them they are *done* (:meth:`Ledger.move_past`): their
  ids wait for the next commit (:meth:`Ledger.take_done`), which acknowledges them;
* a policy runner may *rewind* in-flight events instead (:meth:`Ledger.rewind`): they
  are *replayed*, handed out again first and in order;
* an event that never reached the processor (poison, undecodable) can be *skipped*
  (:meth:`Ledger.skip`): done without being processed.

The buffer is the batch itself, its ids and its records decoded at once, not one
:class:`~streamkit.Event` per entry: an event object is made only when something asks
for one (:meth:`Ledger.next_buffered`: ``raw()``, the middleware, a poison or
undecodable entry, a policy runner looking at the events in flight). The iterators'
fast paths hand out records straight from the buffer, and what is in flight is then a
*span* of the buffer, made into event objects only if something asks for them:
``take()`` hands out a span at a time (:meth:`Ledger.hand_out_span`); ``records()``
one record at a time along a *run* (:meth:`Ledger.start_run`,
:meth:`Ledger.next_record`), in which handing out the next record is all it takes to
move past the one before: the run keeps the records moved past as a span too, and any
other verb settles it first (ids into the done list, the record in flight into the
span in flight).

The *effects* of the events (a stateful processor's table writes and emitted
records, see :mod:`streamkit._state`) follow them: promoted when the processor moves
past the events in flight, discarded when they are rewound.

With middleware, the chain may drop events: the ledger keeps the events given to the
chain (:meth:`Ledger.dispatch`), and moving past an event the chain yielded makes
everything it was given before that event done too.
"""

from __future__ import annotations

import collections
import contextlib
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._event import Event
    from ._feed import Batch

__all__ = ["NO_RECORD", "Effects", "Ledger"]

R = TypeVar("R")

#: What :meth:`Ledger.next_record` returns when its run is over.
NO_RECORD: Final[Any] = object()


class Effects(Protocol):
    """The effects of the events in flight (:class:`~streamkit._state.PartitionState`)."""

    def promote(self) -> None:
        """The events in flight were processed: their effects are done."""
        ...

    def discard(self, *, late: str | None = None) -> None:
        """The events in flight failed: forget their effects. ``late``: the windowed
        table whose late event failed them (dead-lettered, so counted as late)."""
        ...


class Ledger(Generic[R]):
    """The buffered, in-flight, replayed and done events of one partition.

    Its state is its own: the iterators, the delivery and the policy runner's API
    change it through the verbs below only.
    """

    __slots__ = (
        "_batch",
        "_clean",
        "_dispatched",
        "_done",
        "_effects",
        "_events",
        "_front",
        "_handed",
        "_ids",
        "_make",
        "_pos",
        "_records",
        "_replay",
        "_run_end",
        "_run_lo",
        "_run_records",
        "_screened",
        "_size",
        "_span_hi",
        "_span_lo",
    )

    def __init__(
        self,
        effects: Effects | None = None,
        make_events: Callable[[Batch, list[Any] | None], list[Event[R]]] | None = None,
    ) -> None:
        # The effects of the events in flight, if the processor keeps state.
        self._effects = effects
        # Makes the event objects of a batch, given its records if decoded (pure).
        self._make = make_events
        # The batch the buffer holds, until it is reported finished; its entries' ids;
        # their records, decoded with the batch (an entry the batch decoding missed
        # holds UNDECODED), or None when the batch was not decoded.
        self._batch: Batch | None = None
        self._ids: list[bytes] = []
        self._records: list[Any] | None = None
        # The number of buffered entries, and the next one to hand on.
        self._size = 0
        self._pos = 0
        # Whether every entry is decoded and none is poison: its records may be handed
        # out straight.
        self._clean = False
        # Whether no entry is poison (delivered too often): its entries may be handed
        # out straight, undecoded (take_entry_span).
        self._screened = False
        # The buffer's event objects, once made.
        self._events: list[Event[R]] | None = None
        # Events a dead middleware chain had taken, handed on before the buffer.
        self._front: list[Event[R]] = []
        # The buffer positions in flight that no event object stands for (the
        # iterators' fast paths); none when equal.
        self._span_lo = 0
        self._span_hi = 0
        # The run of records() (start_run): from _run_lo, the records handed out so
        # far (to _pos), up to _run_end (0: no run). Those before _pos - 1 are done,
        # the one at _pos - 1 is in flight; _settle() says so in the fields above.
        self._run_lo = 0
        self._run_end = 0
        self._run_records: list[Any] = []
        # Rewound (or taken but not handed out) events, handed out first.
        self._replay: list[Event[R]] = []
        # The in-flight event objects (besides the span).
        self._handed: list[Event[R]] = []
        # Ids of the events that are done and not yet committed.
        self._done: list[bytes] = []
        # With middleware, the events given to the chain and not settled.
        self._dispatched: collections.deque[Event[R]] | None = None

    # -- the buffer --

    def load(
        self,
        batch: Batch,
        records: list[Any] | None = None,
        *,
        clean: bool = False,
        screened: bool = False,
    ) -> None:
        """Buffer ``batch``, to be handed on from its first entry.

        Args:
            batch: the batch.
            records: its entries' records, decoded at once (or ``None``).
            clean: whether every record is decoded and no entry is poison.
            screened: whether no entry is poison.
        """
        self._settle()
        if self._span_hi > self._span_lo:
            # Events of the batch before stay in flight: as objects from now on.
            self._handed = self.inflight
        self._batch = batch
        self._ids = batch.ids
        self._records = records
        self._size = len(batch.ids)
        self._pos = 0
        self._clean = clean and records is not None
        self._screened = screened or self._clean
        self._events = None

    def finish_batch(self) -> tuple[Batch, int] | None:
        """Forget the current batch; if there was one, return it and how many of its
        entries were handed on (to report it done, and time them)."""
        self._settle()
        batch, self._batch = self._batch, None
        return None if batch is None else (batch, self._pos)

    def _event_at(self, index: int) -> Event[R]:
        """The event object of buffered entry ``index`` (the buffer's are made at once,
        the first time one is asked for)."""
        events = self._events
        if events is None:
            assert self._batch is not None
            assert self._make is not None
            events = self._events = self._make(self._batch, self._records)
        return events[index]

    def has_buffered(self) -> bool:
        """Whether buffered events remain to be handed on."""
        return self._pos < self._size or bool(self._front)

    def next_buffered(self) -> Event[R] | None:
        """The next buffered event (no replay, no middleware), or ``None``."""
        self._settle()
        if self._front:
            return self._front.pop(0)
        pos = self._pos
        if pos < self._size:
            self._pos = pos + 1
            return self._event_at(pos)
        return None

    def take_ready(self, n: int, *, direct: bool) -> list[Event[R]]:
        """Up to ``n`` events available without waiting: replayed ones first, then (if
        ``direct``, that is without middleware) buffered ones."""
        self._settle()
        if self._replay:
            ready, self._replay = self._replay[:n], self._replay[n:]
            return ready
        if not direct:
            return []
        ready = self._front[:n]
        del self._front[:n]
        pos = self._pos
        end = min(self._size, pos + n - len(ready))
        ready.extend(self._event_at(i) for i in range(pos, end))
        self._pos = end
        return ready

    def take_span(self, n: int) -> tuple[int, int]:
        """Take the next ``n`` buffered entries, if the buffer is clean and holds that
        many, for a fast path that hands out their records straight; ``(lo, hi)``
        positions, empty if not."""
        self._settle()
        pos = self._pos
        if self._clean and not self._replay and not self._front and self._size - pos >= n:
            self._pos = pos + n
            return pos, pos + n
        return pos, pos

    def take_entry_span(self, n: int, *, decoded: bool = False) -> tuple[Batch, int, int] | None:
        """Hand out up to ``n`` buffered entries as they are (no event objects, no
        records), if nothing comes before them and none is poison (with ``decoded``:
        and the buffer is clean, every record decoded, see :meth:`records_of`): the
        batch and the positions now in flight, else ``None``."""
        self._settle()
        pos = self._pos
        end = min(self._size, pos + n)
        if not self._screened or self._replay or self._front or end <= pos:
            return None
        if decoded and not self._clean:
            return None
        assert self._batch is not None
        self._pos = end
        self._handed = []
        self._span_lo = pos
        self._span_hi = end
        return self._batch, pos, end

    def has_replay(self) -> bool:
        """Whether rewound (or put back) events are to be handed out first."""
        return bool(self._replay)

    def next_replayed(self) -> Event[R] | None:
        """The first replayed event, or ``None``."""
        self._settle()
        return self._replay.pop(0) if self._replay else None

    def put_back(self, events: list[Event[R]]) -> None:
        """Hand ``events`` (taken but not handed out) out next, before anything else."""
        self._settle()
        if events:
            self._replay[:0] = events

    # -- the run of records() --

    def start_run(self, ack_batch: int) -> bool:
        """Start handing out the buffer's records one by one (:meth:`next_record`), if
        it is clean, holds more, and nothing is replayed or in flight; whether it did.

        The run ends before the record whose moving past of the one before would make
        ``ack_batch`` events done, so that the caller commits them first.
        """
        self._settle()
        pos = self._pos
        if (
            not self._clean
            or pos >= self._size
            or self._replay
            or self._front
            or self._handed
            or self._span_hi > self._span_lo
        ):
            return False
        assert self._records is not None
        self._run_records = self._records
        self._run_lo = pos
        self._run_end = min(self._size, pos + max(1, ack_batch - len(self._done)))
        return True

    def next_record(self) -> Any:
        """Move past the record in flight and hand out the next one of the run; once the
        run is over (or was settled), :data:`NO_RECORD`, and nothing changes."""
        pos = self._pos
        if pos >= self._run_end:
            return NO_RECORD
        if self._effects is not None and pos > self._run_lo:
            self._effects.promote()
        self._pos = pos + 1
        return self._run_records[pos]

    def take_back(self) -> None:
        """The record :meth:`next_record` just returned never reached the processor (the
        iteration raised first): it is buffered again, the next to hand on."""
        self._settle()
        self._pos = self._span_lo
        self._span_lo = self._span_hi = 0

    def end_run(self) -> None:
        """End the run of records(): its next :meth:`next_record` is :data:`NO_RECORD`."""
        self._settle()

    def _settle(self) -> None:
        """End the run, if any: its records moved past are done, the last one handed out
        is in flight (as a span)."""
        if not self._run_end:
            return
        self._run_end = 0
        lo, pos = self._run_lo, self._pos
        if pos > lo:
            self._done.extend(self._ids[lo : pos - 1])
            self._span_lo = pos - 1
            self._span_hi = pos

    # -- handing out and moving past --

    @property
    def inflight(self) -> list[Event[R]]:
        """The events the processor holds and has not moved past, as event objects."""
        self._settle()
        lo, hi = self._span_lo, self._span_hi
        if hi > lo:
            self._span_lo = self._span_hi = 0
            self._handed = [*self._handed, *(self._event_at(i) for i in range(lo, hi))]
        return self._handed

    def has_inflight(self) -> bool:
        """Whether the processor holds events it has not moved past."""
        if self._run_end:
            return self._pos > self._run_lo
        return self._span_hi > self._span_lo or bool(self._handed)

    def inflight_count(self) -> int:
        """How many events the processor holds and has not moved past."""
        self._settle()
        return self._span_hi - self._span_lo + len(self._handed)

    def hand_out(self, events: list[Event[R]]) -> None:
        """``events`` are now in flight (the processor holds them)."""
        self._settle()
        self._span_lo = self._span_hi = 0
        self._handed = events

    def records_of(self, lo: int, hi: int) -> list[Any]:
        """The records of buffer positions ``lo`` to ``hi`` of a clean buffer."""
        assert self._records is not None
        return self._records[lo:hi]

    def hand_out_span(self, lo: int, hi: int) -> list[Any]:
        """Buffer positions ``lo`` to ``hi`` (from :meth:`take_span`) are now in flight,
        no event objects made: their records."""
        assert self._records is not None
        self._settle()
        self._handed = []
        self._span_lo = lo
        self._span_hi = hi
        return self._records[lo:hi]

    def newest_inflight_id(self) -> bytes | None:
        """The id of the newest event the processor holds and has not moved past, if
        any (without settling a run: cheap enough for every table read)."""
        if self._run_end:
            return self._ids[self._pos - 1] if self._pos > self._run_lo else None
        if self._span_hi > self._span_lo:
            return self._ids[self._span_hi - 1]
        if self._handed:
            return self._handed[-1]._id
        return None

    def inflight_entries(self) -> list[tuple[bytes, list[bytes]]]:
        """The id and flat fields of each event in flight, in order (without settling a
        run, nor making event objects: for the processor's spans, streamkit._tracing)."""
        batch = self._batch
        if self._run_end:
            pos = self._pos
            if pos > self._run_lo and batch is not None:
                return [(self._ids[pos - 1], batch.entry_fields(pos - 1))]
            return []
        out = [(e._id, e.flat) for e in self._handed]
        lo, hi = self._span_lo, self._span_hi
        if hi > lo and batch is not None:
            out += [(self._ids[i], batch.entry_fields(i)) for i in range(lo, hi)]
        return out

    def inflight_ids(self) -> list[bytes]:
        """The ids of the events in flight."""
        self._settle()
        if self._span_hi > self._span_lo:
            return self._ids[self._span_lo : self._span_hi]
        return [e._id for e in self._handed]

    def move_past(self) -> None:
        """The processor moved past the in-flight events: they are done."""
        self._settle()
        if self._effects is not None:
            self._effects.promote()
        lo, hi = self._span_lo, self._span_hi
        if hi > lo:
            # Straight from the buffer: no middleware, nothing else in flight.
            self._span_lo = self._span_hi = 0
            self._done.extend(self._ids[lo:hi])
            return
        inflight = self._handed
        if not inflight:
            return
        self._handed = []
        dispatched = self._dispatched
        if dispatched is None:
            self._done.extend([e._id for e in inflight])
            return
        # Everything the middleware was given up to the last event it yielded is
        # done: the events before it that never reached the processor were dropped.
        last = inflight[-1]
        while dispatched:
            event = dispatched.popleft()
            self._done.append(event._id)
            if event is last:
                return
        # Replayed events the current chain never saw.
        seen = set(self._done)
        self._done.extend([e._id for e in inflight if e._id not in seen])

    def rewind(self) -> None:
        """Hand the in-flight events out again, first and in order; their effects are
        discarded."""
        if self._effects is not None:
            self._effects.discard()
        inflight = self.inflight
        if not inflight:
            return
        self._handed = []
        dispatched = self._dispatched
        if dispatched is not None:
            # Events the middleware was given before the first in-flight one were
            # dropped by it: done.
            while dispatched and dispatched[0] is not inflight[0]:
                self._done.append(dispatched.popleft()._id)
        self._replay[:0] = inflight

    def discard(self, *, late: str | None = None) -> None:
        """The processing of the in-flight events failed: discard their effects (see
        :meth:`Effects.discard` for ``late``)."""
        if self._effects is not None:
            self._effects.discard(late=late)

    def skip(self, event: Event[R]) -> None:
        """``event`` never reached the processor and counts as done."""
        self._settle()
        if self._dispatched is not None:
            with contextlib.suppress(ValueError):
                self._dispatched.remove(event)
        self._done.append(event._id)

    # -- committing --

    def done_count(self) -> int:
        """How many events are done and not yet committed."""
        self._settle()
        return len(self._done)

    def take_done(self) -> list[bytes]:
        """The done ids, handed over to be committed (and forgotten here)."""
        self._settle()
        done, self._done = self._done, []
        return done

    def restore_done(self, ids: list[bytes]) -> None:
        """Put back ``ids`` whose commit failed, in front of any done since."""
        self._settle()
        self._done[:0] = ids

    # -- middleware --

    def start_dispatching(self) -> None:
        """A middleware chain takes the events from now on."""
        self._settle()
        self._dispatched = collections.deque()

    def dispatch(self, event: Event[R]) -> None:
        """``event`` was given to the middleware chain."""
        assert self._dispatched is not None
        self._dispatched.append(event)

    def requeue_dispatched(self) -> None:
        """Put events a dead middleware chain had taken back in front of the buffer."""
        self._settle()
        dispatched = self._dispatched
        if dispatched:
            self._front[:0] = dispatched
            dispatched.clear()

    def __repr__(self) -> str:
        return (
            f"<Ledger buffered {self._size - self._pos + len(self._front)}, replay "
            f"{len(self._replay)}, in flight {self.inflight_count()}, "
            f"done {self.done_count()}>"
        )
