"""The producer's pure half: records into append calls, and their replies back, for every client.

The Trio producer (:class:`~streamkit.Stream`) and the blocking and asyncio clients
(:mod:`streamkit.clients`) send records the same way because each step that is not
I/O is written here once, with no import of trio or of a Redis client:

* the send options' checks and the window a ``send_many`` encodes at a time;
* records routed by the partitioner, encoded by the codec and laid out as script
  arguments, per partition, in order (:func:`encode_window`), and cut into chunks,
  one script call each (:meth:`SendWindow.chunks`);
* the stream metadata check: the script's arguments and what its reply means
  (:func:`check_metadata_reply`, :class:`~streamkit.MetadataMismatch`);
* the idempotent append (see :mod:`streamkit._idempotent` for why; its script is
  ``streams/append`` of :mod:`streamkit._lua`): its markers, unique per process also
  after ``fork``, the bookkeeping of markers that may be deleted, each call's keys and
  arguments, and its reply.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import uuid
import weakref
from typing import TYPE_CHECKING, Any, cast

import attrs

from . import _keys
from ._errors import ConfigError, EncodeError, MetadataMismatch
from ._tracing import entry_trace
from ._validate import non_negative_int, positive_finite_number, positive_int
from ._wire import (
    DEFAULT_SEND_CHUNK_BYTES,
    REDIS_MAX_BULK,
    chunk_bounds,
    compare_metadata,
    format_size,
    metadata_pairs,
    text,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from ._spec import StreamSpec

__all__ = [
    "DEFAULT_REPLICA_TIMEOUT",
    "MARKER_TTL",
    "MAX_DONE_PER_CALL",
    "WINDOW_PER_PARTITION",
    "AppendCall",
    "FinishedMarkers",
    "SendWindow",
    "append_reply",
    "check_metadata_reply",
    "check_send_options",
    "encode_into",
    "encode_window",
    "marker_key",
    "metadata_arguments",
    "new_marker_token",
    "say_dropped",
    "windows",
]

# What the producers say of their appends (the streams' logger, whichever client sent).
log = logging.getLogger("streamkit.streams")

# Records encoded at a time by send_many: bounds memory for huge iterables while
# keeping every partition's pipeline full.
WINDOW_PER_PARTITION = 4
#: Seconds a send with replicas=N waits for them, per append, by default.
DEFAULT_REPLICA_TIMEOUT = 1.0

#: Seconds a marker lives unless deleted earlier: far longer than the retries of a call.
MARKER_TTL = 300
#: Markers of finished appends deleted per call, at most.
MAX_DONE_PER_CALL = 64


# ------------------------------------------------------------------ sending records


def check_send_options(chunk_size: int, replicas: int, replica_timeout: float) -> None:
    """Check ``send_many``'s options.

    Error handling:
        :class:`~streamkit.ConfigError` naming the bad one.
    """
    positive_int.check("chunk_size", chunk_size)
    non_negative_int.check("replicas", replicas)
    positive_finite_number.check("replica_timeout", replica_timeout)


def windows(
    records: Iterable[Any], chunk_size: int, partition_count: int, *, first: int | None = None
) -> Iterator[list[Any]]:
    """``records`` a window at a time: enough for every partition's pipeline, no more.

    ``first``: the size of the first window, if it is to be another (a producer that
    encodes a window while the one before is sent starts sending sooner with a small
    first one).
    """
    size = chunk_size * WINDOW_PER_PARTITION * partition_count
    iterator = iter(records)
    if first is not None:
        window = list(itertools.islice(iterator, first))
        if not window:
            return
        yield window
    while window := list(itertools.islice(iterator, size)):
        yield window


@attrs.define(eq=False)
class SendWindow:
    """A window of records, encoded and grouped by partition, and the ids they got.

    Attributes:
        data_field: the field name of a record encoded as its one payload.
        positions: per partition, the positions of its records in the window, in order.
        items: per partition, its records encoded, in the same order: a record of one
            field named ``data_field`` as its value alone, any other as its entry (field
            count, then field names and values).
        mixed: the partitions some record of which is not a value alone.
        sizes: per partition, each record's size in bytes (names and values).
        ids: the entry id of each record of the window, once appended ("" before).
        trace: the trace context every entry carries, as extra fields (flat names and
            values, see :func:`~streamkit._tracing.entry_trace`); ``()`` for none.
    """

    data_field: bytes = b""
    positions: dict[int, list[int]] = attrs.field(factory=dict)
    items: dict[int, list[bytes | Sequence[bytes | int]]] = attrs.field(factory=dict)
    mixed: set[int] = attrs.field(factory=set)
    sizes: dict[int, list[int]] = attrs.field(factory=dict)
    ids: list[str] = attrs.field(factory=list)
    trace: tuple[bytes, ...] = ()

    def partitions(self) -> list[int]:
        """The partitions the window's records go to."""
        return list(self.positions)

    def chunks(self, partition: int, chunk_size: int) -> list[tuple[int, int]]:
        """``partition``'s records cut into script calls: ``(start, end)`` bounds, in order.

        A chunk holds at most ``chunk_size`` records and
        :data:`~streamkit._wire.DEFAULT_SEND_CHUNK_BYTES` bytes (a larger record goes
        alone): Redis holds a whole call in memory and runs it without a pause. Every
        client cuts here.
        """
        return list(chunk_bounds(self.sizes[partition], chunk_size, DEFAULT_SEND_CHUNK_BYTES))

    def arguments(self, partition: int, start: int, end: int) -> list[bytes | int]:
        """The append script's entry arguments of records ``start:end`` of ``partition``.

        Consecutive records of one value each go as a run (minus their number, the
        field name once, then the values): a third of the arguments a record would take
        as an entry of its own, and packing a script call costs per argument.
        """
        items = self.items[partition][start:end]
        if partition not in self.mixed:  # values alone, all of them
            return [-len(items), self.data_field, *cast("list[bytes]", items)]
        flat: list[bytes | int] = []
        run: list[bytes] = []
        for item in items:
            if type(item) is bytes:
                run.append(item)
                continue
            if run:
                flat += (-len(run), self.data_field, *run)
                run = []
            flat += item
        if run:
            flat += (-len(run), self.data_field, *run)
        return flat

    def landed(self, partition: int, start: int, ids: Sequence[str]) -> None:
        """Records ``start``, ``start + 1``, ... of ``partition`` were appended as ``ids``."""
        out = self.ids
        where = self.positions[partition][start : start + len(ids)]
        for position, entry_id in zip(where, ids, strict=True):
            out[position] = entry_id


