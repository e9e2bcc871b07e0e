"""A canned partition feed: :class:`~streamkit.Events` fed from a list, no Redis.

:class:`CannedFeed` implements :class:`~streamkit.PartitionFeed` over a list of
:class:`~streamkit.lowlevel.Batch` es and records what the consumer did with them: every
acknowledgement handed over (``ack_later(ids)`` and ``ack(ids)``), what of it was
sent, and every ``done(batch)`` call, in order. It can refuse acknowledgements
(:class:`~streamkit.LockLost`, as a real feed does once the lease is gone), lose its
lease, and, when its batches run out, either end (:class:`~streamkit.lowlevel.FeedEnded`) or
wait for more (:meth:`CannedFeed.push`, :meth:`CannedFeed.end`).

This is a stand-in for the fetcher, not for Redis: :class:`~streamkit.Events` talks to
Redis only through its feed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import trio

from streamkit import HeldLease, Lease, LockLost, Record, StreamkitError, StreamSpec
from streamkit.lowlevel import Batch, FeedEnded

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from streamkit import ProcessorKeys
    from streamkit.lowlevel import Changes

__all__ = [
    "KEYS",
    "STREAM",
    "UNDECODABLE",
    "CannedFeed",
    "Rec",
    "batches",
    "entry_id",
    "number_of",
]


class Rec(Record):
    n: int
    key: str


STREAM: StreamSpec[Rec] = StreamSpec(
    app="t", name="s", record=Rec, partition_by="key", partition_count=1
)
KEYS: ProcessorKeys = STREAM.processor("p")

#: The fields of an entry that is no valid encoding of :class:`Rec`.
UNDECODABLE: list[bytes] = [b"data", b"not json"]


def entry_id(n: int) -> bytes:
    """The entry id of record number ``n``: ``b"n-0"``."""
    return f"{n}-0".encode()


def number_of(entry: bytes | str) -> int:
    """The record number of an entry id (the inverse of :func:`entry_id`)."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    return int(text.partition("-")[0])


def fields_of(n: int) -> list[bytes]:
    """The flat field list of record number ``n``, as Redis returns it."""
    flat: list[bytes] = []
    for name, value in STREAM.codec.encode(Rec(n=n, key="k")).items():
        flat += [name, value]
    return flat


def batches(
    sizes: Iterable[int],
    *,
    start: int = 1,
    deliveries: dict[int, int] | None = None,
    undecodable: Iterable[int] = (),
) -> list[Batch]:
    """Batches of consecutive records ``start, start + 1, ...``, of the given sizes.

    Args:
        sizes: the number of entries of each batch.
        start: the number (and entry id ``b"<start>-0"``) of the first entry.
        deliveries: delivery counts by record number; a batch containing any of them
            is a batch of redeliveries (others delivered once).
        undecodable: record numbers whose fields are :data:`UNDECODABLE`.
    """
    deliveries = deliveries or {}
    bad = set(undecodable)
    out: list[Batch] = []
    n = start
    for size in sizes:
        numbers = range(n, n + size)
        counts = [deliveries.get(i, 1) for i in numbers]
        out.append(
            Batch(
                [entry_id(i) for i in numbers],
                [list(UNDECODABLE) if i in bad else fields_of(i) for i in numbers],
                counts if any(i in deliveries for i in numbers) else None,
            )
        )
        n += size
    return out


def _lease() -> Lease:
    # Valid forever: the local deadline (valid_until minus a drift allowance) is inf.
    name = KEYS.lock_name(0)
    return Lease(
        name=name, key="__lock:" + name, owner="test", token=1, ttl=10.0, valid_until=math.inf
    )


