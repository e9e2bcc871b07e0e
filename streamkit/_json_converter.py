"""The cattrs converter behind JSON records: strict, and with a wire format of our own.

One converter with explicit hooks, so the JSON a record becomes is specified here
(and in ``docs/records.md``), not by whatever a cattrs "preconf" converter does in its
next release. Structuring is strict where cattrs is lenient: a JSON ``true`` is not an
int, a string is not a list of characters, ``"05"`` is not the dict key ``5``.
Failures carry cattrs' own notes, so ``cattrs.transform_error`` names the path
(``$.lines[0].sku``) of every bad value.
"""

from __future__ import annotations

import base64
import math
import typing
from collections.abc import (
    Callable,
    Iterable,
    Mapping,
    MutableSequence,
    MutableSet,
    Sequence,
    Set as AbstractSet,
)
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

import cattrs
from cattrs.cols import is_mapping
from cattrs.errors import IterableValidationError, IterableValidationNote

__all__ = ["converter", "make_converter"]


def _structure_str(value: Any, cls: type) -> Any:
    if type(value) is not str:
        raise TypeError(f"expected a string, got {type(value).__name__}")
    # ``cls`` is a str subclass such as a StrEnum when this hook was reached through it.
    return value if cls is str else cls(value)


def _structure_int(value: Any, cls: type) -> Any:
    # JSON booleans load as Python bools, which are ints; they are not integers here.
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value if cls is int else cls(value)


def _structure_float(value: Any, cls: type) -> Any:
    if type(value) is not float and type(value) is not int:
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value) if cls is float else cls(value)


def _structure_bool(value: Any, _: type) -> bool:
    if type(value) is not bool:
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value


def _from_text(parse: Callable[[str], Any]) -> Callable[[Any, type], Any]:
    def structure(value: Any, _: type) -> Any:
        if type(value) is not str:
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return parse(value)

    return structure


def _unstructure_float(value: float) -> float:
    # orjson writes NaN and infinities as null, which would come back as a type error
    # on the consumer; refuse them where the mistake is made.
    if not math.isfinite(value):
        raise ValueError(f"JSON cannot represent the float {value!r}")
    return value


