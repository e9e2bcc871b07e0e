"""Versioned tables: each key's values over time, read as of an event's time.

A :class:`VersionedTable` is a :class:`~streamkit.Table` of each key's latest value
(read it as any table: ``read``, ``items``, the CLI, the clients, Spark) beside a
second table of the same partitions, ``NAME__versions``, holding each key's versions:
the JSON array ``[[time, value], ..., [time]]`` in time order, ``[time]`` a deletion.
Both are written by the table's one processor, in its commit, so both are exact.

Retention, per key: a write keeps the versions newer than the key's newest time minus
``retention``, and the one before them (the value in force at that bound), so a read
as of any time within the retention is answered, and a read as of a time before a
key's oldest kept version reads the default.
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import orjson

from ._errors import ConfigError, DecodeError
from ._event import Event
from ._json_converter import converter
from ._state import _current
from ._tables import _NO_DEFAULT, Table
from ._windows import to_ms

if TYPE_CHECKING:
    from ._redis import Redis
    from ._spec import StreamSpec

__all__ = ["VersionedTable", "as_of_ms", "insert_version", "prune_versions"]

V = TypeVar("V")

#: A key's versions as stored: ``[time, value]``, or ``[time]`` for a deletion.
Versions = list[list[Any]]


def as_of_ms(at: object, what: str = "as_of") -> int:
    """``at`` in ms: a datetime, seconds since the epoch, or an event (its entry id's
    time)."""
    if isinstance(at, Event):
        return int(at.entry_id.partition("-")[0])
    if isinstance(at, bool) or not isinstance(at, datetime | int | float):
        raise ConfigError(
            what, f"expected a datetime, seconds since the epoch or an Event, got {at!r}"
        )
    return to_ms(at)


def prune_versions(versions: Versions, retention: int) -> Versions:
    """``versions`` (in time order) without those past ``retention`` (ms) of the newest:
    the versions newer than the bound are kept, and the one in force at the bound (a
    deletion too: a later write older than it must not show through)."""
    if not versions:
        return versions
    bound = versions[-1][0] - retention
    first = bisect_right(versions, bound, key=lambda v: v[0])  # the first newer than bound
    if first == 0:
        return versions
    return versions[first - 1 :]


def insert_version(versions: Versions, version: list[Any]) -> bool:
    """Put ``version`` in its place in ``versions`` (replacing one of the same time);
    whether it is the newest."""
    at = version[0]
    place = bisect_right(versions, at, key=lambda v: v[0])
    if place and versions[place - 1][0] == at:
        versions[place - 1] = version
        return place == len(versions)
    versions.insert(place, version)
    return place == len(versions) - 1


@attrs.define(eq=False, repr=False)
class _Versions(Table[Versions]):
    """The table of a versioned table's versions: JSON arrays, stored as they are."""

    def encode(self, value: Versions) -> bytes:
        return orjson.dumps(value)

    def decode(self, raw: bytes) -> Versions:
        try:
            versions = orjson.loads(raw)
            if type(versions) is not list or not all(
                type(v) is list and 1 <= len(v) <= 2 and type(v[0]) is int for v in versions
            ):
                raise ValueError("not a list of [time, value] and [time]")
        except ValueError as exc:
            raise DecodeError(f"stored versions: {exc}", stream=f"table {self.name!r}") from exc
        return versions


