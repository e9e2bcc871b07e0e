"""The partition feed: the one interface between a fetcher and a partition's consumer.

A fetcher reads a partition's entries in batches; whoever consumes the partition
(:class:`~streamkit.Events`, or code of your own) talks to it only through a
:class:`PartitionFeed`:

* :meth:`~PartitionFeed.receive` the next :class:`Batch` (in order);
* :meth:`~PartitionFeed.done` once every entry of a batch was handed on, which makes
  room for the fetcher to read ahead (backpressure);
* :meth:`~PartitionFeed.ack` the ids of entries that were processed (fenced: refused
  once the lease is no longer ours), now, or :meth:`~PartitionFeed.ack_later` with the
  partition's next read (one round trip for both);
* :attr:`~PartitionFeed.held`, the lease that fences every read and acknowledgement;
* :attr:`~PartitionFeed.failure`, why the feed stopped, once it has;
* :attr:`~PartitionFeed.meter`, the partition's counters for streamkit.metrics, or
  ``None`` for a feed that is not metered.

Any object with these members is a feed: tests feed :class:`~streamkit.Events` canned
batches with no Redis at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ._errors import StreamkitError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._commit import Changes
    from ._locks import HeldLease
    from ._meter import PartitionMeter
    from ._spec import ProcessorKeys, StreamSpec

__all__ = ["Batch", "FeedEnded", "PartitionFeed"]


class FeedEnded(StreamkitError):
    """The feed stopped serving its partition (it was unregistered, or failed).

    Attributes:
        partition: the partition.
    """

    def __init__(self, partition: int, reason: str = "it is no longer served") -> None:
        super().__init__(f"partition {partition}: {reason}")
        self.partition = partition


class Batch:
    """Entries of one partition as read, in order.

    Attributes:
        ids: the entry ids, as bytes.
        deliveries: each entry's delivery count, or ``None`` when every entry is
            delivered for the first time.
    """

    __slots__ = ("_fields", "_flat", "_widths", "deliveries", "ids")

    def __init__(
        self, ids: list[bytes], fields: list[list[bytes]], deliveries: list[int] | None = None
    ) -> None:
        self.ids = ids
        self._fields: list[list[bytes]] | None = fields
        self._flat: list[bytes] = []
        self._widths: int | list[int] = 0
        self.deliveries = deliveries

    @classmethod
    def from_flat(
        cls,
        ids: list[bytes],
        flat: list[bytes],
        widths: int | list[int],
        deliveries: list[int] | None = None,
    ) -> Batch:
        """A batch from every entry's field list laid end to end in ``flat``: entry
        ``i`` has ``widths[i]`` of them, or ``widths`` if that is a number (as the
        fetcher's read script returns them: one array for all is cheaper for Redis to
        build and to parse than one per entry)."""
        batch = cls(ids, [], deliveries)
        batch._fields = None
        batch._flat = flat
        batch._widths = widths
        return batch

    @property
    def fields(self) -> list[list[bytes]]:
        """Each entry's flat field list ``[name, value, name, value, ...]``."""
        fields = self._fields
        if fields is None:
            fields = self._fields = _unflatten(self._flat, self._widths, len(self.ids))
        return fields

    def entry_fields(self, index: int) -> list[bytes]:
        """The flat field list of entry ``index`` (without building every entry's)."""
        widths = self._widths
        if self._fields is None and isinstance(widths, int):
            return self._flat[index * widths : (index + 1) * widths]
        return self.fields[index]

    def values_of(self, field: bytes, lo: int, hi: int) -> list[bytes] | None:
        """The values of ``field`` of entries ``lo`` to ``hi``, if it is each one's only
        field, else ``None``."""
        if self._fields is None and self._widths == 2:
            flat = self._flat
            if flat[2 * lo : 2 * hi : 2].count(field) == hi - lo:
                return flat[2 * lo + 1 : 2 * hi : 2]
            return None
        fields = self.fields[lo:hi]
        if all(len(f) == 2 and f[0] == field for f in fields):
            return [f[1] for f in fields]
        return None

    def payloads(self) -> list[bytes] | None:
        """Every entry's ``data`` field, if that is each entry's only field (the layout
        of JSON records without compression), else ``None``."""
        count = len(self.ids)
        if self._fields is None:
            flat = self._flat
            if self._widths == 2 and flat[0::2].count(b"data") == count:
                return flat[1::2]
            return None
        fields = self._fields
        if all(len(f) == 2 and f[0] == b"data" for f in fields):
            return [f[1] for f in fields]
        return None

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        kind = "first deliveries" if self.deliveries is None else "redeliveries"
        return f"<Batch {len(self.ids)} entries, {kind}>"


