"""Spark schemas derived from record classes, and conversions between records and rows.

A record's fields become typed Spark columns (see ``docs/spark.md`` for the table). The
conversions are compiled once per record class into closures, so reading and writing
do no type dispatch per value.
"""

from __future__ import annotations

import types
import typing
from collections.abc import (
    Mapping,
    MutableMapping,
    MutableSequence,
    MutableSet,
    Sequence,
    Set as AbstractSet,
)
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any
from uuid import UUID

import attrs
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .._errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "DECIMAL_PRECISION",
    "DECIMAL_SCALE",
    "METADATA_COLUMNS",
    "RecordSchema",
    "raw_schema",
    "read_schema",
    "record_schema",
]

#: Columns every read DataFrame starts with, before the record's fields.
METADATA_COLUMNS = ("partition", "entry_id", "event_time")

#: Decimal fields become DecimalType(38, 18): Spark's widest, with room on both sides.
DECIMAL_PRECISION = 38
DECIMAL_SCALE = 18
_QUANTUM = Decimal(1).scaleb(-DECIMAL_SCALE)

_SCALARS: dict[type, DataType] = {
    bool: BooleanType(),
    int: LongType(),
    float: DoubleType(),
    str: StringType(),
    bytes: BinaryType(),
    datetime: TimestampType(),
    date: DateType(),
    Decimal: DecimalType(DECIMAL_PRECISION, DECIMAL_SCALE),
    UUID: StringType(),
}

_ARRAYS = {list, tuple, set, frozenset, Sequence, MutableSequence, AbstractSet, MutableSet}
_MAPS = {dict, Mapping, MutableMapping}


def _identity(value: Any) -> Any:
    return value


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def maybe(value: Any) -> Any:
        return None if value is None else convert(value)

    return maybe


# ---------------------------------------------------------------------------------------
# Reading: Python values (as the codec decodes them) -> values Spark accepts


def _timestamp_to_spark(value: datetime) -> datetime:
    # Naive datetimes in records are taken as UTC, whatever the worker's time zone.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _decimal_to_spark(value: Decimal) -> Decimal:
    return value.quantize(_QUANTUM)


# ---------------------------------------------------------------------------------------
# Writing: values Spark hands a writer -> Python values the record holds


def _timestamp_from_spark(value: datetime) -> datetime:
    # Spark gives the writer naive datetimes in the worker's local time zone; make them
    # aware (UTC) so the record holds the instant, not a local wall-clock time.
    return value.astimezone(UTC)


def _bytes_from_spark(value: Any) -> bytes:
    return bytes(value)


def _float_from_spark(value: Any) -> float:
    return float(value)


@attrs.frozen
class _Field:
    name: str
    spark_type: DataType
    nullable: bool
    to_spark: Callable[[Any], Any]
    from_spark: Callable[[Any], Any]


