"""Reading a table (or a windowed table) from Spark: a batch snapshot of its state.

``spark.read.format("streamkit").option("table", "totals")`` (with the ``stream`` the
writing processor reads) plans one Spark input partition per table partition and
reads each hash with ``HSCAN`` pages. Values come as their stored JSON text (parse
them with ``from_json``); a windowed table gives one row per window.

A snapshot per key: every value is one a commit wrote, never half of one; partitions
are scanned one after another, so a table changing meanwhile shows each partition as
it was when scanned.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .. import _keys, _lua
from .._keys import parse_window_member as parse_member
from .._partitioner import key_text
from .._redispy import run_script
from ._client import Client, connect, redis_errors

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._options import ReadOptions

__all__ = ["TABLE_SCHEMA", "WINDOWED_SCHEMA", "TableReader", "table_kind"]

#: A page of a table, without its expired keys (see streamkit._state_expiry).
_SCAN = _lua.script("tables/scan")

TABLE_SCHEMA = StructType(
    [
        StructField("partition", IntegerType(), nullable=False),
        StructField("key", StringType(), nullable=False),
        StructField("value", StringType(), nullable=True),
    ]
)
WINDOWED_SCHEMA = StructType(
    [
        StructField("partition", IntegerType(), nullable=False),
        StructField("key", StringType(), nullable=False),
        StructField("window_start", TimestampType(), nullable=False),
        StructField("window_end", TimestampType(), nullable=False),
        StructField("closed", BooleanType(), nullable=False),
        StructField("value", StringType(), nullable=True),
    ]
)


def _key(options: ReadOptions, partition: int, windowed: bool) -> str:
    assert options.table is not None
    make = _keys.window_key if windowed else _keys.table_key
    return make(options.app, options.stream, options.table, partition)


def _windows_key(options: ReadOptions, partition: int) -> str:
    assert options.table is not None
    return _keys.windows_key(options.app, options.stream, options.table, partition)


def table_kind(client: Client, options: ReadOptions, partition_count: int) -> bool | None:
    """Whether the table is windowed; ``None`` when no partition of it exists."""
    for partition in range(partition_count):
        with redis_errors(options.url):
            if client.exists(_key(options, partition, windowed=False)):
                return False
            if client.exists(_key(options, partition, windowed=True)):
                return True
            if client.exists(_windows_key(options, partition)):
                return True
    return None


class TablePartition(InputPartition):  # type: ignore[misc, unused-ignore]
    """One Spark input partition: one partition of the table."""

    def __init__(self, partition: int) -> None:
        super().__init__(partition)
        self.partition = partition


def _ms(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, UTC)


class TableReader(DataSourceReader):  # type: ignore[misc, unused-ignore]
    """A batch snapshot of a table, one Spark input partition per table partition."""

    def __init__(self, options: ReadOptions, partition_count: int, windowed: bool) -> None:
        self.options = options
        self.partition_count = partition_count
        self.windowed = windowed

    def partitions(self) -> list[TablePartition]:
        return [TablePartition(p) for p in range(self.partition_count)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TablePartition)
        options = self.options
        key = _key(options, partition.partition, self.windowed)
        with connect(options.url) as client:
            if self.windowed:
                yield from self._fixed_windows(client, partition.partition)
            if not self.windowed:
                yield from self._table(client, partition.partition, key)
                return
            cursor = 0
            while True:
                with redis_errors(options.url):
                    reply: Any = client.hscan(key, cursor, count=options.page_size)
                cursor, page = reply
                for field, raw in page.items():
                    name = key_text(field)
                    for start, end, value, emitted in orjson.loads(raw):
                        yield (
                            partition.partition,
                            name,
                            _ms(start),
                            _ms(end),
                            bool(emitted),
                            orjson.dumps(value).decode(),
                        )
                if cursor == 0:
                    return

    def _table(self, client: Client, partition: int, key: str) -> Iterator[tuple[Any, ...]]:
        """The rows of a table's partition, a page at a time, through ``tables/scan``: a
        key whose ``ttl`` ran out (by Redis's clock) is not there, swept yet or not."""
        options = self.options
        assert options.table is not None
        expiry = _keys.table_expiry_key(options.app, options.stream, options.table, partition)
        cursor: Any = 0
        while True:
            with redis_errors(options.url):
                cursor, flat = run_script(client, _SCAN, [key, expiry], [cursor, options.page_size])
            for i in range(0, len(flat), 2):
                yield (partition, key_text(flat[i]), flat[i + 1].decode())
            if int(cursor) == 0:
                return

    def _fixed_windows(self, client: Client, partition: int) -> Iterator[tuple[Any, ...]]:
        """The rows of a tumbling or hopping table's windows: a hash per window."""
        options = self.options
        assert options.table is not None
        with redis_errors(options.url):
            members: Any = client.zrange(_windows_key(options, partition), 0, -1)
        for start, end, closed in (parse_member(m) for m in members):
            make = _keys.window_closed_key if closed else _keys.window_values_key
            key = make(options.app, options.stream, options.table, partition, start)
            cursor = 0
            while True:
                with redis_errors(options.url):
                    reply: Any = client.hscan(key, cursor, count=options.page_size)
                cursor, page = reply
                for field, raw in page.items():
                    yield (partition, key_text(field), _ms(start), _ms(end), closed, raw.decode())
                if cursor == 0:
                    break
