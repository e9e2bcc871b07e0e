"""The code the codec generates for records of plain fields: its fast paths, exactly its slow ones.

A record whose fields are all ``str``, ``int``, ``float`` or ``bool`` (a *flat* record)
is decoded and encoded on every event, so :class:`~streamkit._codec.Codec` builds
Python functions for its type, once, from source written here: a builder of one
record from a JSON object, a decoder of a whole batch of payloads, and an encoder of
one entry as a producer lays it out. Each does exactly what the converter and the
codec's general functions do, and hands anything unusual (a missing field, a value of
another type, a float that is not finite, a payload too large) to them, so that the
result, or the error, is always theirs; ``tests/test_codec_flat.py`` checks that on
random input.
"""

from __future__ import annotations

import enum
import math
import types as types_module
import typing
from typing import TYPE_CHECKING, Any, cast

import attrs
import orjson

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "entry_encoder",
    "exact_checker",
    "flat_builder",
    "flat_fields",
    "payload_decoder",
    "payloads_encoder",
]

# The JSON types a flat record's fields may have, and the check each needs: exactly the
# checks of the converter's _structure_* hooks (bools are not ints; ints are floats).
_FLAT_CHECKS = {
    str: "type({v}) is str",
    int: "type({v}) is int",
    float: "(type({v}) is float or type({v}) is int)",
    bool: "type({v}) is bool",
}


# The Python values a flat record's field may hold to be encoded by the generated code:
# exactly the values whose JSON the checks above accept (streamkit._codec_check's
# EXACT_TYPES, a float only when finite). ``{x}`` is the field's first use (where it
# may be read into ``{v}``), ``{v}`` the others.
_ENCODE_CHECKS = {
    str: "type({x}) is str",
    int: "type({x}) is int",
    float: "((type({x}) is float and isfinite({v})) or type({v}) is int)",
    bool: "type({x}) is bool",
}


def flat_fields(record: type[Any]) -> tuple[attrs.Attribute[Any], ...] | None:
    """The fields of a record of plain ``str``/``int``/``float``/``bool`` fields (all
    set by its ``__init__``), or ``None`` for any other record."""
    if not attrs.has(record):
        return None
    try:
        fields = attrs.fields(attrs.resolve_types(record))
    except Exception:
        return None
    if not fields or any(
        f.type not in _FLAT_CHECKS
        or not f.init
        or not f.alias.isidentifier()
        or not f.name.isidentifier()
        for f in fields
    ):
        return None
    return tuple(fields)


def _parts(record: type[Any]) -> tuple[list[str], str, str] | None:
    """For a flat record, the source of building it from a dict ``obj``: the lines
    reading each field into ``v0``, ``v1``, ... (raising ``KeyError`` for a missing
    one), the condition that they have exactly the types the converter's hooks accept,
    and the constructor's arguments. ``None`` for any other record."""
    fields = flat_fields(record)
    if fields is None:
        return None
    names = [f"v{i}" for i in range(len(fields))]
    loads = [f"{v} = obj[{f.name!r}]" for v, f in zip(names, fields, strict=True)]
    checks = " and ".join(
        _FLAT_CHECKS[cast("type", f.type)].format(v=v) for v, f in zip(names, fields, strict=True)
    )
    args = ", ".join(
        f"{f.alias}=float({v})" if f.type is float else f"{f.alias}={v}"
        for v, f in zip(names, fields, strict=True)
    )
    return loads, checks, args


def _compiled(source: str, name: str, function: str, namespace: dict[str, Any]) -> Any:
    exec(compile(source, f"<streamkit {name}>", "exec"), namespace)
    return namespace[function]


def flat_builder(
    record: type[Any], structure: Callable[[Any, type], Any]
) -> Callable[[dict[str, Any]], Any] | None:
    """A fast structure function for a flat record, or ``None`` for any other record.

    It builds the record directly when every field is present with exactly the type
    the converter's hooks accept, and hands anything else (a missing field, a wrong
    type) to the converter, which applies defaults or raises its detailed error: the
    result is always what the converter would give, at a fraction of its cost.
    """
    parts = _parts(record)
    if parts is None:
        return None
    loads, checks, args = parts
    lines = "\n".join("        " + line for line in loads)
    source = (
        "def build(obj):\n"
        "    try:\n"
        f"{lines}\n"
        "    except KeyError:\n"
        "        return structure(obj, record)\n"
        f"    if {checks}:\n"
        f"        return record({args})\n"
        "    return structure(obj, record)\n"
    )
    namespace = {"structure": structure, "record": record}
    build: Callable[[dict[str, Any]], Any] = _compiled(
        source, f"flat builder {record.__qualname__}", "build", namespace
    )
    return build