def encode_window(
    spec: StreamSpec[Any], records: Sequence[Any], server_limit: int = REDIS_MAX_BULK
) -> SendWindow:
    """Route and encode ``records``: per partition, each one's script arguments, in order.

    Args:
        spec: the stream.
        records: the window's records.
        server_limit: the longest string the server accepts (its
            ``proto-max-bulk-len``; see :func:`bulk_limit_reply`).

    Error handling:
        :class:`~streamkit.EncodeError` for a record that cannot be encoded, is larger
        than ``max_record_size`` or has a field longer than the server accepts, or
        whose partition key the partitioner refuses (a ``None``, a float, a list, ...;
        a field of the wrong type is said as such first): raised before anything is
        sent. A ``partition_by`` function that raises of a record that encodes raises
        its own error.
    """
    window = SendWindow(
        spec.codec.payloads_encoder()[1], ids=[""] * len(records), trace=entry_trace()
    )
    encode_into(window, spec, records, 0, len(records), server_limit)
    return window


def encode_into(
    window: SendWindow,
    spec: StreamSpec[Any],
    records: Sequence[Any],
    start: int,
    end: int,
    server_limit: int = REDIS_MAX_BULK,
) -> None:
    """:func:`encode_window` for ``records[start:end]``, into ``window`` (of all
    ``records``): a window can be encoded a slice at a time, in order.

    Error handling:
        As :func:`encode_window`.
    """
    encode_entry = spec.codec.entry_encoder()
    encode_payloads, data_field, limit = spec.codec.payloads_encoder()
    field_size = len(data_field)
    chunk = records[start:end]
    try:
        partitions = spec.partitioner.partitions_of(chunk)
    except Exception as exc:
        # The record before its key: a record of another type, or one whose key field
        # holds the wrong type, is refused naming what is wrong with it, as the codec
        # would; only a key refused of a record that encodes is said as a key.
        _check_types(spec, chunk)
        for record in chunk:
            encode_entry(record)
        if isinstance(exc, ConfigError):
            where = f"{spec.name}: partition key {_describe_key(spec)}"
            raise EncodeError(f"{where}: {exc.reason}") from exc
        raise
    # Most records are encoded by one comprehension, the rest one by one.
    payloads = encode_payloads(chunk)
    # Per partition: the appends of its items, positions and sizes.
    slots: dict[int, _Slot] = {}
    position = start
    for partition, payload in zip(partitions, payloads, strict=True):
        slot = slots.get(partition)
        if slot is None:
            slot = slots[partition] = _slot(window, partition)
        add, at, sized = slot
        if payload and len(payload) <= limit:
            item: bytes | Sequence[bytes | int] = payload
            size = field_size + len(payload)
        else:
            item, size = encode_entry(records[position])
            window.mixed.add(partition)
        if size > server_limit:
            _check_server_limit(spec, spec.codec.encode(records[position]), server_limit)
        add(item)
        at(position)
        sized(size)
        position += 1
    if window.trace:
        _add_trace(window, slots, start)


