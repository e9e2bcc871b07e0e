"""The ``streamkit`` data source: option checking on the driver, readers and writers."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource

from .. import _keys
from .._errors import ConfigError, MetadataMismatch, StreamkitError
from .._lua import script
from .._redispy import run_script
from .._spec import record_metadata
from .._wire import METADATA_VERSION
from ._client import connect, read_metadata, redis_errors, server_bulk_limit
from ._options import (
    ReadOptions,
    WriteOptions,
    check_record_metadata,
    load_record,
)
from ._reader import BatchReader, StreamReader
from ._schema import read_schema, record_schema
from ._tables import TABLE_SCHEMA, WINDOWED_SCHEMA, TableReader, table_kind
from ._writer import BatchWriter, StreamWriter, WritePlan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = ["StreamNotFound", "StreamkitDataSource", "register"]


class StreamNotFound(StreamkitError, LookupError):
    """A read names a stream that has no recorded metadata, so it does not exist."""

    def __init__(self, app: str, stream: str, hint: str | None = None) -> None:
        hint = hint or "check the app and stream options, and that a producer has sent to it"
        super().__init__(
            f"stream {stream!r} of app {app!r} does not exist: no metadata hash "
            f"{_keys.meta_key(app, stream)} ({hint})"
        )
        self.app = app
        self.stream = stream


def _partition_count(stream: str, metadata: dict[str, str]) -> int:
    try:
        return int(metadata["partition_count"])
    except (KeyError, ValueError):
        raise ConfigError(
            "stream", f"the metadata of {stream!r} has no valid partition_count: {metadata}"
        ) from None


class StreamkitDataSource(DataSource):  # type: ignore[misc, unused-ignore]
    """The ``streamkit`` Spark data source: batch and streaming reads and writes.

    Holds only its options; every Redis connection is opened inside the method that
    uses it and closed before it returns, so nothing unpicklable is ever shipped.

    Error handling:
        Bad options raise :class:`~streamkit.ConfigError`; an unknown stream
        :class:`StreamNotFound`; a record class or partitioning that disagrees with
        the stream's metadata :class:`~streamkit.MetadataMismatch`; an unreachable
        server :class:`~streamkit.RedisUnavailable`. Spark wraps them, with their
        message, in its own exception.
    """

    @classmethod
    def name(cls) -> str:
        return "streamkit"

    # -- reading ------------------------------------------------------------------------

    def _read_setup(self) -> tuple[ReadOptions, int, StructType]:
        options = ReadOptions.parse(self.options)
        record = load_record(options.record) if options.record is not None else None
        schema = read_schema(record_schema(record) if record is not None else None)
        with connect(options.url) as client:
            metadata = read_metadata(client, options.url, options.app, options.stream)
            if not metadata:
                raise StreamNotFound(options.app, options.stream)
            if options.table is not None:
                count = _partition_count(options.stream, metadata)
                windowed = table_kind(client, options, count)
                # A table nothing was written to yet reads as empty.
                return options, count, WINDOWED_SCHEMA if windowed else TABLE_SCHEMA
        if record is not None:
            check_record_metadata(options.stream, metadata, record)
        return options, _partition_count(options.stream, metadata), schema

    def schema(self) -> StructType:
        return self._read_setup()[2]

    def reader(self, schema: StructType) -> BatchReader | TableReader:
        options, partition_count, read = self._read_setup()
        if options.table is not None:
            return TableReader(options, partition_count, windowed=read is WINDOWED_SCHEMA)
        if options.start_latest:
            raise ConfigError("start", "'latest' is for streaming reads only")
        return BatchReader(options, partition_count)

    def streamReader(self, schema: StructType) -> StreamReader:
        options, partition_count, _ = self._read_setup()
        if options.table is not None:
            raise ConfigError("table", "a table is read as a batch snapshot: use spark.read")
        if options.end is not None:
            raise ConfigError("end", "streaming reads have no end; use a batch read")
        return StreamReader(options, partition_count)

    # -- writing ------------------------------------------------------------------------

    def _plan(self, schema: StructType, overwrite: bool) -> tuple[WritePlan, str | None]:
        if overwrite:
            raise ConfigError(
                "mode", "streamkit streams are append-only; write with mode('append')"
            )
        options = WriteOptions.parse(self.options)
        columns = tuple(schema.fieldNames())
        record = load_record(options.record) if options.record is not None else None
        if record is not None:
            record_schema(record).builder(columns)  # checks the columns
        elif "fields" not in columns:
            raise ConfigError(
                "record",
                "give the record option (module:Class), or write a 'fields' column "
                "(a map of field name to value) to append raw entries",
            )
        with connect(options.url) as client:
            metadata = read_metadata(client, options.url, options.app, options.stream)
            if not metadata:
                metadata = self._create(client, options, record)
            server_limit = server_bulk_limit(client)
        if record is not None:
            check_record_metadata(options.stream, metadata, record)
        partition_count = _partition_count(options.stream, metadata)
        if options.partition_count is not None and options.partition_count != partition_count:
            raise MetadataMismatch(
                options.stream, "partition_count", partition_count, options.partition_count
            )
        recorded_key = metadata.get("partition_by", "")
        key = options.key or recorded_key
        if not key:
            raise ConfigError(
                "key", "the stream records no partition_by field: name the key column"
            )
        if options.key and recorded_key and options.key != recorded_key:
            raise MetadataMismatch(options.stream, "partition_by", recorded_key, options.key)
        key_is_field = record is not None and key in record_schema(record).names
        if not key_is_field and key not in columns:
            raise ConfigError(
                "key", f"no column or record field {key!r} (columns: {', '.join(columns)})"
            )
        plan = WritePlan(
            url=options.url,
            app=options.app,
            stream=options.stream,
            partition_count=partition_count,
            record=options.record,
            compression=options.compression,
            key=key,
            key_is_field=key_is_field,
            columns=columns,
            chunk_size=options.chunk_size,
            marker_ttl=options.marker_ttl,
            partition_size=options.partition_size,
            max_len=options.max_len,
            max_record_size=options.max_record_size,
            server_limit=server_limit,
        )
        return plan, options.write_id

    @staticmethod
    def _create(client: Any, options: WriteOptions, record: type[Any] | None) -> dict[str, str]:
        """Record a new stream's metadata as a producer would; return what is recorded."""
        if record is None or options.partition_count is None or options.key is None:
            raise StreamNotFound(
                options.app,
                options.stream,
                "to create it from Spark, give the record, partitionCount and key options",
            )
        if options.key not in record_schema(record).names:
            raise ConfigError("key", f"{record.__qualname__} has no field {options.key!r}")
        mine = {
            "version": METADATA_VERSION,
            "partition_count": str(options.partition_count),
            **record_metadata(record),
            "partition_by": options.key,
        }
        with redis_errors(options.url):
            run_script(
                client,
                script("streams/metadata"),
                [_keys.meta_key(options.app, options.stream)],
                list(itertools.chain.from_iterable(mine.items())),
            )
        return read_metadata(client, options.url, options.app, options.stream)

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        plan, write_id = self._plan(schema, overwrite)
        return BatchWriter(plan, write_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        plan, write_id = self._plan(schema, overwrite)
        return StreamWriter(plan, write_id)


def register(spark: SparkSession) -> None:
    """Register the ``streamkit`` data source with a Spark session."""
    spark.dataSource.register(StreamkitDataSource)