def _describe(annotation: Any, where: str) -> _Field:
    """Spark type, nullability and both conversions of one annotation."""
    nullable = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) != 1:
            raise ConfigError("record", f"{where}: union {annotation!r} has no Spark type")
        inner = _describe(members[0], where)
        return _Field(
            inner.name,
            inner.spark_type,
            True,
            _optional(inner.to_spark),
            _optional(inner.from_spark),
        )
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _enum(annotation, where)
    if annotation in _SCALARS:
        spark_type = _SCALARS[annotation]
        to_spark: Callable[[Any], Any] = _identity
        from_spark: Callable[[Any], Any] = _identity
        if annotation is datetime:
            to_spark, from_spark = _timestamp_to_spark, _timestamp_from_spark
        elif annotation is Decimal:
            to_spark = _decimal_to_spark
        elif annotation is UUID:
            to_spark, from_spark = str, UUID
        elif annotation is bytes:
            from_spark = _bytes_from_spark
        elif annotation is float:
            from_spark = _float_from_spark
        return _Field("", spark_type, nullable, to_spark, from_spark)
    if isinstance(annotation, type) and attrs.has(annotation):
        nested = record_schema(annotation, where=where)
        return _Field("", nested.struct, nullable, nested.to_row, nested.from_row)
    base = origin or annotation
    args = typing.get_args(annotation)
    if base is tuple and args and args[-1] is not Ellipsis:
        return _fixed_tuple(args, where)
    if base in _ARRAYS:
        item = _describe(args[0] if args else Any, f"{where}[]")
        build: Callable[[Any], Any] = (
            tuple if base is tuple else frozenset if base in (frozenset, AbstractSet) else list
        )
        if base in (set, MutableSet):
            build = set
        item_to, item_from = item.to_spark, item.from_spark

        def array_to_spark(value: Any) -> list[Any]:
            return [item_to(v) for v in value]

        def array_from_spark(value: Any) -> Any:
            return build(item_from(v) for v in value)

        return _Field(
            "", ArrayType(item.spark_type, item.nullable), False, array_to_spark, array_from_spark
        )
    if base in _MAPS:
        key = _describe(args[0] if args else str, f"{where} key")
        value = _describe(args[1] if len(args) == 2 else Any, f"{where} value")
        key_to, key_from = key.to_spark, key.from_spark
        value_to, value_from = value.to_spark, value.from_spark

        def map_to_spark(mapping: Any) -> dict[Any, Any]:
            return {key_to(k): value_to(v) for k, v in mapping.items()}

        def map_from_spark(mapping: Any) -> dict[Any, Any]:
            return {key_from(k): value_from(v) for k, v in mapping.items()}

        return _Field(
            "",
            MapType(key.spark_type, value.spark_type, value.nullable),
            False,
            map_to_spark,
            map_from_spark,
        )
    raise ConfigError(
        "record",
        f"{where} has type {annotation!r}, which has no Spark column type; use scalars, "
        f"records, lists, tuples, sets, dicts, enums or X | None of them",
    )


def _enum(enum: type[Enum], where: str) -> _Field:
    value_types = {type(member.value) for member in enum}
    if len(value_types) != 1 or next(iter(value_types)) not in _SCALARS:
        raise ConfigError(
            "record", f"{where}: enum {enum.__qualname__} needs values of one scalar type"
        )
    value = _describe(next(iter(value_types)), where)
    value_to = value.to_spark

    def enum_to_spark(member: Enum) -> Any:
        return value_to(member.value)

    def enum_from_spark(raw: Any) -> Enum:
        return enum(raw)

    return _Field("", value.spark_type, False, enum_to_spark, enum_from_spark)


def _fixed_tuple(args: tuple[Any, ...], where: str) -> _Field:
    items = [_describe(arg, f"{where}[{i}]") for i, arg in enumerate(args)]
    struct = StructType(
        [StructField(f"_{i + 1}", item.spark_type, item.nullable) for i, item in enumerate(items)]
    )
    to_functions = [item.to_spark for item in items]
    from_functions = [item.from_spark for item in items]

    def tuple_to_spark(value: Any) -> tuple[Any, ...]:
        return tuple(f(v) for f, v in zip(to_functions, value, strict=True))

    def tuple_from_spark(row: Any) -> tuple[Any, ...]:
        return tuple(f(v) for f, v in zip(from_functions, row, strict=True))

    return _Field("", struct, False, tuple_to_spark, tuple_from_spark)