def _add_trace(window: SendWindow, slots: dict[int, _Slot], start: int) -> None:
    """The trace fields added to the records from ``start`` on just encoded into
    ``window`` (those of ``slots``' partitions): each one an entry of its own, the
    trace fields after the record's."""
    trace = window.trace
    extra = len(trace) // 2
    trace_size = sum(len(part) for part in trace)
    data_field = window.data_field
    for partition in slots:
        items, sizes = window.items[partition], window.sizes[partition]
        positions = window.positions[partition]
        first = len(positions)
        while first and positions[first - 1] >= start:
            first -= 1
        for i in range(first, len(items)):
            item = items[i]
            if type(item) is bytes:
                items[i] = (1 + extra, data_field, item, *trace)
            else:
                items[i] = (cast("int", item[0]) + extra, *item[1:], *trace)
            sizes[i] += trace_size
        window.mixed.add(partition)


#: A partition's place in a window being encoded: the appends of its items, positions
#: and sizes.
_Slot = tuple[
    "Callable[[bytes | Sequence[bytes | int]], None]",
    "Callable[[int], None]",
    "Callable[[int], None]",
]


def _check_types(spec: StreamSpec[Any], records: Sequence[Any]) -> None:
    """Refuse the first of ``records`` that is not of the stream's record type, as its
    codec would (:class:`~streamkit.EncodeError`)."""
    record = spec.record
    for value in records:
        if type(value) is not record and not (record is dict and isinstance(value, dict)):
            raise EncodeError(
                f"{spec.name}: expected a {record.__qualname__}, got {type(value).__qualname__}"
            )


def _describe_key(spec: StreamSpec[Any]) -> str:
    """Where a stream's records' partition key comes from: ``(field 'customer')`` or
    ``(partition_by=key_of)``."""
    by = spec.partitioner.partition_by
    if isinstance(by, str):
        return f"(field {by!r})"
    return f"(partition_by={getattr(by, '__qualname__', repr(by))})"


def _slot(window: SendWindow, partition: int) -> _Slot:
    items = window.items.get(partition)
    if items is None:
        items = window.items[partition] = []
        window.positions[partition] = []
        window.sizes[partition] = []
    return items.append, window.positions[partition].append, window.sizes[partition].append