def _unflatten(flat: list[bytes], widths: int | list[int], count: int) -> list[list[bytes]]:
    if isinstance(widths, int):
        return [flat[at : at + widths] for at in range(0, count * widths, widths)]
    fields = []
    at = 0
    for width in widths:
        fields.append(flat[at : at + width])
        at += width
    return fields


class PartitionFeed(Protocol):
    """The batches of one partition, as a fetcher serves them.

    Attributes:
        partition: the partition number.
        stream: the stream's description.
        keys: the consuming processor's keys (consumer group, dead letters, locks).
        held: the lease fencing every read and acknowledgement.
        failure: why the feed stopped (say, :class:`~streamkit.LockLost`), or ``None``.
        meter: the partition's counters and timers (see :mod:`streamkit.metrics`), or
            ``None`` for a feed that is not metered.
    """

    @property
    def partition(self) -> int: ...

    @property
    def stream(self) -> StreamSpec[Any]: ...

    @property
    def keys(self) -> ProcessorKeys: ...

    @property
    def held(self) -> HeldLease: ...

    @property
    def failure(self) -> StreamkitError | None: ...

    @property
    def meter(self) -> PartitionMeter | None: ...

    @property
    def caught_up(self) -> bool:
        """Whether the partition is quiet: the last read reached its end, and nothing
        failed since (a partition merely not read, during an outage, is not). Windows
        move event time on with the wall clock only while it is (see :doc:`state`)."""
        ...

    def receive_nowait(self) -> Batch:
        """The next batch if one is ready.

        Raises:
            trio.WouldBlock: none is ready.
            StreamkitError: the feed stopped (:attr:`failure`, else
                :class:`~streamkit.lowlevel.FeedEnded`).
        """
        ...

    async def receive(self) -> Batch:
        """Wait for the next batch.

        Raises:
            StreamkitError: the feed stopped (:attr:`failure`, else
                :class:`~streamkit.lowlevel.FeedEnded`).
        """
        ...

    def done(self, batch: Batch) -> None:
        """Every entry of ``batch`` was handed on: the fetcher may read ahead again."""
        ...

    def ack_later(self, ids: Sequence[bytes], changes: Changes | None = None) -> None:
        """Acknowledge processed entries with the partition's next read, or with the
        next :meth:`ack`, whichever comes first (fenced all the same).

        ``changes`` are the writes of the processing behind them (a stateful
        processor's tables and emitted records, see :doc:`state`): they are applied by
        the same call that acknowledges the ids, or not at all. A feed that never
        serves a stateful processor may refuse them.

        Never blocks and never raises: a refusal (the lease is no longer ours) stops
        the feed, and :attr:`failure` tells why. Entries whose acknowledgement was
        never sent stay pending, for the next delivery: at-least-once either way.
        """
        ...

    async def ack(self, ids: Sequence[bytes], changes: Changes | None = None) -> None:
        """Acknowledge processed entries, and any handed to :meth:`ack_later`, now;
        fenced by :attr:`held`; ``changes`` as for :meth:`ack_later`.

        Raises:
            LockLost: the lease is no longer ours; nothing was acknowledged.
            RedisUnavailable: Redis could not be reached; the entries stay pending.
                With changes, the feed stops too: a commit is never sent again (one
                whose outcome is unknown would repeat its appends).
            StreamkitError: the feed stopped before (:attr:`failure`): nothing is
                sent, since what was processed since a commit of unknown outcome
                builds on that commit's writes.
        """
        ...