@attrs.define(eq=False, repr=False)
class VersionedTable(Table[V]):
    """A table keeping each key's values over time, for ``retention``; declared with
    :meth:`streamkit.App.versioned_table`.

    Its writer writes with ``await table.put(key, value, at=...)`` and ``await
    table.delete(key, at=...)`` (``at``: the time the value holds from; the event in
    flight's by default); anyone reads ``await table.get(key, as_of=...)`` (or
    ``read``): the value in force at that time. Without ``as_of`` it is a table of the
    latest values, read as any other.

    Attributes:
        retention: milliseconds of each key's history kept behind its newest version.
        versions: the table of each key's versions, written by the same processor.
    """

    retention: int = attrs.field(kw_only=True, default=0)
    versions: Table[list[Any]] = attrs.field(init=False)

    kind_name = "versioned table"

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if isinstance(self.retention, bool) or not isinstance(self.retention, int):
            raise ConfigError("retention", f"must be milliseconds, got {self.retention!r}")
        if self.retention <= 0:
            raise ConfigError("retention", f"must be positive, got {self.retention!r}")
        self.versions = _Versions(
            f"{self.name}__versions", list, None, ttl=self.ttl, connection=self._connection
        )

    def bind(self, stream: StreamSpec[Any], processor: str) -> None:
        """Make ``processor`` of ``stream`` the writer of the table and its versions."""
        super().bind(stream, processor)
        self.versions.bind(stream, processor)

    # -- inside the writer --

    def set(self, key: object, value: V) -> None:
        """Refused: a versioned table is written with ``await table.put(key, value)``
        (a write reads the key's versions first)."""
        raise ConfigError(
            "versioned table",
            f"{self.name!r} is written with `await {self.name}.put(key, value, at=...)`, not set()",
        )

    def _now(self) -> int:
        state = _current.get()
        if state is None:
            raise ConfigError(
                "versioned table",
                f"{self.name!r}: put() and delete() run in the processor that writes it",
            )
        return state.event_time()

    async def put(self, key: object, value: V, *, at: object = None) -> None:
        """Write ``value`` under ``key``, in force from ``at`` (a datetime, seconds since
        the epoch, or an :class:`~streamkit.Event`; the event in flight's time when
        ``None``) until the key's next version. A write older than the key's newest
        goes into its history and leaves the latest value as it is.

        Error handling:
            :class:`~streamkit.EncodeError` for a value that is not a valid ``value``;
            :class:`~streamkit.WrongPartition` for a key of another partition;
            :class:`ConfigError` outside the processor that writes the table.
        """
        moment = self._now() if at is None else as_of_ms(at, "at")
        stored = converter.unstructure(value, self.value)
        self.encode(value)  # refuses a value of another type now, not at the commit
        await self._write(key, [moment, stored], value)

    async def delete(self, key: object, *, at: object = None) -> None:  # type: ignore[override]
        """Delete ``key`` from ``at`` on (as :meth:`put`): reads as of a later time get
        the default, until a later version."""
        moment = self._now() if at is None else as_of_ms(at, "at")
        await self._write(key, [moment], None)

    async def _write(self, key: object, version: list[Any], value: V | None) -> None:
        versions = list(await self.versions.get(key, None) or ())
        newest = insert_version(versions, version)
        self.versions.set(key, prune_versions(versions, self.retention))
        if newest:
            if len(version) == 2:
                Table.set(self, key, value)  # type: ignore[misc]
            else:
                Table.delete(self, key)
        elif self.ttl is not None and len(versions[-1]) == 2:
            # The latest value lives as long as the history it heads (a ttl counts from
            # the last write of either).
            Table.set(self, key, self._decode_version(versions[-1][1]))

    # -- from anywhere --

    async def get(self, key: object, default: V | None = _NO_DEFAULT, *, as_of: object = None) -> V:
        """The value of ``key``: the latest (as :meth:`Table.get`), or the one in force
        ``as_of`` a time (a datetime, seconds since the epoch, or an
        :class:`~streamkit.Event`); ``default`` where none was, or where that time is
        before the key's oldest kept version."""
        if as_of is None:
            return await super().get(key, default)
        moment = as_of_ms(as_of)
        value: V = self.value_as_of(await self.versions.get(key, None), moment, default)
        return value

    async def read(
        self,
        key: object,
        default: V | None = _NO_DEFAULT,
        *,
        as_of: object = None,
        redis: Redis | None = None,
    ) -> V:
        """The committed value of ``key``, from any process: the latest, or the one in
        force ``as_of`` a time (see :meth:`get`)."""
        if as_of is None:
            return await super().read(key, default, redis=redis)
        moment = as_of_ms(as_of)
        versions = await self.versions.read(key, None, redis=redis)
        value: V = self.value_as_of(versions, moment, default)
        return value

    async def history(
        self, key: object, *, redis: Redis | None = None
    ) -> list[tuple[datetime, V | None]]:
        """The committed versions of ``key`` kept, oldest first: each the time it holds
        from (UTC) and its value (``None`` for a deletion)."""
        versions = await self.versions.read(key, None, redis=redis) or []
        return [
            (
                datetime.fromtimestamp(v[0] / 1000, UTC),
                self._decode_version(v[1]) if len(v) == 2 else None,
            )
            for v in versions
        ]

    def value_as_of(self, versions: Versions | None, moment: int, default: Any) -> Any:
        """The value in force at ``moment`` (ms) in ``versions`` (as stored); ``default``
        (the table's if not given) where none is."""
        if default is _NO_DEFAULT:
            default = self.default
        if not versions:
            return default
        place = bisect_right(versions, moment, key=lambda v: v[0])
        if place == 0:
            return default
        version = versions[place - 1]
        return self._decode_version(version[1]) if len(version) == 2 else default

    def _decode_version(self, stored: Any) -> V:
        try:
            return converter.structure(stored, self.value)  # type: ignore[no-any-return]
        except Exception as exc:
            raise DecodeError(f"a stored version: {exc}", stream=f"table {self.name!r}") from exc

    def __repr__(self) -> str:
        where = self._where()
        kind = getattr(self.value, "__name__", self.value)
        return f"<VersionedTable {self.name!r}{where} value={kind} retention={self.retention}ms>"
