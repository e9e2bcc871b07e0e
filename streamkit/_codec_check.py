"""What a valid record is: the one rule every producer, the command line and the decoder share.

A record is valid when the JSON converter (:mod:`streamkit._json_converter`, the
worker's decoder) structures its JSON form back into its type: an ``int`` field holds
an int (not a bool, not ``"42"``), a ``float`` field a finite float or an int, a
``datetime`` field a datetime, a nested record's fields the same, recursively. The
producers (the Trio :class:`~streamkit.Stream`, the blocking and asyncio clients, the
Spark writer) check it before sending, ``streamkit send`` before sending a line, the
worker when decoding; a job's arguments are checked against its function's
annotations by the same rule (:func:`check_value`).

Values of the exact types in :data:`EXACT_TYPES` pass without a round trip: they are
the common case, and the converter always structures their JSON form back. Anything
else takes the round trip, and a failure is described here, once, as one line per
problem naming the field, the type expected and the type given.
"""

from __future__ import annotations

import ast
import math
import re
import typing
from collections.abc import Mapping, MutableMapping
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any
from uuid import UUID

import attrs
import cattrs
import orjson
from cattrs.errors import ClassValidationError, IterableValidationError

from ._json_converter import converter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "EXACT_TYPES",
    "check_value",
    "describe_invalid",
    "mapping_key_type",
    "mapping_problems",
    "record_problems",
    "type_name",
]

#: Per annotation, the exact value types that always pass it (a float only when finite:
#: see :func:`passes_exactly`).
EXACT_TYPES: dict[Any, tuple[type, ...]] = {
    str: (str,),
    int: (int,),
    float: (float, int),
    bool: (bool,),
    bytes: (bytes,),
    datetime: (datetime,),
    date: (date,),
    Decimal: (Decimal,),
    UUID: (UUID,),
}

# The integers JSON holds here: orjson writes 64-bit ones, signed or not.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1

#: Characters of a value shown in a message, at most.
_SHOWN = 40
#: Problems named in a message, at most.
_MAX_PROBLEMS = 5


