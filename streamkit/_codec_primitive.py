"""Primitive mode: one stream field per record field, each in a canonical text form.

The forms are part of the wire format (``docs/records.md``): integers in decimal,
floats as ``repr``, text in UTF-8, bytes as they are, booleans as ``true`` or
``false``, dates and times in ISO 8601, decimals and UUIDs as their text, an enum
member as its value's form.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any
from uuid import UUID

import attrs

from ._records import PrimitiveField, primitive_fields

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["PrimitiveSlot", "primitive_slots", "scalar_codec"]


def _encode_bool(value: bool) -> bytes:
    if value is True:
        return b"true"
    if value is False:
        return b"false"
    raise TypeError(f"expected a bool, got {type(value).__name__}")


def _decode_bool(raw: bytes) -> bool:
    if raw == b"true":
        return True
    if raw == b"false":
        return False
    raise ValueError("expected b'true' or b'false'")


def _encode_text(value: object) -> bytes:
    return str(value).encode("ascii")


_SCALAR_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    int: lambda value: b"%d" % value,
    float: lambda value: repr(float(value)).encode("ascii"),
    str: str.encode,  # UTF-8
    bool: _encode_bool,
    bytes: bytes,
    datetime: lambda value: value.isoformat().encode("ascii"),
    # A datetime is a date: a date field holds its date (as JSON's hook writes it).
    date: lambda value: date.isoformat(value).encode("ascii"),
    Decimal: _encode_text,
    UUID: _encode_text,
}

_SCALAR_DECODERS: dict[type, Callable[[bytes], Any]] = {
    int: int,
    float: float,
    str: lambda raw: raw.decode("utf-8"),
    bool: _decode_bool,
    bytes: bytes,
    datetime: lambda raw: datetime.fromisoformat(raw.decode("ascii")),
    date: lambda raw: date.fromisoformat(raw.decode("ascii")),
    Decimal: lambda raw: Decimal(raw.decode("ascii")),
    UUID: lambda raw: UUID(raw.decode("ascii")),
}


def scalar_codec(scalar: type) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """The encoder and decoder of one primitive field's ``scalar`` type."""
    if issubclass(scalar, Enum):
        # An enum member is stored as its value's canonical form; both directions are
        # a dict lookup, which also rejects values that are not members.
        by_member = {
            member: _SCALAR_ENCODERS[type(member.value)](member.value) for member in scalar
        }
        by_bytes = {raw: member for member, raw in by_member.items()}
        return by_member.__getitem__, by_bytes.__getitem__
    return _SCALAR_ENCODERS[scalar], _SCALAR_DECODERS[scalar]


@attrs.frozen
class PrimitiveSlot:
    """One record field in primitive mode: its stream field name and its codec."""

    field: PrimitiveField
    key: bytes
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


def primitive_slots(record: type[Any]) -> list[PrimitiveSlot]:
    """The slots of a primitive ``record`` type's fields, in order."""
    slots = []
    for field in primitive_fields(record):
        encode, decode = scalar_codec(field.scalar)
        slots.append(PrimitiveSlot(field, field.name.encode("utf-8"), encode, decode))
    return slots
