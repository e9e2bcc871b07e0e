"""Writing streams from Spark: batch and Structured Streaming writers.

Rows are turned into records, partitioned by streamkit's partitioner and encoded by
the stream's codec, then appended by a Lua script that does exactly what ``send`` does
(``XADD *`` per entry, then the same trimming) after claiming an idempotency marker.

Idempotency: every task appends its rows in chunks, per stream partition. Chunk ``c``
of stream partition ``N`` written by Spark task partition ``t`` of batch ``b`` of write
``w`` is appended by one Lua call that first runs
``SET __sprk:{app.stream.N}:w:b:t:c 1 NX EX ttl`` and appends nothing if the marker
exists. The marker shares the partition's hash tag, so the check and the appends are
one atomic step, also on Redis Cluster. A retried task (or a replayed micro-batch)
that is given the same rows in the same order finds the markers of the chunks already
written and skips them.
"""

from __future__ import annotations

import functools
import logging
import uuid
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from .. import _keys, _lua
from .._codec import codec_for
from .._errors import ConfigError, EncodeError
from .._partitioner import Partitioner, partition_for
from .._produce import say_dropped
from .._redispy import run_script
from .._urls import masked_repr
from .._wire import (
    DEFAULT_MAX_RECORD_SIZE,
    DEFAULT_SEND_CHUNK_BYTES,
    REDIS_MAX_BULK,
    format_size,
)
from ._client import connect, redis_errors
from ._options import load_record
from ._schema import record_schema

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from pyspark.sql import Row

__all__ = ["BatchWriter", "StreamWriter", "WritePlan", "WriteResult", "marker_key"]

log = logging.getLogger("streamkit.spark")

# Spark's local properties naming the streaming query and micro-batch of a task.
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_BATCH_ID_PROPERTY = "streaming.sql.batchId"

# The append of one chunk, once per marker (see its file).
_WRITE_SCRIPT = _lua.script("spark/write")


def marker_key(
    app: str, stream: str, partition: int, write_id: str, batch: str, task: int, chunk: int
) -> str:
    """The idempotency marker of one chunk; in the slot of the partition's stream."""
    return _keys.spark_marker_key(app, stream, partition, write_id, batch, task, chunk)


@attrs.frozen(kw_only=True)
class WritePlan:
    """Everything a write task needs, decided and checked on the driver; plain data.

    Attributes:
        url, app, stream: where to write.
        partition_count: the stream's partition count.
        record: ``module:Class`` of the record type, or ``None`` (raw ``fields`` column).
        compression: as the ``compression`` setting.
        key: the column or record field partitioned by.
        key_is_field: whether ``key`` is a field of the record (then the partitioner
            reads it from the record, exactly as ``send`` does).
        columns: the input DataFrame's column names, in order.
        chunk_size, marker_ttl, partition_size, max_len, max_record_size: see the
            options.
        server_limit: the longest string the server accepts (``proto-max-bulk-len``),
            read on the driver.
    """

    url: str = attrs.field(repr=masked_repr)
    app: str
    stream: str
    partition_count: int
    record: str | None
    compression: str | None
    key: str
    key_is_field: bool
    columns: tuple[str, ...]
    chunk_size: int
    marker_ttl: int
    partition_size: int
    max_len: int | None
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE
    server_limit: int = REDIS_MAX_BULK


@attrs.frozen
class WriteResult(WriterCommitMessage):  # type: ignore[misc, unused-ignore]
    """What one write task did: entries appended, and chunks skipped as already written."""

    appended: int
    skipped_chunks: int


# A row -> (stream partition, [field count, name, value, ...], size in bytes).
_RowEncoder: TypeAlias = "Callable[[Sequence[Any]], tuple[int, Sequence[bytes | int], int]]"


def _check_size(size: int, plan: WritePlan) -> None:
    if size > plan.max_record_size:
        raise EncodeError(
            f"an entry is {format_size(size)}, more than maxRecordSize "
            f"({format_size(plan.max_record_size)})"
        )
    if size > plan.server_limit:
        raise EncodeError(
            f"an entry is {format_size(size)}, more than Redis accepts "
            f"(proto-max-bulk-len, {format_size(plan.server_limit)})"
        )


@functools.lru_cache(maxsize=32)
def _row_encoder(plan: WritePlan) -> _RowEncoder:
    """Row -> (stream partition, [field count, name, value, ...], size), built once per plan.

    Error handling:
        (from the function) :class:`EncodeError` for an entry larger than
        ``maxRecordSize`` or than the server accepts.
    """
    count = plan.partition_count
    key_index = plan.columns.index(plan.key) if plan.key in plan.columns else -1
    if plan.record is None:
        fields_index = plan.columns.index("fields")

        def encode_raw(row: Sequence[Any]) -> tuple[int, list[bytes | int], int]:
            fields = row[fields_index]
            entry: list[bytes | int] = [len(fields)]
            size = 0
            for name, value in fields.items():
                raw_name = name.encode("utf-8")
                raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
                entry.append(raw_name)
                entry.append(raw)
                size += len(raw_name) + len(raw)
            _check_size(size, plan)
            return partition_for(row[key_index], count), entry, size

        return encode_raw

    record = load_record(plan.record)
    schema = record_schema(record)
    build = schema.builder(plan.columns)
    encode_entry = codec_for(
        record,
        compression=plan.compression,
        max_record_size=plan.max_record_size,
        stream=plan.stream,
    ).entry_encoder()
    partitioner = (
        Partitioner(partition_by=plan.key, partition_count=count, record=record)
        if plan.key_is_field
        else None
    )

    def encode_record(row: Sequence[Any]) -> tuple[int, Sequence[bytes | int], int]:
        value = build(row)
        entry, size = encode_entry(value)
        if size > plan.server_limit:
            _check_size(size, plan)
        if partitioner is not None:
            return partitioner.partition_of(value), entry, size
        return partition_for(row[key_index], count), entry, size

    return encode_record