def _check_server_limit(spec: StreamSpec[Any], fields: dict[bytes, bytes], limit: int) -> None:
    # Redis limits each string of a command, not their sum: a record larger than the
    # limit in all is refused only if one of its fields is.
    largest = max(len(value) for value in [*fields, *fields.values()])
    if largest > limit:
        raise EncodeError(
            f"the encoded {spec.record.__qualname__} has a field of {format_size(largest)}, "
            f"more than Redis accepts (its proto-max-bulk-len is {format_size(limit)}): "
            f"lower max_record_size to at most that, or raise the server's "
            f"proto-max-bulk-len"
        )


def bulk_limit_reply(reply: object) -> int:
    """The server's ``proto-max-bulk-len`` from a ``CONFIG GET`` reply, or Redis's
    default where the reply says nothing usable."""
    try:
        if isinstance(reply, dict):
            return int(next(iter(reply.values())))
        return int(list(reply)[1])  # type: ignore[call-overload]
    except (StopIteration, AttributeError, TypeError, ValueError, IndexError):
        return REDIS_MAX_BULK


# ------------------------------------------------------------------------- metadata


def metadata_arguments(spec: StreamSpec[Any]) -> list[str]:
    """The metadata script's arguments for ``spec``: field, value, field, value, ..."""
    return list(itertools.chain.from_iterable(spec.metadata().items()))


def check_metadata_reply(spec: StreamSpec[Any], reply: object) -> None:
    """Check the metadata script's reply (what Redis records of the stream) against ``spec``.

    Error handling:
        :class:`~streamkit.MetadataMismatch` if the stream was created with another
        partition count, record type, format or partition key.
    """
    mismatch = compare_metadata(metadata_pairs(reply), spec.metadata())
    if mismatch is not None:
        raise MetadataMismatch(spec.name, *mismatch)


# ---------------------------------------------------------------- idempotent appends

# This process's part of every marker: drawn again in a forked child, so that two
# processes forked from one parent (gunicorn's workers) never draw the same markers.
_process = uuid.uuid4().hex[:16]
_tokens = itertools.count()


def _after_fork() -> None:
    global _process
    _process = uuid.uuid4().hex[:16]


os.register_at_fork(after_in_child=_after_fork)


def new_marker_token() -> str:
    """A marker token no other call of any process draws."""
    return f"{_process}:{next(_tokens)}"


# Stream key -> its markers' prefix (cached: computing it per call shows in profiles).
_prefixes: dict[str, str] = {}


def marker_key(stream_key: str, token: str) -> str:
    """The idempotency marker ``token`` of an append to ``stream_key``, in its hash slot."""
    prefix = _prefixes.get(stream_key)
    if prefix is None:
        if len(_prefixes) > 10_000:
            _prefixes.clear()
        prefix = _prefixes[stream_key] = _marker_prefix(stream_key)
    return prefix + token


def _marker_prefix(stream_key: str) -> str:
    return _keys.once_marker_prefix(stream_key)


# Every FinishedMarkers, to give each a fresh lock in a forked child (a lock another
# thread held at the fork would stay locked there forever).
_all_markers: weakref.WeakSet[FinishedMarkers] = weakref.WeakSet()


def _fresh_locks() -> None:
    for markers in list(_all_markers):
        markers._lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks)