def payload_decoder(
    record: type[Any], structure: Callable[[Any, type], Any], missing: Any, max_decoded: int
) -> Callable[[list[bytes]], tuple[list[Any], int]] | None:
    """A decoder of a batch of JSON payloads of a flat record, or ``None`` for any other
    record: ``decode_payloads(payloads)`` gives ``(records, missed)``, ``missing`` in
    place of an entry it does not decode (too large, not JSON, not an object, or
    refused by the converter), the way :func:`flat_builder`'s function builds each."""
    parts = _parts(record)
    if parts is None:
        return None
    loads_source, checks, arguments = parts
    lines = "\n".join(" " * 24 + line for line in loads_source)
    # Exactly flat_builder's build(), inlined: a missing field or another type goes
    # to the converter (defaults, or its error: the entry is missed).
    source = (
        "def decode_payloads(payloads):\n"
        "    out = []\n"
        "    append = out.append\n"
        "    missed = 0\n"
        "    for payload in payloads:\n"
        "        if len(payload) <= max_decoded:\n"
        "            try:\n"
        "                obj = loads(payload)\n"
        "                if type(obj) is dict:\n"
        "                    try:\n"
        f"{lines}\n"
        "                    except KeyError:\n"
        "                        append(structure(obj, record))\n"
        "                        continue\n"
        f"                    if {checks}:\n"
        f"                        append(record({arguments}))\n"
        "                    else:\n"
        "                        append(structure(obj, record))\n"
        "                    continue\n"
        "            except Exception:\n"
        "                pass\n"
        "        append(missing)\n"
        "        missed += 1\n"
        "    return out, missed\n"
    )
    namespace = {
        "loads": orjson.loads,
        "record": record,
        "structure": structure,
        "missing": missing,
        "max_decoded": max_decoded,
    }
    decode: Callable[[list[bytes]], tuple[list[Any], int]] = _compiled(
        source, f"payload decoder {record.__qualname__}", "decode_payloads", namespace
    )
    return decode


def payloads_encoder(record: type[Any]) -> Callable[[Sequence[Any]], list[bytes | None]] | None:
    """An encoder of many flat records at once, each to the JSON payload
    :func:`entry_encoder` would write, or ``None`` for any other record.

    One list comprehension, no call per record: a producer encoding thousands of
    records saves a call and a tuple on each. A record it does not encode as the
    entry encoder's fast path would (of another type, or with a field of another
    type than its annotation, a float that is not finite) is ``None`` in the result,
    and so is every record of a batch where encoding raised: the caller hands those
    to the entry encoder, which checks them and gives its result or raises its
    error. Payload size limits are the caller's.
    """
    fields = flat_fields(record)
    if fields is None:
        return None
    names = {f.name: f"x{i}" for i, f in enumerate(fields)}
    # Every field is read once, by an assignment expression in the check, and that
    # name is what the payload holds: a property-like value is read exactly once, as
    # the entry encoder reads it.
    checks = " and ".join(
        _ENCODE_CHECKS[cast("type", f.type)].format(
            x=f"{names[f.name]} := value.{f.name}", v=names[f.name]
        )
        for f in fields
    )
    items = ", ".join(f"{f.name!r}: {names[f.name]}" for f in fields)
    source = (
        "def encode_payloads(values):\n"
        "    try:\n"
        f"        return [dumps({{{items}}}) if type(value) is record and {checks} else None"
        " for value in values]\n"
        "    except Exception:\n"
        "        return [None] * len(values)\n"
    )
    namespace = {"record": record, "dumps": orjson.dumps, "isfinite": math.isfinite}
    encode: Callable[[Sequence[Any]], list[bytes | None]] = _compiled(
        source, f"payloads encoder {record.__qualname__}", "encode_payloads", namespace
    )
    return encode


