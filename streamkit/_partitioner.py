"""Partitioning: which partition of a stream an event's key belongs to.

The mapping must give the same answer in every process, on every machine, under every
Python version and on the Spark side, forever: events of one key keep their order only
while they land in one partition. So it hashes a documented canonical byte form of the
key (see ``docs/partitioner.md``) with xxHash64, never Python's salted ``hash()``.
"""

from __future__ import annotations

import operator
import typing
from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from uuid import UUID

import attrs
import xxhash

from ._errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["Partitioner", "canonical_key_bytes", "key_text", "partition_for"]

R = TypeVar("R")

#: The xxHash64 seed; part of the partitioning contract, like the canonical key form.
_HASH_SEED = 0


def canonical_key_bytes(key: object) -> bytes:
    """Return the canonical byte form of a partition key, the input of the hash.

    * ``str``: its UTF-8 encoding.
    * ``bytes``, ``bytearray``, ``memoryview``: the bytes themselves.
    * ``bool``: ``b"true"`` or ``b"false"``.
    * ``int``: its ASCII decimal form (``-12`` is ``b"-12"``), so ``5`` and ``"5"`` are
      the same key and land in the same partition.
    * :class:`~uuid.UUID`: its lowercase hyphenated form, like ``str(uuid)``.
    * :class:`~enum.Enum` member: the canonical form of its value.

    Raises:
        ConfigError: the key is of another type. Floats are refused on purpose:
            ``0.1 + 0.2`` and ``0.3`` are different keys, and ``1.0`` has several
            plausible text forms; partition by an int or str field instead.
    """
    # Exact types first: they are nearly every key, and cheapest to recognise.
    key_type = type(key)
    if key_type is str:
        return key.encode("utf-8")  # type: ignore[attr-defined, no-any-return]
    if key_type is bytes:
        return key  # type: ignore[return-value]
    if key_type is int:
        return b"%d" % key  # type: ignore[str-format]
    return _canonical_other(key)


def key_text(canonical: bytes) -> str:
    """Return a key's text form, from its canonical bytes: how streamkit shows a key
    (a join's result and its ``result`` function, a table's ``items()``, the command
    line).

    The bytes as UTF-8, so ``5``, ``"5"`` and ``b"5"`` are all ``"5"``. A ``bytes`` key
    that is not UTF-8 has each byte that is not part of a UTF-8 character written as
    ``\\xNN`` (Python's ``backslashreplace``), so it is never an error: ``b"\\x00\\xff"``
    is ``"\\x00\\\\xff"``, shown on the command line as ``\\x00\\xff`` (as control
    characters are). The text form is for reading: a key holding such an escape
    literally (a backslash, ``x`` and two hex digits) has the same one; read a table by
    the key itself.
    """
    try:
        return canonical.decode()
    except UnicodeDecodeError:
        return canonical.decode("utf-8", "backslashreplace")


def _canonical_other(key: object) -> bytes:
    # Enum first: IntEnum and StrEnum members are also ints and strs, but their
    # canonical form is their value's.
    if isinstance(key, Enum):
        return canonical_key_bytes(key.value)
    # bool before int: True is an int, but b"true" is not b"1".
    if isinstance(key, bool):
        return b"true" if key else b"false"
    if isinstance(key, int):
        return b"%d" % key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    if isinstance(key, UUID):
        return str(key).encode("ascii")
    if isinstance(key, float):
        raise ConfigError(
            "key",
            f"float keys such as {key!r} are refused: equal-looking floats can differ "
            f"(0.1 + 0.2 != 0.3) and have no single text form; use an int or str key",
        )
    if key is None:
        raise ConfigError("key", "None is not a partition key; every event needs a key")
    raise ConfigError(
        "key",
        f"{type(key).__qualname__} is not a partition key type; use a str, bytes, int, "
        f"bool, UUID or Enum key, or a partition_by function that returns one",
    )


def _check_partition_count(partition_count: int) -> None:
    if type(partition_count) is not int or partition_count < 1:
        raise ConfigError(
            "partition_count", f"expected an int of at least 1, got {partition_count!r}"
        )


def partition_for(key: object, partition_count: int) -> int:
    """Return the partition, from 0 to ``partition_count - 1``, that a key belongs to.

    The result is ``xxh64(canonical_key_bytes(key), seed=0) % partition_count``, the
    64-bit hash taken as unsigned. It never changes between processes, machines or
    Python versions.

    Raises:
        ConfigError: ``partition_count`` is not an int of at least 1, or the key is not
            of a partitionable type (see :func:`~streamkit.lowlevel.canonical_key_bytes`).
    """
    _check_partition_count(partition_count)
    return xxhash.xxh64_intdigest(canonical_key_bytes(key), _HASH_SEED) % partition_count