@attrs.define(eq=False, weakref_slot=True)
class FinishedMarkers:
    """One client's markers of appends whose replies arrived: safe to delete.

    The next append to the same partition through the same client deletes them (no
    extra round trip), so a busy producer keeps about one marker per partition. Safe
    to share between threads.
    """

    _by_key: dict[str, list[str]] = attrs.field(factory=dict, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        _all_markers.add(self)

    def take(self, key: str) -> list[str]:
        """Up to :data:`MAX_DONE_PER_CALL` markers of ``key`` for the next call to delete."""
        with self._lock:
            done = self._by_key.pop(key, None) or []
            if len(done) > MAX_DONE_PER_CALL:
                self._by_key[key] = done[MAX_DONE_PER_CALL:]
                done = done[:MAX_DONE_PER_CALL]
        return done

    def give_back(self, key: str, markers: Iterable[str]) -> None:
        """Markers a call took but may not have deleted (deleting twice is harmless)."""
        with self._lock:
            self._by_key.setdefault(key, []).extend(markers)

    def finished(self, key: str, marker: str) -> None:
        """The append of ``marker`` got its reply: its marker may go."""
        with self._lock:
            self._by_key.setdefault(key, []).append(marker)


@attrs.define(eq=False)
class AppendCall:
    """One idempotent append: its script's keys and arguments, and its bookkeeping.

    Attributes:
        key: the partition's stream key.
        marker: this call's marker key.
        done: markers of finished appends this call deletes.
        keys: the script's keys.
        args: the script's arguments.
        stream: the stream's name, and ``partition`` the partition (for what is said
            of the call).
        cap: the hard cap, ``max_len`` (0 for none).
    """

    key: str
    marker: str
    done: list[str]
    keys: list[str]
    args: list[bytes | int]
    stream: str = ""
    partition: int = 0
    cap: int = 0

    @classmethod
    def make(
        cls,
        markers: FinishedMarkers,
        key: str,
        *,
        keep: int,
        cap: int,
        entries: list[bytes | int],
        stream: str = "",
        partition: int = 0,
    ) -> AppendCall:
        """The call appending ``entries`` (flat) to the stream ``key``.

        Args:
            markers: the client's finished markers (some are deleted by this call).
            key: the partition's stream key.
            keep: the partition size trimming keeps (``partition_size``).
            cap: the hard cap, ``max_len`` (0 for none).
            entries: the entries, flat (see :meth:`SendWindow.arguments`).
            stream: the stream's name (the key, if not given), and ``partition`` the
                partition ``key`` is, for what is said of the call.
        """
        done = markers.take(key)
        marker = marker_key(key, new_marker_token())
        # ARGV[4] = 1: look for the marker first, on the first attempt too. A fresh
        # marker cannot exist when the first attempt is sent, but it may when that
        # attempt runs: one whose reply timed out may sit in a socket buffer (a paused
        # or overloaded server) and reach Redis after a retry that appended already.
        return cls(
            key,
            marker,
            done,
            [key, marker, *done],
            [keep, cap, MARKER_TTL, 1, *entries],
            stream or key,
            partition,
            cap,
        )

    def retrying(self) -> None:
        """Mark the call as sent before: the script then looks for its marker first
        (which every attempt does; see :meth:`make`)."""
        self.args[3] = 1

    def succeeded(self, markers: FinishedMarkers) -> None:
        """The reply arrived: the markers it deleted are gone, its own may go."""
        markers.finished(self.key, self.marker)

    def failed(self, markers: FinishedMarkers) -> None:
        """No reply: the markers it took may not have been deleted."""
        if self.done:
            markers.give_back(self.key, self.done)


def say_dropped(max_len: int | str | None, dropped: int, stream: str, partition: int) -> None:
    """Say, at WARNING, that a hard cap (``max_len``) dropped ``dropped`` unprocessed
    entries from ``stream``'s ``partition``: every producer (the Trio one, the clients,
    the Spark writer) says it so."""
    log.warning(
        "max_len=%s dropped %d unprocessed entries from %s partition %d",
        max_len or 0,
        dropped,
        stream,
        partition,
    )


def append_reply(reply: Any) -> tuple[list[str], int, bool]:
    """The idempotent append's reply: (new entry ids, entries the cap dropped, whether
    the call was applied before, by an attempt whose reply was lost)."""
    ids = reply[0]
    if type(ids) is not list:  # the first of consecutive ids, and their number
        ms, _, seq = text(ids).partition("-")
        start = int(seq)
        prefix = ms + "-"
        return (
            [prefix + str(s) for s in range(start, start + int(reply[3]))],
            int(reply[1]),
            bool(reply[2]),
        )
    if ids and type(ids[0]) is bytes:
        return list(map(bytes.decode, ids)), int(reply[1]), bool(reply[2])
    return [text(i) for i in ids], int(reply[1]), bool(reply[2])
