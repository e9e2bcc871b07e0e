"""The :class:`Record` base: event types are attrs classes declared without a decorator.

A record is stored in one of two modes (see ``docs/records.md`` for the wire format):

* JSON mode (the default): the whole record, nested records and collections included,
  becomes one JSON document.
* Primitive mode (``class Reading(Record, primitive=True)``): each field is a scalar
  stored as its own stream field, readable from ``redis-cli`` and any language.
"""

from __future__ import annotations

import types
import typing
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import Any, ClassVar, dataclass_transform
from uuid import UUID

import attrs

__all__ = ["PRIMITIVE_SCALAR_TYPES", "PrimitiveField", "Record", "is_primitive", "primitive_fields"]

#: The field types a primitive record may hold, besides :class:`~enum.Enum` subclasses
#: (whose values must be of one of these types) and ``X | None`` of any of them.
PRIMITIVE_SCALAR_TYPES: frozenset[type] = frozenset(
    {int, float, str, bool, bytes, datetime, date, Decimal, UUID}
)


# ``attrs.define`` on the base is what makes type checkers accept ``attrs.evolve`` and
# ``attrs.fields`` on subclasses; ``dataclass_transform`` gives subclasses their typed
# keyword-only ``__init__`` although they carry no decorator.
@dataclass_transform(kw_only_default=True, field_specifiers=(attrs.field, attrs.Factory))
@attrs.define(slots=False)
class Record:
    """Base class of event types; every subclass becomes an attrs class.

    Subclasses are turned into attrs classes in place with
    ``attrs.define(slots=False, kw_only=True)``: declare fields as annotations (or
    ``attrs.field(...)``), without a decorator. Equality, ``repr``, ``attrs.evolve``,
    ``attrs.fields`` and validators all work as for any attrs class. Subclassing a
    record inherits its fields and its storage mode.

    Example::

        class Order(Record):
            order_id: int
            amount: float
            created_at: datetime

        class Reading(Record, primitive=True):
            sensor: str
            value: float

    Args:
        primitive: store each field as its own stream field instead of one JSON
            document. Only scalar fields are allowed (see
            :data:`PRIMITIVE_SCALAR_TYPES`). Defaults to the parent record's mode.

    Error handling:
        A primitive record with a non-scalar field raises :class:`TypeError` naming the
        field when the class is defined.
    """

    #: Whether the record is stored in primitive mode; set on every subclass.
    __streamkit_primitive__: ClassVar[bool] = False

    def __init_subclass__(cls, *, primitive: bool | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # slots=False keeps this very class object, so ``class Order(Record)`` binds the
        # attrs class and ``__init_subclass__`` needs no return value.
        attrs.define(cls, slots=False, kw_only=True)
        if primitive is not None:
            cls.__streamkit_primitive__ = primitive
        if cls.__streamkit_primitive__:
            primitive_fields(cls)


def is_primitive(record: type) -> bool:
    """Tell whether a record class is stored in primitive mode.

    Args:
        record: any class; only :class:`Record` subclasses can be primitive.
    """
    return (
        isinstance(record, type) and issubclass(record, Record) and record.__streamkit_primitive__
    )


@attrs.frozen
class PrimitiveField:
    """One field of a primitive record, as the codec needs it.

    Attributes:
        name: the attribute name, which is also the stream field name.
        alias: the field's ``__init__`` argument name.
        scalar: the field's type with any ``| None`` removed.
        optional: whether the field accepts ``None`` (stored by omitting the field).
        required: whether the field has no default, so an entry must carry it.
    """

    name: str
    alias: str
    scalar: type
    optional: bool
    required: bool


def primitive_fields(record: type[Record]) -> list[PrimitiveField]:
    """Describe the fields of a primitive record, checking that each is a scalar.

    Raises:
        TypeError: a field is not a scalar (or ``X | None`` of one), or its annotation
            cannot be resolved.
    """
    try:
        # String annotations (``from __future__ import annotations``) must be real
        # types before they can be checked; attrs caches the result on the class.
        attrs.resolve_types(record)
    except NameError as exc:
        raise TypeError(
            f"cannot resolve the field types of primitive record {record.__qualname__}: "
            f"{exc}; define the types it uses at module level"
        ) from exc
    # Fields left out of ``__init__`` are derived from the others and not stored.
    return [_primitive_field(record, field) for field in attrs.fields(record) if field.init]


def _primitive_field(record: type, field: attrs.Attribute[Any]) -> PrimitiveField:
    annotation: Any = field.type
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        optional = len(members) < len(typing.get_args(annotation))
        if len(members) == 1:
            annotation = members[0]
    if annotation in PRIMITIVE_SCALAR_TYPES or _is_scalar_enum(annotation):
        return PrimitiveField(
            name=field.name,
            alias=field.alias or field.name,
            scalar=annotation,
            optional=optional,
            required=field.default is attrs.NOTHING,
        )
    raise TypeError(
        f"field {field.name!r} of primitive record {record.__qualname__} has type "
        f"{_type_name(field.type)}; primitive records hold only int, float, str, bool, bytes, "
        f"datetime, date, Decimal, UUID, Enum subclasses with such values, or X | None "
        f"of one of them. Drop primitive=True to store nested or collection fields as JSON."
    )


def _is_scalar_enum(annotation: object) -> bool:
    return (
        isinstance(annotation, type)
        and issubclass(annotation, Enum)
        and all(type(member.value) in PRIMITIVE_SCALAR_TYPES for member in annotation)
    )


def _type_name(annotation: object) -> str:
    # ``list[int]`` reads better than its repr; plain classes better than ``<class ...>``.
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return repr(annotation)