def type_name(annotation: object) -> str:
    """``int``, ``Order``, ``list[int]``, ``float | None``: an annotation as written."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def passes_exactly(annotation: object, value: object) -> bool:
    """Whether ``value`` passes ``annotation`` without a round trip (an exact type)."""
    exact = EXACT_TYPES.get(annotation)
    if exact is None:
        return isinstance(annotation, type) and type(value) is annotation and _is_enum(annotation)
    kind = type(value)
    if kind not in exact:
        return False
    if kind is int:
        return _INT_MIN <= value <= _INT_MAX  # type: ignore[operator]
    return kind is not float or math.isfinite(value)  # type: ignore[arg-type]


def _is_enum(annotation: type) -> bool:
    return issubclass(annotation, Enum)


def check_value(
    annotation: object, value: object, encode: Callable[[Any], bytes] | None = None
) -> None:
    """Check ``value`` against ``annotation`` by the rule: its JSON form structures back.

    Args:
        annotation: the type declared.
        value: the value given.
        encode: how the value becomes JSON, if not as a record's field does (the
            converter's unstructuring for ``annotation``, then orjson): a job's
            arguments are written by :func:`streamkit.jobs._model.dumps`.

    Raises:
        Exception: whatever the converter or the JSON encoder raised (a cattrs
            validation error, ``TypeError``, ``ValueError``, ...); see
            :func:`value_problems` to describe it.
    """
    if passes_exactly(annotation, value):
        return
    if encode is None:
        unstructured = converter.unstructure(value, annotation)
        try:
            text = orjson.dumps(unstructured)
        except TypeError as exc:  # orjson's JSONEncodeError: an int past 64 bits, ...
            raise Unrepresentable(str(exc)) from None
    else:
        text = encode(value)
    converter.structure(orjson.loads(text), annotation)  # type: ignore[arg-type]


class Unrepresentable(ValueError):
    """A value of the right type that JSON cannot hold (an int past 64 bits)."""


def _short(value: object) -> str:
    try:
        shown = repr(value)
    except Exception:
        shown = f"<{type(value).__name__}>"
    return shown if len(shown) <= _SHOWN else shown[: _SHOWN - 3] + "..."


def _given(value: object) -> str:
    return f"got {type(value).__qualname__} {_short(value)}"


# A step of a cattrs path: ``.name``, ``[0]``, ``['key']``.
_STEP = re.compile(r"\.(\w+)|\[((?:'(?:[^'\\]|\\.)*')|(?:\"(?:[^\"\\]|\\.)*\")|-?\d+)\]")

_MISSING = object()


def _resolve(root: object, path: str) -> object:
    """The value at a cattrs ``path`` (after its root) in ``root``, or ``_MISSING``."""
    value = root
    position = 0
    while position < len(path):
        step = _STEP.match(path, position)
        if step is None:
            return _MISSING
        position = step.end()
        try:
            if step[1] is not None:
                if isinstance(value, dict):
                    value = value[step[1]]
                else:
                    value = getattr(value, step[1])
            else:
                key = ast.literal_eval(step[2])
                value = value[key]  # type: ignore[index]
        except Exception:
            return _MISSING
    return value


#: A leaf failure: (its path, the leaf error, the type expected there, and the value
#: given where the path alone does not lead to it, else ``_MISSING``).
_Leaf = tuple[str, BaseException, object, object]

_MAPPINGS = frozenset({dict, typing.Dict, Mapping, MutableMapping})  # noqa: UP006


def mapping_key_type(annotation: object) -> object | None:
    """The key type of a mapping annotation (``int`` of ``dict[int, str]``), or
    ``None`` for any other annotation."""
    if typing.get_origin(annotation) in _MAPPINGS:
        arguments: tuple[object, ...] = typing.get_args(annotation)
        if len(arguments) == 2:
            return arguments[0]
    return None


def _typed_key(key: object, key_type: object) -> object:
    """``key`` (a mapping's key, as JSON has it: a str) as the converter makes it a
    ``key_type`` key (``1`` of ``"1"`` for an int), or ``_MISSING`` if it refuses it."""
    try:
        typed = converter.structure({key: None}, dict[key_type, Any])  # type: ignore[valid-type]
    except Exception:
        return _MISSING
    return next(iter(typed), _MISSING)


def _leaves(exc: BaseException, path: str, expected: object) -> Iterator[_Leaf]:
    """Every failure under ``exc``: (path, the leaf error, the type expected there,
    the value given where the path does not lead to it: a mapping's key)."""
    if isinstance(exc, IterableValidationError):
        with_notes, without = exc.group_exceptions()
        # A mapping's notes name the entry, not whether its key or its value failed.
        key_type = mapping_key_type(expected)
        for inner, note in with_notes:
            index: object = note.index
            if key_type is not None:
                typed = _typed_key(index, key_type)
                if typed is _MISSING:
                    yield f"{path} key {_short(index)}", inner, key_type, index
                    continue
                index = typed  # the value's: the given mapping's keys are typed
            yield from _leaves(inner, f"{path}[{index!r}]", note.type)
        for inner in without:
            yield path, inner, None, _MISSING
    elif isinstance(exc, ClassValidationError):
        fields, others = exc.group_exceptions()
        for inner, attribute in fields:
            yield from _leaves(inner, f"{path}.{attribute.name}", attribute.type)
        for inner in others:
            yield path, inner, None, _MISSING
    else:
        yield path, exc, expected, _MISSING


def _leaf_problem(where: str, exc: BaseException, expected: object, given: object) -> str:
    if isinstance(exc, KeyError):
        return f"{where}: missing (a required field)"
    if isinstance(exc, Unrepresentable) or (
        isinstance(exc, ValueError) and str(exc).startswith("JSON cannot")
    ):
        # The right type, but a value JSON cannot hold (an int past 64 bits, a NaN).
        return f"{where}: {_text(exc)}"
    if expected is None or given is _MISSING:
        return f"{where}: {_text(exc)}"
    problem = f"{where}: expected {type_name(expected)}, {_given(given)}"
    if isinstance(exc, TypeError):
        return problem  # the converter's TypeErrors say no more than that
    return f"{problem} ({_text(exc)})"


def _text(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:
        return type(exc).__name__


def value_problems(label: str, annotation: object, value: object, exc: BaseException) -> list[str]:
    """Why ``value`` (called ``label``) failed ``annotation``, from the error ``exc`` of
    :func:`check_value`: one text per problem, naming where, expected and given."""
    problems = []
    for path, leaf, expected, found in _leaves(exc, "", annotation):
        given = _resolve(value, path) if found is _MISSING else found
        problems.append(_leaf_problem(label + path, leaf, expected, given))
    return problems


def _fields(record: type) -> tuple[attrs.Attribute[Any], ...]:
    try:
        return tuple(f for f in attrs.fields(attrs.resolve_types(record)) if f.init)
    except Exception:
        return ()


def record_problems(record: type, value: object) -> list[str]:
    """Why the record ``value`` (of the attrs class ``record``) is not valid, field by
    field (``Order.order_id: expected int, got str 'x'``); empty if every field is."""
    problems: list[str] = []
    for field in _fields(record):
        item = getattr(value, field.name, _MISSING)
        if item is _MISSING:
            continue
        annotation = Any if field.type is None else field.type
        try:
            check_value(annotation, item)
        except RecursionError:
            problems.append(f"{record.__qualname__}.{field.name}: nested too deeply")
        except Exception as exc:
            problems += value_problems(f"{record.__qualname__}.{field.name}", annotation, item, exc)
    return problems


def mapping_problems(record: type, data: object, exc: BaseException) -> list[str]:
    """Why ``data`` (parsed JSON) does not structure into ``record``, from the
    converter's error ``exc``: as :func:`record_problems` says it."""
    return value_problems(record.__qualname__, record, data, exc)


def describe_invalid(problems: list[str]) -> str:
    """The problems as one line (the first few)."""
    shown = "; ".join(problems[:_MAX_PROBLEMS])
    more = len(problems) - _MAX_PROBLEMS
    return shown + (f"; and {more} more" if more > 0 else "")


def is_validation_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the converter's (cattrs') own detailed error."""
    return isinstance(exc, cattrs.BaseValidationError)
