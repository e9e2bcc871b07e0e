"""Reading streams from Spark: batch and Structured Streaming readers.

Both readers plan one Spark input partition per stream partition and read it with
``XRANGE`` pages. Reading never touches consumer groups: no ``XREADGROUP``, no
``XACK``, no group created or moved, so streamkit workers on the same stream are not
disturbed.

Streaming offsets are ``{"<partition>": "<entry id>"}``: per partition, the id of the
last entry handed to Spark (``"0-0"`` before the first). Spark keeps them in its
checkpoint; a micro-batch reads the entries after its start offset up to and including
its end offset.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from .. import _keys, _lua
from .._codec import Codec, codec_for
from .._errors import DecodeError
from ._client import Client, connect, redis_errors
from ._options import ReadOptions, format_position, load_record, predecessor
from ._schema import record_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["BatchReader", "PartitionRange", "StreamReader"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Ids only: planning a limited micro-batch must not ship the entries' payloads. Sent
# as a plain EVAL command: redis-py's cluster pipelines refuse EVALSHA and have an
# eval() of their own that takes no script; the script is short, and its one key routes
# it to the partition's node.
_IDS_SCRIPT = _lua.script("spark/ids")


class PartitionRange(InputPartition):  # type: ignore[misc, unused-ignore]
    """One Spark input partition: a range of one stream partition.

    Attributes:
        partition: the stream partition.
        low: the XRANGE start argument (``-``, ``<id>`` or ``(<id>`` for exclusive).
        high: the XRANGE end argument (``+``, ``<id>`` or ``(<id>``).
    """

    def __init__(self, partition: int, low: str, high: str) -> None:
        super().__init__((partition, low, high))
        self.partition = partition
        self.low = low
        self.high = high


def _id_tuple(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    millis, _, seq = text.partition("-")
    return int(millis), int(seq or 0)


def _last_ids(client: Client, options: ReadOptions, count: int) -> list[tuple[int, int]]:
    """The id of the last entry of each partition, ``(0, 0)`` for an empty one.

    One pipeline; on a cluster, a cluster pipeline sends each node its partitions'
    commands together.
    """
    with redis_errors(options.url):
        pipe = client.pipeline(transaction=False)
        for partition in range(count):
            pipe.xrevrange(_keys.stream_key(options.app, options.stream, partition), "+", "-", 1)
        replies = pipe.execute()
    return [_id_tuple(reply[0][0]) if reply else (0, 0) for reply in replies]


@functools.lru_cache(maxsize=32)
def _row_function(
    record_path: str | None, max_decoded_size: int
) -> Callable[[int, bytes, dict[bytes, bytes], str], tuple[Any, ...]]:
    """Entry -> row tuple, built once per record class (and limit) and Python worker."""
    if record_path is None:

        def raw_row(
            partition: int, entry_id: bytes, fields: dict[bytes, bytes], stream: str
        ) -> tuple[Any, ...]:
            text = entry_id.decode()
            return (
                partition,
                text,
                _EPOCH + timedelta(milliseconds=int(text.partition("-")[0])),
                {name.decode("utf-8", "replace"): value for name, value in fields.items()},
            )

        return raw_row

    record = load_record(record_path)
    codec: Codec[Any] = codec_for(record, max_decoded_size=max_decoded_size)
    to_row = record_schema(record).to_row
    decode = codec.decode

    def record_row(
        partition: int, entry_id: bytes, fields: dict[bytes, bytes], stream: str
    ) -> tuple[Any, ...]:
        text = entry_id.decode()
        value = decode(fields, stream=stream, partition=partition, entry_id=text)
        return (
            partition,
            text,
            _EPOCH + timedelta(milliseconds=int(text.partition("-")[0])),
            *to_row(value),
        )

    return record_row


def read_range(options: ReadOptions, part: PartitionRange) -> Iterator[tuple[Any, ...]]:
    """Yield the rows of one input partition, paging with XRANGE."""
    make_row = _row_function(options.record, options.max_decoded_size)
    key = _keys.stream_key(options.app, options.stream, part.partition)
    name = f"{options.app}.{options.stream}"
    low = part.low
    with connect(options.url) as client:
        while True:
            with redis_errors(options.url):
                entries = cast(
                    "list[tuple[bytes, dict[bytes, bytes]]]",
                    client.xrange(key, low, part.high, options.page_size),
                )
            for entry_id, fields in entries:
                try:
                    row = make_row(part.partition, entry_id, fields, name)
                except DecodeError:
                    if options.skip_undecodable:
                        continue
                    raise
                yield row
            if len(entries) < options.page_size:
                return
            low = "(" + entries[-1][0].decode()


class BatchReader(DataSourceReader):  # type: ignore[misc, unused-ignore]
    """A batch read of all partitions, bounded by the ``start`` / ``end`` options.

    The upper bound of each partition is its last entry when the query is planned, so
    every task (and every retry of it) reads the same snapshot.
    """

    def __init__(self, options: ReadOptions, partition_count: int) -> None:
        self.options = options
        self.partition_count = partition_count

    def partitions(self) -> list[PartitionRange]:
        options = self.options
        low = "-" if options.start is None else format_position(options.start)
        with connect(options.url) as client:
            last = _last_ids(client, options, self.partition_count)
        ranges = []
        for partition, last_id in enumerate(last):
            if last_id == (0, 0):
                continue  # empty partition
            if options.end is not None and options.end <= last_id:
                high = "(" + format_position(options.end)
            else:
                high = format_position(last_id)
            ranges.append(PartitionRange(partition, low, high))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, PartitionRange)
        return read_range(self.options, partition)


Offset = dict[str, str]


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc, unused-ignore]
    """A Structured Streaming read with per-partition entry id offsets.

    Supports admission control (``maxEventsPerTrigger``) and ``Trigger.AvailableNow``.
    """

    def __init__(self, options: ReadOptions, partition_count: int) -> None:
        self.options = options
        self.partition_count = partition_count
        self._target: list[tuple[int, int]] | None = None

    # -- offsets ------------------------------------------------------------------------

    def initialOffset(self) -> Offset:
        options = self.options
        if options.start_latest:
            with connect(options.url) as client:
                return _offset(_last_ids(client, options, self.partition_count))
        begin = (0, 0) if options.start is None else predecessor(options.start)
        return _offset([begin] * self.partition_count)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_events_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_events_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        with connect(self.options.url) as client:
            self._target = _last_ids(client, self.options, self.partition_count)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        options = self.options
        begin = _positions(start, self.partition_count)
        with connect(options.url) as client:
            latest = self._target or _last_ids(client, options, self.partition_count)
            latest = [max(b, last) for b, last in zip(begin, latest, strict=True)]
            if isinstance(limit, ReadMaxRows):
                latest = _limited(client, options, begin, latest, limit.max_rows)
        return _offset(latest)

    def reportLatestOffset(self) -> Offset | None:
        with connect(self.options.url) as client:
            return _offset(_last_ids(client, self.options, self.partition_count))

    # -- reading ------------------------------------------------------------------------

    def partitions(self, start: Offset, end: Offset) -> list[PartitionRange]:
        begin = _positions(start, self.partition_count)
        finish = _positions(end, self.partition_count)
        return [
            PartitionRange(partition, "(" + format_position(low), format_position(high))
            for partition, (low, high) in enumerate(zip(begin, finish, strict=True))
            if high > low
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, PartitionRange)
        return read_range(self.options, partition)

    def commit(self, end: Offset) -> None:
        # Nothing to release: offsets live in Spark's checkpoint, not in Redis.
        pass


def _offset(positions: list[tuple[int, int]]) -> Offset:
    return {str(partition): format_position(p) for partition, p in enumerate(positions)}


def _positions(offset: Offset, count: int) -> list[tuple[int, int]]:
    # Partitions missing from an offset (a checkpoint taken when the stream had fewer
    # partitions) start from the beginning.
    return [_id_tuple(offset.get(str(p), "0-0")) for p in range(count)]


def _limited(
    client: Client,
    options: ReadOptions,
    begin: list[tuple[int, int]],
    latest: list[tuple[int, int]],
    max_rows: int,
) -> list[tuple[int, int]]:
    """End offsets covering the ``max_rows`` oldest entries after ``begin``, by id."""
    with redis_errors(options.url):
        pipe = client.pipeline(transaction=False)
        for partition, (low, high) in enumerate(zip(begin, latest, strict=True)):
            pipe.execute_command(
                "EVAL",
                _IDS_SCRIPT.text,
                _IDS_SCRIPT.numkeys,
                _keys.stream_key(options.app, options.stream, partition),
                "(" + format_position(low),
                format_position(high),
                max_rows,
            )
        replies = pipe.execute()
    tagged = (
        [(_id_tuple(entry_id), partition) for entry_id in ids]
        for partition, ids in enumerate(replies)
    )
    end = list(begin)
    for position, partition in itertools.islice(heapq.merge(*tagged), max_rows):
        end[partition] = position
    return end