@attrs.frozen(kw_only=True)
class RecordSchema:
    """A record class's Spark struct and the conversions between records and rows.

    Attributes:
        record: the record class.
        struct: the Spark struct of its fields (``__init__`` fields, in order).
        names: the field names, in column order.
        required: the names of fields without a default.
        to_row: record -> tuple of Spark values, in column order.
        from_row: a Spark Row (or mapping) of the fields -> record.
    """

    record: type[Any]
    struct: StructType
    names: tuple[str, ...]
    required: frozenset[str]
    to_row: Callable[[Any], tuple[Any, ...]]
    from_row: Callable[[Any], Any]
    _aliases: tuple[str, ...]
    _from_functions: tuple[Callable[[Any], Any], ...]

    def builder(self, columns: Sequence[str]) -> Callable[[Sequence[Any]], Any]:
        """A function from a row of ``columns`` (a tuple or Row) to a record.

        Columns that are not fields are ignored; fields missing from ``columns`` take
        their defaults.

        Raises:
            ConfigError: a field without a default is missing from ``columns``.
        """
        missing = sorted(self.required - set(columns))
        if missing:
            raise ConfigError(
                "record",
                f"{self.record.__qualname__} needs the columns {', '.join(missing)}, "
                f"which the DataFrame lacks (its columns: {', '.join(columns)})",
            )
        slots = tuple(
            (columns.index(name), alias, convert)
            for name, alias, convert in zip(
                self.names, self._aliases, self._from_functions, strict=True
            )
            if name in columns
        )
        record = self.record

        def build(row: Sequence[Any]) -> Any:
            return record(**{alias: convert(row[index]) for index, alias, convert in slots})

        return build


def record_schema(record: type[Any], *, where: str | None = None) -> RecordSchema:
    """Derive the Spark schema of an attrs record class.

    Raises:
        ConfigError: a field's type has no Spark equivalent, or an annotation cannot
            be resolved.
    """
    where = where or record.__qualname__
    try:
        hints = typing.get_type_hints(record)
    except Exception as exc:
        raise ConfigError(
            "record", f"cannot resolve the field types of {record.__qualname__}: {exc}"
        ) from exc
    fields = [field for field in attrs.fields(record) if field.init]
    described = [
        (field, _describe(hints.get(field.name, field.type), f"{where}.{field.name}"))
        for field in fields
    ]
    struct = StructType(
        [StructField(field.name, info.spark_type, info.nullable) for field, info in described]
    )
    names = tuple(field.name for field in fields)
    aliases = tuple(field.alias or field.name for field in fields)
    to_functions = tuple(info.to_spark for _, info in described)
    from_functions = tuple(info.from_spark for _, info in described)
    getters = tuple(_getter(name) for name in names)
    required = frozenset(field.name for field in fields if field.default is attrs.NOTHING)

    def to_row(value: Any) -> tuple[Any, ...]:
        return tuple(f(get(value)) for f, get in zip(to_functions, getters, strict=True))

    def from_row(row: Any) -> Any:
        # A Row or a dict; fields missing from it are left to the record's defaults.
        data = row.asDict(recursive=False) if hasattr(row, "asDict") else row
        kwargs = {
            alias: convert(data[name])
            for name, alias, convert in zip(names, aliases, from_functions, strict=True)
            if name in data
        }
        return record(**kwargs)

    return RecordSchema(
        record=record,
        struct=struct,
        names=names,
        required=required,
        to_row=to_row,
        from_row=from_row,
        aliases=aliases,
        from_functions=from_functions,
    )


def _getter(name: str) -> Callable[[Any], Any]:
    def get(value: Any) -> Any:
        return getattr(value, name)

    return get


def raw_schema() -> StructType:
    """The schema of a read without a record class: the entry's fields as a map."""
    return StructType(
        [
            *_metadata_fields(),
            StructField("fields", MapType(StringType(), BinaryType(), False), False),
        ]
    )


def _metadata_fields() -> list[StructField]:
    return [
        StructField("partition", IntegerType(), False),
        StructField("entry_id", StringType(), False),
        StructField("event_time", TimestampType(), False),
    ]


def read_schema(schema: RecordSchema | None) -> StructType:
    """The full schema of a read: metadata columns, then the record's or raw fields."""
    if schema is None:
        return raw_schema()
    clash = set(METADATA_COLUMNS) & set(schema.names)
    if clash:
        raise ConfigError(
            "record",
            f"{schema.record.__qualname__} has fields named {', '.join(sorted(clash))}, "
            f"which clash with the columns {', '.join(METADATA_COLUMNS)} of a streamkit read",
        )
    return StructType([*_metadata_fields(), *schema.struct.fields])