class CannedFeed:
    """A :class:`~streamkit.PartitionFeed` serving ``batches``, then ending or waiting.

    Acknowledgements are modelled on the fetcher: ``ack_later(ids)`` queues ids that
    are sent with the next read (here: the consumer's next ``receive()`` or
    ``receive_nowait()``) or with the next ``ack()``; ``ack()`` sends them and its own
    at once. Both are refused once the lease is lost (or while :attr:`fail_acks`):
    ``ack()`` raises :class:`~streamkit.LockLost`, ``ack_later()`` stops the feed.

    Attributes:
        handovers: every accepted acknowledgement, as the consumer handed it over:
            ``("later", ids)`` or ``("now", ids)``, in order.
        sent: the ids that reached "Redis", one list per send.
        done_calls: every batch reported ``done()``, in order.
        on_handover: called with the ids of each accepted handover.
        on_done: called with each batch reported ``done()``.
        fail_acks: while true, acknowledgements are refused.
        lose_lease_at: the lease is lost at this handover attempt (1-based).
    """

    def __init__(
        self,
        batches: Sequence[Batch] = (),
        *,
        then: Literal["end", "wait"] = "end",
        held: HeldLease | None = None,
    ) -> None:
        self._batches = list(batches)
        self._ended = then == "end"
        self._held = held if held is not None else HeldLease(_lease())
        self._failure: StreamkitError | None = None
        self._due: list[bytes] = []
        self._more: trio.Event | None = None
        self._waiting: trio.Event | None = None
        self._attempts = 0
        self.handovers: list[tuple[Literal["later", "now"], list[bytes]]] = []
        self.sent: list[list[bytes]] = []
        self.done_calls: list[Batch] = []
        self.on_handover: Callable[[list[bytes]], None] | None = None
        self.on_done: Callable[[Batch], None] | None = None
        self.fail_acks = False
        self.lose_lease_at: int | None = None

    # -- the PartitionFeed protocol --

    @property
    def partition(self) -> int:
        return 0

    @property
    def stream(self) -> StreamSpec[Rec]:
        return STREAM

    @property
    def keys(self) -> ProcessorKeys:
        return KEYS

    @property
    def held(self) -> HeldLease:
        return self._held

    @property
    def failure(self) -> StreamkitError | None:
        if self._failure is None and self._held.lost_reason is not None:
            self._failure = LockLost(self._held.name, self._held.lost_reason)
        return self._failure

    @property
    def meter(self) -> None:
        return None

    @property
    def caught_up(self) -> bool:
        return not self._batches

    def receive_nowait(self) -> Batch:
        # The fetcher's next read, which carries the acknowledgements due.
        self._send_due()
        failure = self.failure
        if failure is not None:
            raise failure
        if self._batches:
            return self._batches.pop(0)
        if self._ended:
            raise FeedEnded(self.partition)
        raise trio.WouldBlock

    async def receive(self) -> Batch:
        await trio.lowlevel.checkpoint()
        while True:
            try:
                return self.receive_nowait()
            except trio.WouldBlock:
                pass
            self._more = trio.Event()
            if self._waiting is not None:
                self._waiting.set()
            await self._more.wait()

    def done(self, batch: Batch) -> None:
        self.done_calls.append(batch)
        if self.on_done is not None:
            self.on_done(batch)

    def ack_later(self, ids: Sequence[bytes], changes: Changes | None = None) -> None:
        self._no_changes(changes)
        if self._refused():
            # Refused with the next read: the feed stops, the ids stay pending.
            self._stop(LockLost(self._held.name, self._held.lost_reason or "refused"))
            return
        self._accept("later", ids)
        self._due += ids

    async def ack(self, ids: Sequence[bytes], changes: Changes | None = None) -> None:
        self._no_changes(changes)
        await trio.lowlevel.checkpoint()
        if self._refused():
            raise LockLost(self._held.name, self._held.lost_reason or "refused")
        self._accept("now", ids)
        self._due += ids
        self._send_due()

    @staticmethod
    def _no_changes(changes: Changes | None) -> None:
        if changes:
            raise NotImplementedError("CannedFeed serves no stateful processor")

    # -- steering --

    @property
    def acked(self) -> list[bytes]:
        """Every id sent, in order."""
        return [i for chunk in self.sent for i in chunk]

    @property
    def handed_over(self) -> list[bytes]:
        """Every id handed over for acknowledgement (sent or due), in order."""
        return [i for _, chunk in self.handovers for i in chunk]

    def push(self, *more: Batch) -> None:
        """Serve ``more`` batches (waking a waiting ``receive()``)."""
        self._batches.extend(more)
        self._wake()

    def end(self) -> None:
        """End the feed once its batches run out."""
        self._ended = True
        self._wake()

    def lose_lease(self, reason: str = "taken over") -> None:
        """Lose the lease: acknowledgements are refused, the feed stops."""
        self._held._lose(reason)
        self._wake()

    async def wait_waiting(self) -> None:
        """Wait until a consumer waits in ``receive()`` with every batch handed out."""
        while self._more is None or self._more.is_set() or self._batches:
            self._waiting = trio.Event()
            await self._waiting.wait()
        await trio.lowlevel.checkpoint()

    # -- internals --

    def _refused(self) -> bool:
        self._attempts += 1
        if self._attempts == self.lose_lease_at:
            self.lose_lease("lost at an acknowledgement")
        return self.fail_acks or self._held.lost_reason is not None

    def _accept(self, kind: Literal["later", "now"], ids: Sequence[bytes]) -> None:
        if ids:
            self.handovers.append((kind, list(ids)))
            if self.on_handover is not None:
                self.on_handover(list(ids))

    def _send_due(self) -> None:
        if not self._due:
            return
        if self.fail_acks or self._held.lost_reason is not None:
            self._stop(LockLost(self._held.name, self._held.lost_reason or "refused"))
            return
        self.sent.append(self._due)
        self._due = []

    def _stop(self, error: StreamkitError) -> None:
        if self._failure is None:
            self._failure = error
        self._wake()

    def _wake(self) -> None:
        if self._more is not None:
            self._more.set()