def _b64encode(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def _mapping_args(mapping_type: Any) -> tuple[Any, Any]:
    args = typing.get_args(mapping_type)
    return (args[0], args[1]) if len(args) == 2 else (Any, Any)


def _parse_int_key(text: Any) -> int:
    if type(text) is not str:
        raise TypeError(f"expected a string key, got {type(text).__name__}")
    value = int(text)
    # Only the form the encoder writes, so "05" and "+5" are not the same key as "5".
    if str(value) != text:
        raise ValueError(f"{text!r} is not a canonical integer key")
    return value


def _key_text_function(key_type: Any, converter: cattrs.Converter) -> Callable[[Any], str]:
    unstructure_key = converter.get_unstructure_hook(key_type)

    def key_text(key: Any) -> str:
        text = unstructure_key(key)
        if type(text) is str:
            return text
        if type(text) is int:
            return str(text)
        raise TypeError(f"dict key {key!r} cannot be a JSON object key")

    return key_text


def _unstructure_mapping_factory(
    mapping_type: Any, converter: cattrs.Converter
) -> Callable[[Mapping[Any, Any]], dict[str, Any]]:
    key_type, value_type = _mapping_args(mapping_type)
    key_text = _key_text_function(key_type, converter)
    unstructure_value = converter.get_unstructure_hook(value_type)

    def unstructure(mapping: Mapping[Any, Any]) -> dict[str, Any]:
        return {key_text(key): unstructure_value(value) for key, value in mapping.items()}

    return unstructure


def _structure_mapping_factory(
    mapping_type: Any, converter: cattrs.Converter
) -> Callable[[Any, Any], Mapping[Any, Any]]:
    key_type, value_type = _mapping_args(mapping_type)
    origin = typing.get_origin(mapping_type) or mapping_type
    build: Callable[[dict[Any, Any]], Mapping[Any, Any]] = (
        origin if isinstance(origin, type) and issubclass(origin, dict) else dict
    )
    structure_value = converter.get_structure_hook(value_type)
    structure_key_text: Callable[[Any, Any], Any]
    if key_type is Any:
        structure_key_text = _structure_str
        key_type = str
    elif key_type is int:

        def structure_key_text(text: Any, _: Any) -> Any:
            return _parse_int_key(text)

    elif isinstance(key_type, type) and issubclass(key_type, Enum):
        # Whatever the values' types, a member's key is the text the encoder writes.
        key_text = _key_text_function(key_type, converter)
        members = {key_text(member): member for member in key_type}

        def structure_key_text(text: Any, _: Any) -> Any:
            if text not in members:
                raise ValueError(f"{text!r} is not a {key_type.__qualname__} key")
            return members[text]

    else:
        structure_key_text = converter.get_structure_hook(key_type)

    def structure(obj: Any, _: Any) -> Mapping[Any, Any]:
        if type(obj) is not dict:
            raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
        keys = _structure_each(
            ((key, key, structure_key_text, key_type) for key in obj), mapping_type
        )
        values = _structure_each(
            ((key, value, structure_value, value_type) for key, value in obj.items()),
            mapping_type,
        )
        return build(dict(zip(keys, values, strict=True)))

    return structure


# The collection types a JSON array is structured into, and what each is built as.
_ARRAY_BUILDERS: dict[Any, Callable[[list[Any]], Any]] = {
    list: list,
    Sequence: list,
    MutableSequence: list,
    tuple: tuple,
    set: set,
    MutableSet: set,
    frozenset: frozenset,
    AbstractSet: frozenset,
}


def _is_array_type(annotation: Any) -> bool:
    return (typing.get_origin(annotation) or annotation) in _ARRAY_BUILDERS


def _structure_array_factory(
    array_type: Any, converter: cattrs.Converter
) -> Callable[[Any, Any], Any]:
    # cattrs builds collections from any iterable, so a string would become a list of
    # characters; only a JSON array is accepted here.
    origin = typing.get_origin(array_type) or array_type
    build = _ARRAY_BUILDERS[origin]
    args = typing.get_args(array_type)
    if origin is tuple and args and args[-1] is not Ellipsis:
        positions = [(converter.get_structure_hook(arg), arg) for arg in args]

        def structure_tuple(obj: Any, _: Any) -> Any:
            if type(obj) is not list:
                raise TypeError(f"expected a JSON array, got {type(obj).__name__}")
            if len(obj) != len(positions):
                raise ValueError(f"expected {len(positions)} items, got {len(obj)}")
            items = zip(obj, positions, strict=True)
            return tuple(
                _structure_each(
                    (
                        (index, value, hook, item_type)
                        for index, (value, (hook, item_type)) in enumerate(items)
                    ),
                    array_type,
                )
            )

        return structure_tuple

    item_type = args[0] if args else Any
    structure_item = converter.get_structure_hook(item_type)

    def structure(obj: Any, _: Any) -> Any:
        if type(obj) is not list:
            raise TypeError(f"expected a JSON array, got {type(obj).__name__}")
        return build(
            _structure_each(
                ((index, value, structure_item, item_type) for index, value in enumerate(obj)),
                array_type,
            )
        )

    return structure


def _structure_each(
    items: Iterable[tuple[int | str, Any, Callable[[Any, Any], Any], Any]], container: Any
) -> list[Any]:
    """Structure the items of a collection, reporting every failure with its position.

    The notes and error type are cattrs' own, so ``cattrs.transform_error`` shows paths
    such as ``$.lines[0].sku`` just as for cattrs' built-in collection hooks.
    """
    results = []
    errors: list[Exception] = []
    for index, value, structure, item_type in items:
        try:
            results.append(structure(value, item_type))
        except Exception as exc:
            exc.add_note(
                IterableValidationNote(
                    f"Structuring {container!r} @ index {index!r}", index, item_type
                )
            )
            errors.append(exc)
    if errors:
        raise IterableValidationError(f"While structuring {container!r}", errors, container)
    return results


def make_converter() -> cattrs.Converter:
    """Build a converter with streamkit's JSON hooks (the module's :data:`converter`)."""
    converter = cattrs.Converter(unstruct_collection_overrides={AbstractSet: list})
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_unstructure_hook(float, _unstructure_float)
    converter.register_unstructure_hook(bytes, _b64encode)
    converter.register_structure_hook(bytes, _from_text(_b64decode))
    # datetime before date: a datetime is a date, and dispatch takes the closest match.
    converter.register_unstructure_hook(date, date.isoformat)
    converter.register_structure_hook(date, _from_text(date.fromisoformat))
    converter.register_unstructure_hook(datetime, datetime.isoformat)
    converter.register_structure_hook(datetime, _from_text(datetime.fromisoformat))
    converter.register_unstructure_hook(Decimal, str)
    converter.register_structure_hook(Decimal, _from_text(Decimal))
    converter.register_unstructure_hook(UUID, str)
    converter.register_structure_hook(UUID, _from_text(UUID))
    converter.register_unstructure_hook_factory(is_mapping, _unstructure_mapping_factory)
    converter.register_structure_hook_factory(is_mapping, _structure_mapping_factory)
    converter.register_structure_hook_factory(_is_array_type, _structure_array_factory)
    return converter


#: The converter every JSON codec uses.
converter = make_converter()