def entry_encoder(
    record: type[Any],
    data_field: bytes,
    limit: int,
    slow: Callable[[Any], tuple[Sequence[bytes | int], int]],
) -> Callable[[Any], tuple[Sequence[bytes | int], int]] | None:
    """An encoder of a flat record as one uncompressed JSON entry, ``(entry, size)``,
    or ``None`` for any other record.

    It writes what the converter's unstructuring writes (the fields by name; a float
    field's float only if finite, an int as is) for a record whose every field holds
    exactly its annotated type, and leaves anything else (a field of another type,
    which may be invalid), and any payload over ``limit`` bytes, to ``slow``, the
    codec's general encoder, which checks it and gives its result or raises its error.
    """
    fields = flat_fields(record)
    if fields is None:
        return None
    names = [f"v{i}" for i in range(len(fields))]
    reads = "; ".join(f"{v} = value.{f.name}" for v, f in zip(names, fields, strict=True))
    checks = " and ".join(
        _ENCODE_CHECKS[cast("type", f.type)].format(x=v, v=v)
        for v, f in zip(names, fields, strict=True)
    )
    items = ", ".join(f"{f.name!r}: {v}" for v, f in zip(names, fields, strict=True))
    source = (
        "def encode_entry(value):\n"
        "    if type(value) is record:\n"
        f"        {reads}\n"
        f"        if {checks}:\n"
        "            try:\n"
        f"                payload = dumps({{{items}}})\n"
        "            except Exception:\n"
        "                return slow(value)\n"
        "            if len(payload) <= limit:\n"
        "                return (1, data_field, payload), data_size + len(payload)\n"
        "    return slow(value)\n"
    )
    namespace = {
        "record": record,
        "dumps": orjson.dumps,
        "isfinite": math.isfinite,
        "slow": slow,
        "limit": limit,
        "data_field": data_field,
        "data_size": len(data_field),
    }
    encode: Callable[[Any], tuple[Sequence[bytes | int], int]] = _compiled(
        source, f"entry encoder {record.__qualname__}", "encode_entry", namespace
    )
    return encode


def exact_checker(
    record: type[Any], exact: dict[Any, tuple[type, ...]]
) -> Callable[[Any], bool] | None:
    """A function telling whether every field of a ``record`` holds exactly a type of
    ``exact`` for its annotation (:data:`streamkit._codec_check.EXACT_TYPES`), or
    ``None`` for a record with a field of any other annotation (nested records,
    collections, unions other than ``X | None``).

    Such a record is valid without the round trip through the converter (the codec's
    check): ``valid(value)`` is one generated expression. Values JSON cannot hold
    although of the right type (an int past 64 bits, a NaN) are refused by the
    encoding itself, before.
    """
    if not attrs.has(record):
        return None
    try:
        fields = [f for f in attrs.fields(attrs.resolve_types(record)) if f.init]
    except Exception:
        return None
    if not fields or any(not f.name.isidentifier() for f in fields):
        return None
    checks = []
    types: dict[str, Any] = {}
    for field in fields:
        annotation, optional = field.type, False
        members = typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types_module.UnionType):
            inner = [m for m in members if m is not type(None)]
            if len(inner) != 1 or len(inner) == len(members):
                return None
            annotation, optional = inner[0], True
        allowed = exact.get(annotation)
        if allowed is None:
            if not (isinstance(annotation, type) and issubclass(annotation, enum.Enum)):
                return None
            allowed = (annotation,)
        names = []
        for kind in allowed:
            names.append(f"t{len(types)}")
            types[names[-1]] = kind
        # The field is read once, its type kept in ``t`` for the other comparisons.
        check = " or ".join(
            [f"(t := type(value.{field.name})) is {names[0]}", *(f"t is {n}" for n in names[1:])]
        )
        check = f"({check})"
        if optional:
            check = f"(value.{field.name} is None or {check})"
        checks.append(check)
    source = "def valid(value):\n    return " + " and ".join(checks) + "\n"
    valid: Callable[[Any], bool] = _compiled(
        source, f"exact checker {record.__qualname__}", "valid", dict(types)
    )
    return valid
