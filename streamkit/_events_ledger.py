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
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
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
        buffer: the current batch's events; those before :attr:`pos` were handed on.
        pos: the next buffered event to hand on.
        batch: the batch the buffer came from, until it is reported finished.
        replay: rewound (or taken but not handed out) events, handed out first.
        inflight: the events the processor holds and has not moved past.
        done: ids of the events that are done and not yet committed.
        dispatched: with middleware, the events given to the chain and not settled.
        effects: the effects of the events in flight, if the processor keeps state.
    """

    __slots__ = ("batch", "buffer", "dispatched", "done", "effects", "inflight", "pos", "replay")

    def __init__(self, effects: Effects | None = None) -> None:
        self.effects = effects
        self.buffer: list[Event[R]] = []
        self.pos = 0
        self.batch: Batch | None = None
        self.replay: list[Event[R]] = []
        self.inflight: list[Event[R]] = []
        self.done: list[bytes] = []
        self.dispatched: collections.deque[Event[R]] | None = None

    # -- the buffer --

    def load(self, batch: Batch, events: list[Event[R]]) -> None:
        """Buffer ``events``, the events of ``batch``, to be handed on from the first."""
        self.buffer = events
        self.pos = 0
        self.batch = batch

    def finish_batch(self) -> Batch | None:
        """Forget the current batch; return it if there was one (to report it done)."""
        batch, self.batch = self.batch, None
        return batch

    def has_buffered(self) -> bool:
        """Whether buffered events remain to be handed on."""
        return self.pos < len(self.buffer)

    def next_buffered(self) -> Event[R] | None:
        """The next buffered event (no replay, no middleware), or ``None``."""
        pos = self.pos
        if pos < len(self.buffer):
            self.pos = pos + 1
            return self.buffer[pos]
        return None

    def take_ready(self, n: int, *, direct: bool) -> list[Event[R]]:
        """Up to ``n`` events available without waiting: replayed ones first, then (if
        ``direct``, that is without middleware) buffered ones."""
        if self.replay:
            ready, self.replay = self.replay[:n], self.replay[n:]
            return ready
        if not direct:
            return []
        pos = self.pos
        ready = self.buffer[pos : pos + n]
        self.pos = pos + len(ready)
        return ready

    def next_replayed(self) -> Event[R] | None:
        """The first replayed event, or ``None``."""
        return self.replay.pop(0) if self.replay else None

    def put_back(self, events: list[Event[R]]) -> None:
        """Hand ``events`` (taken but not handed out) out next, before anything else."""
        if events:
            self.replay[:0] = events

    # -- handing out and moving past --

    def hand_out(self, events: list[Event[R]]) -> None:
        """``events`` are now in flight (the processor holds them)."""
        self.inflight = events

    def move_past(self) -> None:
        """The processor moved past the in-flight events: they are done."""
        if self.effects is not None:
            self.effects.promote()
        inflight = self.inflight
        if not inflight:
            return
        self.inflight = []
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
        self.inflight = []
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
            self.buffer = [*dispatched, *self.buffer[self.pos :]]
            self.pos = 0
            dispatched.clear()

    def __repr__(self) -> str:
        return (
            f"<Ledger buffered {len(self.buffer) - self.pos}, replay {len(self.replay)}, "
            f"in flight {len(self.inflight)}, done {len(self.done)}>"
        )