def _validate_count(_: object, __: attrs.Attribute[int], partition_count: int) -> None:
    _check_partition_count(partition_count)


@attrs.frozen(kw_only=True)
class Partitioner(Generic[R]):
    """Maps records to partitions, by one of their fields or by a function.

    Example::

        partitioner = Partitioner(partition_by="order_id", partition_count=8, record=Order)
        partitioner.partition_of(order)  # same as partition_for(order.order_id, 8)

    Attributes:
        partition_by: the name of the field holding the key, or a function from a
            record to its key.
        partition_count: the number of partitions, at least 1.
        record: the record type. Optional; when given, a field name in
            ``partition_by`` is checked against its fields.

    Error handling:
        An unknown field name, a float field or a bad partition count raises
        :class:`~streamkit.ConfigError` at construction; :meth:`partition_of` raises
        it for a key of a type :func:`~streamkit.lowlevel.canonical_key_bytes`
        refuses.
    """

    partition_by: str | Callable[[R], object]
    partition_count: int = attrs.field(validator=_validate_count)
    record: type[R] | None = None
    _key_of: Callable[[R], object] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        key_of: Callable[[R], object]
        if isinstance(self.partition_by, str):
            if self.record is not None:
                _check_key_field(self.record, self.partition_by)
            if isinstance(self.record, type) and issubclass(self.record, Mapping):
                # dict records: the key is the value under that name.
                key_of = operator.itemgetter(self.partition_by)  # type: ignore[assignment]
            else:
                key_of = operator.attrgetter(self.partition_by)
        elif callable(self.partition_by):
            key_of = self.partition_by
        else:
            raise ConfigError(
                "partition_by", f"expected a field name or a function, got {self.partition_by!r}"
            )
        # Frozen: derived from partition_by, never reassigned.
        object.__setattr__(self, "_key_of", key_of)

    def key_of(self, record: R) -> object:
        """The partition key of ``record`` (its ``partition_by`` field, or what the
        function returns)."""
        return self._key_of(record)

    def partition_of(self, record: R) -> int:
        """Return the partition a record belongs to.

        Error handling:
            :class:`~streamkit.ConfigError` for a key of a type
            :func:`~streamkit.lowlevel.canonical_key_bytes` refuses, or a record without
            the key field (a ``dict`` record without that key).
        """
        try:
            key = canonical_key_bytes(self._key_of(record))
        except (KeyError, AttributeError, TypeError) as exc:
            if not isinstance(self.partition_by, str):
                raise
            raise ConfigError(
                "key",
                f"the record has no {self.partition_by!r} to partition by "
                f"({type(exc).__name__}: {exc}); every record needs one",
            ) from None
        return xxhash.xxh64_intdigest(key, _HASH_SEED) % self.partition_count

    def partitions_of(self, records: Sequence[R]) -> list[int]:
        """:meth:`partition_of` of each of ``records``, in one loop.

        Error handling:
            As :meth:`partition_of`, for the first record it refuses.
        """
        key_of = self._key_of
        count = self.partition_count
        digest = xxhash.xxh64_intdigest
        out: list[int] = []
        append = out.append
        try:
            for record in records:
                key: Any = key_of(record)
                # canonical_key_bytes, its exact types inlined.
                key_type = type(key)
                if key_type is str:
                    raw = key.encode("utf-8")
                elif key_type is bytes:
                    raw = key
                elif key_type is int:
                    raw = b"%d" % key
                else:
                    raw = canonical_key_bytes(key)
                append(digest(raw, _HASH_SEED) % count)
        except Exception:
            # The record that failed, the way partition_of says it.
            for record in records[len(out) :]:
                append(self.partition_of(record))
        return out


def _check_key_field(record: type[Any], name: str) -> None:
    if not attrs.has(record):
        # Not an attrs class: nothing to check against, attrgetter fails at first use.
        return
    fields = attrs.fields_dict(record)
    if name not in fields:
        raise ConfigError(
            "partition_by",
            f"{record.__qualname__} has no field {name!r} (its fields: {', '.join(fields)})",
        )
    try:
        field_type = typing.get_type_hints(record).get(name)
    except NameError:
        return  # an unresolvable annotation: the key's type is checked per event
    if field_type is float:
        raise ConfigError(
            "partition_by",
            f"{record.__qualname__}.{name} is a float field; floats are refused as "
            f"partition keys, use an int or str field",
        )
