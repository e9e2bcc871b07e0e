"""Event: one entry of a partition as a processor sees it, decoded on first access."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeAlias, TypeVar

from ._wire import field_pairs

__all__ = ["UNDECODED", "DivertHook", "Event", "Middleware"]

R = TypeVar("R")

#: An event's record not decoded yet (also what a batch decoder leaves undecoded).
UNDECODED: Any = object()
_UNSET = UNDECODED

# Decodes an entry's flat field list; the id is for the error message.
Decoder: TypeAlias = Callable[[list[bytes], bytes], Any]


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
        decode: Decoder,
        stream: str,
        record: Any = _UNSET,
    ) -> None:
        self.partition = partition
        self.delivery_count = delivery_count
        self.stream = stream
        self._id = entry_id
        self._flat = flat
        self._decode = decode
        # Decoded with its batch already, or UNDECODED (decoded on first access).
        self._record: R = record

    @property
    def entry_id(self) -> str:
        """The Redis entry id (``"1700000000000-0"``)."""
        return self._id.decode()

    @property
    def flat(self) -> list[bytes]:
        """The entry's fields as stored, flat: ``[name, value, name, value, ...]``."""
        return self._flat

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
