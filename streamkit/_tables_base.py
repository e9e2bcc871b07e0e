"""What every kind of table shares: its one writer, where its keys live, scanning.

A table (:class:`~streamkit.Table`) or a windowed table
(:class:`~streamkit.WindowedTable`) is written by one processor of one stream and
partitioned like it: partition N is a hash in the slot of the stream's partition N.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import orjson

from . import _keys
from ._errors import ConfigError
from ._json_converter import converter
from ._partitioner import partition_for
from ._redis import redis_errors

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from ._redis import Redis
    from ._spec import StreamSpec

__all__ = ["SCAN_COUNT", "KeyedState", "check_storable"]

#: Keys read per ``HSCAN`` call when a table is scanned.
SCAN_COUNT = 1000


def _check_name(_: object, __: attrs.Attribute[str], name: str) -> None:
    _keys.validate_name("table name", name)


def check_storable(what: str, setting: str, given: object, value: Any) -> None:
    """Refuse at declaration a ``default`` or ``initial`` that the table ``what`` could
    not store as its ``value`` type and read back (``None`` passes: it means none)."""
    if given is None:
        return
    try:
        converter.structure(orjson.loads(orjson.dumps(converter.unstructure(given, value))), value)
    except Exception as exc:
        kind = getattr(value, "__name__", repr(value))
        raise ConfigError(setting, f"{what}: {given!r} is not a valid {kind} ({exc})") from None


@attrs.define(eq=False, repr=False)
class KeyedState:
    """The part of a table that is not about its values.

    Attributes:
        name: the table's name (unique in its app).
        stream: the stream the table is kept beside, once bound.
        processor: the processor that writes it, once bound.
    """

    name: str = attrs.field(validator=_check_name)
    stream: StreamSpec[Any] | None = attrs.field(default=None, kw_only=True)
    processor: str | None = attrs.field(default=None, kw_only=True)
    _connection: Callable[[], Redis] | None = attrs.field(default=None, kw_only=True)

    #: What the table is called in messages.
    kind_name = "table"

    def bind(self, stream: StreamSpec[Any], processor: str) -> None:
        """Make ``processor`` of ``stream`` the table's writer.

        Error handling:
            :class:`ConfigError` if another processor writes it already.
        """
        if self.stream is not None and (self.stream, self.processor) != (stream, processor):
            raise ConfigError(
                "tables",
                f"table {self.name!r} is written by processor {self.processor!r} of "
                f"{self.stream.name!r} already; a table has one writer",
            )
        self.stream = stream
        self.processor = processor

    def _home(self) -> StreamSpec[Any]:
        if self.stream is None:
            raise ConfigError(
                "tables",
                f"{self.kind_name} {self.name!r} is not written by any processor: name it "
                f"in @app.processor(..., tables=[{self.name}])",
            )
        return self.stream

    def partition_of(self, key: object) -> int:
        """The partition ``key`` belongs to (the stream's partitioner's answer)."""
        return partition_for(key, self._home().partition_count)

    def partition_total(self) -> int:
        """How many partitions the table has (its stream's; a global table's one)."""
        return self._home().partition_count

    def key(self, partition: int) -> str:
        """The Redis hash holding ``partition`` of the table."""
        raise NotImplementedError

    def _redis(self, redis: Redis | None) -> Redis:
        if redis is not None:
            return redis
        if self._connection is None:
            raise ConfigError(
                "redis", f"{self.kind_name} {self.name!r}: pass the Redis client (redis=...)"
            )
        return self._connection()

    async def _scan(
        self, partition: int | None, redis: Redis | None
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        """Every committed ``(field, raw value)``, partition by partition (or of one)."""
        client = self._redis(redis)
        partitions = range(self.partition_total()) if partition is None else [partition]
        for p in partitions:
            cursor = 0
            while True:
                with redis_errors():
                    cursor, page = await client.hscan(self.key(p), cursor, count=SCAN_COUNT)
                for field, raw in page.items():
                    yield field, raw
                if cursor == 0:
                    break

    async def sizes(self, *, redis: Redis | None = None) -> list[int]:
        """The number of keys in each partition, in partition order."""
        client = self._redis(redis)
        with redis_errors():
            async with client.pipeline(transaction=False) as pipe:
                replies = [pipe.hlen(self.key(p)) for p in range(self.partition_total())]
        return [int(await r) for r in replies]

    def _where(self) -> str:
        if self.stream is None:
            return ""
        return f" of {self.stream.name!r} by {self.processor!r}"