def write_rows(plan: WritePlan, rows: Iterator[Row], write_id: str, batch: str) -> WriteResult:
    """Append one task's rows; chunks already written by an earlier attempt are skipped.

    A chunk is ``chunk_size`` rows of a stream partition, or fewer when they would
    take more than :data:`~streamkit._wire.DEFAULT_SEND_CHUNK_BYTES` (a row larger
    than that alone makes a chunk of its own), as ``send_many`` splits its appends.
    """
    context = TaskContext.get()
    task = context.partitionId() if context is not None else 0
    encode = _row_encoder(plan)
    buffers: list[list[bytes | int]] = [[] for _ in range(plan.partition_count)]
    sizes = [0] * plan.partition_count
    # Bytes of entries in each partition's buffer.
    volumes = [0] * plan.partition_count
    chunks = [0] * plan.partition_count
    appended = skipped = 0
    with connect(plan.url) as client:
        head: list[bytes | int] = [plan.partition_size, plan.max_len or 0, plan.marker_ttl]

        def flush(partition: int) -> None:
            nonlocal appended, skipped
            marker = marker_key(
                plan.app, plan.stream, partition, write_id, batch, task, chunks[partition]
            )
            with redis_errors(plan.url):
                done, dropped = run_script(
                    client,
                    _WRITE_SCRIPT,
                    [_keys.stream_key(plan.app, plan.stream, partition), marker],
                    head + buffers[partition],
                )
            if done < 0:
                skipped += 1
            else:
                appended += done
            if dropped:
                say_dropped(plan.max_len, dropped, plan.stream, partition)
            chunks[partition] += 1
            buffers[partition] = []
            sizes[partition] = 0
            volumes[partition] = 0

        for row in rows:
            try:
                partition, entry, size = encode(row)
            except (EncodeError, ConfigError):
                raise
            except Exception as exc:
                raise EncodeError(f"cannot turn row {row!r} into a record: {exc}") from exc
            if sizes[partition] and volumes[partition] + size > DEFAULT_SEND_CHUNK_BYTES:
                flush(partition)
            buffers[partition].extend(entry)
            sizes[partition] += 1
            volumes[partition] += size
            if sizes[partition] >= plan.chunk_size:
                flush(partition)
        for partition in range(plan.partition_count):
            if sizes[partition]:
                flush(partition)
    return WriteResult(appended, skipped)


class BatchWriter(DataSourceWriter):  # type: ignore[misc, unused-ignore]
    """A batch write (``df.write.format("streamkit")``), idempotent across task retries.

    ``write_id`` is drawn once per write on the driver (or given as the ``writeId``
    option, which also makes re-running the same job idempotent).
    """

    def __init__(self, plan: WritePlan, write_id: str | None) -> None:
        self.plan = plan
        self.write_id = write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[Row]) -> WriteResult:
        return write_rows(self.plan, iterator, self.write_id, "b")

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_results(self.plan, self.write_id, "batch", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Appended entries cannot be taken back (workers may have processed them);
        # a re-run with the same writeId skips what was written.
        log.warning("streamkit write %s to %s aborted", self.write_id, self.plan.stream)


class StreamWriter(DataSourceStreamWriter):  # type: ignore[misc, unused-ignore]
    """A Structured Streaming write, idempotent across micro-batch replays.

    Markers are keyed by the streaming query's id (stable across restarts from the
    checkpoint) and the micro-batch id, both read from the task's local properties.
    """

    def __init__(self, plan: WritePlan, write_id: str | None) -> None:
        self.plan = plan
        self.write_id = write_id
        self.fallback_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Row]) -> WriteResult:
        context = TaskContext.get()
        query = batch = None
        if context is not None:
            query = context.getLocalProperty(_QUERY_ID_PROPERTY)
            batch = context.getLocalProperty(_BATCH_ID_PROPERTY)
        if batch is None:
            # Without a batch id a replay cannot be recognised; still write, once.
            log.warning("no micro-batch id in the task context: writes are not idempotent")
            batch = uuid.uuid4().hex
        return write_rows(self.plan, iterator, self.write_id or query or self.fallback_id, batch)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_results(self.plan, self.write_id or "-", f"micro-batch {batchId}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("streamkit micro-batch %d to %s aborted", batchId, self.plan.stream)


def _log_results(
    plan: WritePlan, write_id: str, what: str, messages: list[WriterCommitMessage | None]
) -> None:
    results = [m for m in messages if isinstance(m, WriteResult)]
    log.info(
        "streamkit %s %s to %s.%s: %d entries appended, %d chunks skipped as already written",
        what,
        write_id,
        plan.app,
        plan.stream,
        sum(r.appended for r in results),
        sum(r.skipped_chunks for r in results),
    )
