"""Tables: keyed state a processor keeps beside its stream, committed exactly once.

A :class:`Table` is written by one processor of one stream, partition by partition:
partition N of the table is the hash ``__tabl:{app.stream.N}.table``, in the hash
slot of the stream's partition N, its lease and its consumer group. The processor's
writes are applied by the same fenced script that acknowledges the events behind them
(see :mod:`streamkit._state`), so the table reflects every event exactly once.

Keys are partition keys: a key belongs to the partition the stream's partitioner puts
it in, and a processor may only write the keys of the partition it is processing (the
co-partitioning rule). Values go through the JSON converter of records: any type a
record field may have (a number, a string, a record, a list of records, ...).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import orjson

from . import _keys
from ._errors import ConfigError, DecodeError, EncodeError
from ._json_converter import converter
from ._lua import script
from ._partitioner import canonical_key_bytes, key_text
from ._redis import LuaScript, redis_errors
from ._state import _current, current_view, writing_view
from ._state_views import MISSING, PLAIN_TYPES, UNKNOWN
from ._tables_base import SCAN_COUNT, KeyedState, check_storable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from ._redis import Redis
    from ._spec import StreamSpec

__all__ = ["Table"]

V = TypeVar("V")

log = logging.getLogger("streamkit.tables")

_NO_DEFAULT: Any = object()

#: Reads a table whose keys expire, never returning an expired key (by Redis's clock).
_READ = LuaScript(script("tables/read"))
_SCAN = LuaScript(script("tables/scan"))


@attrs.define(eq=False, repr=False)
class Table(KeyedState, Generic[V]):
    """Keyed state written by one processor, exactly once, readable from anywhere.

    Declare one with :meth:`streamkit.App.table` and name it in the processor that
    writes it (``@app.processor(orders, tables=[totals])``); for a composed service,
    construct it with the stream it is kept beside and pass it to
    :func:`~streamkit.open_events`.

    Inside the processor (the partition being processed):

    * ``await table.get(key)`` reads the value, this processor's uncommitted writes
      first, then a per-partition cache, then Redis;
    * ``table.set(key, value)`` and ``table.delete(key)`` write; the writes land with
      the acknowledgement of the events being processed, or not at all.

    From anywhere (a web handler, a script, another processor):
    ``await table.read(key)`` and ``table.items()`` read the committed state.

    Attributes:
        name: the table's name (unique in its app).
        value: the type of its values.
        ttl: milliseconds a key lives after its last write, or ``None`` (for ever).
        default: what :meth:`get` and :meth:`read` return for a missing key
            (``None`` unless given).
        stream: the stream the table is kept beside, once bound.
        processor: the processor that writes it, once bound.
    """

    value: Any
    default: V | None = None
    ttl: int | None = attrs.field(default=None, kw_only=True)
    #: Where its writes are sent on as changes (a table join, a global table): each a
    #: stream and the tag of its changes (see streamkit._table_joins).
    feeds: list[tuple[StreamSpec[Any], bytes]] = attrs.field(factory=list, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        check_storable(f"table {self.name!r}", "default", self.default, self.value)
        if self.ttl is not None and (
            isinstance(self.ttl, bool) or not isinstance(self.ttl, int) or self.ttl <= 0
        ):
            raise ConfigError("ttl", f"must be a positive number of milliseconds, got {self.ttl!r}")

    # -- encoding --

    def encode(self, value: V) -> bytes:
        """``value`` as stored.

        Error handling:
            :class:`~streamkit.EncodeError` if it is not a valid ``value``.
        """
        try:
            if type(value) is self.value and type(value) in PLAIN_TYPES:
                return orjson.dumps(value)
            return orjson.dumps(converter.unstructure(value, self.value))
        except Exception as exc:
            raise EncodeError(f"table {self.name!r}: cannot encode {value!r}: {exc}") from exc

    def decode(self, raw: bytes) -> V:
        """A stored value, decoded.

        Error handling:
            :class:`~streamkit.DecodeError` if it is not a valid encoding.
        """
        try:
            return converter.structure(orjson.loads(raw), self.value)  # type: ignore[no-any-return]
        except Exception as exc:
            raise DecodeError(f"a stored value: {exc}", stream=f"table {self.name!r}") from exc

    # -- where keys live --

    def key(self, partition: int) -> str:
        """The Redis hash holding ``partition`` of the table."""
        home = self._home()
        return _keys.table_key(home.app, home.name, self.name, partition)

    def expiry_key(self, partition: int) -> str:
        """The sorted set of ``partition``'s keys by when they expire (with a ``ttl``)."""
        home = self._home()
        return _keys.table_expiry_key(home.app, home.name, self.name, partition)

    # -- inside the processor --

    async def get(self, key: object, default: V | None = _NO_DEFAULT) -> V:
        """The value of ``key`` as this processor sees it (its own writes first).

        Inside the processor that writes the table, this reads the partition's
        uncommitted writes, then its cache, then Redis. Anywhere else it is
        :meth:`read`.

        Error handling:
            :class:`WrongPartition` (in the writing processor) for a key of another
            partition; :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
        """
        state = _current.get()  # current_view(self), inlined: once per event
        view = None if state is None else state.views.get(self)
        if view is None:
            return await self.read(key, default)
        if default is _NO_DEFAULT:
            default = self.default
        value = view.peek(key)
        if value is UNKNOWN:
            return await view.get(key, default)  # type: ignore[no-any-return]
        return default if value is MISSING else value  # type: ignore[return-value]

    async def get_many(self, keys: Iterable[object]) -> list[V]:
        """The values of ``keys``, in order, in one round trip for those not cached."""
        view = current_view(self)
        keys = list(keys)
        if view is None:
            return await self.read_many(keys)
        values: list[V] = await view.get_many(keys, self.default)
        return values

    def set(self, key: object, value: V) -> None:
        """Write ``value`` under ``key``; it lands with the next commit.

        Values are kept as given until the commit: treat them as immutable (set a new
        value rather than changing one in place).
        """
        state = _current.get()  # writing_view(self), inlined: once per event
        view = None if state is None else state.views.get(self)
        (writing_view(self) if view is None else view).set(key, value)

    def delete(self, key: object) -> None:
        """Remove ``key``; it lands with the next commit."""
        writing_view(self).delete(key)

    # -- from anywhere --

    async def read(
        self, key: object, default: V | None = _NO_DEFAULT, *, redis: Redis | None = None
    ) -> V:
        """The committed value of ``key``, from any process; ``default`` if missing.

        Reads Redis directly, never a worker: what the writing processor committed
        last, without its uncommitted writes.
        """
        client = self._redis(redis)
        partition = self.partition_of(key)
        field = canonical_key_bytes(key)
        with redis_errors():
            if self.ttl is None:
                raw = await client.hget(self.key(partition), field)
            else:
                (raw,) = await _READ(client, keys=self._expiring_keys(partition), args=[field])
        if raw is None:
            return self.default if default is _NO_DEFAULT else default  # type: ignore[return-value]
        return self.decode(raw)

    def _expiring_keys(self, partition: int) -> list[str]:
        """The keys the readers of a table with a ``ttl`` name: its hash, its index."""
        return [self.key(partition), self.expiry_key(partition)]

    async def read_many(self, keys: Iterable[object], *, redis: Redis | None = None) -> list[V]:
        """The committed values of ``keys``, in order (``default`` where missing)."""
        client = self._redis(redis)
        keys = list(keys)
        by_partition: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            by_partition.setdefault(self.partition_of(key), []).append(i)
        out: list[V] = [self.default] * len(keys)  # type: ignore[list-item]
        with redis_errors():
            for partition, positions in by_partition.items():
                fields = [canonical_key_bytes(keys[i]) for i in positions]
                if self.ttl is None:
                    raws = await client.hmget(self.key(partition), fields)
                else:
                    raws = await _READ(client, keys=self._expiring_keys(partition), args=fields)
                for i, raw in zip(positions, raws, strict=True):
                    if raw is not None:
                        out[i] = self.decode(raw)
        return out

    async def items(
        self, *, partition: int | None = None, redis: Redis | None = None
    ) -> AsyncIterator[tuple[str, V]]:
        """Every committed ``(key, value)``, partition by partition (or of one).

        Keys come back in their text form (``5`` as ``"5"``; see
        :func:`~streamkit.lowlevel.key_text` for a bytes key that is not UTF-8). Scanning is
        incremental (``HSCAN``): a table changing meanwhile may show a key twice or
        miss one written during the scan, never a value that was not committed.
        """
        if self.ttl is None:
            async for field, raw in self._scan(partition, redis):
                yield key_text(field), self.decode(raw)
            return
        client = self._redis(redis)
        partitions = range(self.partition_total()) if partition is None else [partition]
        for p in partitions:
            cursor: Any = 0
            while True:
                with redis_errors():
                    cursor, flat = await _SCAN(
                        client, keys=self._expiring_keys(p), args=[cursor, SCAN_COUNT]
                    )
                for i in range(0, len(flat), 2):
                    yield key_text(flat[i]), self.decode(flat[i + 1])
                if int(cursor) == 0:
                    break

    def __repr__(self) -> str:
        where = f" of {self.stream.name!r} by {self.processor!r}" if self.stream is not None else ""
        return f"<Table {self.name!r}{where} value={getattr(self.value, '__name__', self.value)}>"
