"""A job's arguments on the worker: decode them, check them against the function, and
turn record parameters into records again; anything wrong is :class:`BadArguments` (pure).

Arguments come from any producer (an older or newer version of the app, another
language, a hand-written ``XADD``): nothing in them may raise anything else.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import cattrs
import orjson

from .._json_converter import converter
from ._outcome import describe

if TYPE_CHECKING:
    from ._handle import Job

__all__ = ["BadArguments", "decode_arguments"]

#: Problems named in a message, at most (a list of a million wrong items is not).
_MAX_PROBLEMS = 5
#: Characters of a message, at most.
_MAX_MESSAGE = 2000


class BadArguments(Exception):
    """A job's arguments cannot be given to its function; the message says why."""


def decode_arguments(job: Job[Any, Any], raw: object) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments of ``job`` in ``raw`` (the JSON
    ``[args, kwargs]`` of its record), record parameters structured.

    Error handling:
        :class:`BadArguments`, whatever is wrong: JSON that does not decode, a shape
        other than ``[list, object]``, arguments the function does not accept, a
        record parameter whose value does not structure (a field missing or of the
        wrong type), or anything raised while structuring one.
    """
    try:
        if not isinstance(raw, bytes | str):
            raise BadArguments(f"job {job.name}: no arguments recorded")
        try:
            decoded = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadArguments(f"job {job.name}: not JSON ({exc})") from None
        if (
            not isinstance(decoded, list)
            or len(decoded) != 2
            or not isinstance(decoded[0], list)
            or not isinstance(decoded[1], dict)
        ):
            raise BadArguments(f"job {job.name}: not a JSON [args, kwargs] pair")
        args, kwargs = decoded
        try:
            job.check_arguments(args, kwargs)
        except TypeError as exc:
            raise BadArguments(str(exc)) from None
        return _structure(job, args, kwargs)
    except BadArguments as exc:
        raise BadArguments(_cut(str(exc))) from None
    except Exception as exc:  # anything else a value can make a converter raise
        raise BadArguments(_cut(f"job {job.name}: {describe(exc)}")) from None


def _structure(
    job: Job[Any, Any], args: list[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Arguments annotated with attrs classes (records) become instances again."""
    structured = _structured_params(job)
    if not structured:
        return args, kwargs
    bound = job.signature.bind(*args, **kwargs)
    for name, annotation in structured.items():
        if name in bound.arguments:
            bound.arguments[name] = _structure_one(job, name, bound.arguments[name], annotation)
    return list(bound.args), dict(bound.kwargs)


def _structure_one(job: Job[Any, Any], name: str, value: Any, annotation: type) -> Any:
    where = f"job {job.name}: argument {name!r} ({annotation.__name__})"
    if not isinstance(value, Mapping):
        raise BadArguments(f"{where}: expected an object, got {type(value).__name__}")
    try:
        return converter.structure(value, annotation)
    except cattrs.BaseValidationError as exc:
        problems = cattrs.transform_error(exc, path=name)
        shown = "; ".join(_cut(problem, 300) for problem in problems[:_MAX_PROBLEMS])
        more = len(problems) - _MAX_PROBLEMS
        raise BadArguments(
            f"{where}: {shown}" + (f"; and {more} more" if more > 0 else "")
        ) from None
    except RecursionError:
        raise BadArguments(f"{where}: nested too deeply") from None
    except Exception as exc:
        raise BadArguments(f"{where}: {describe(exc)}") from None


@functools.cache
def _structured_params(job: Job[Any, Any]) -> dict[str, type]:
    try:
        hints = typing.get_type_hints(job.fn)
    except Exception:
        return {}
    return {
        name: hint
        for name, hint in hints.items()
        if name != "return" and isinstance(hint, type) and attrs.has(hint)
    }


def _cut(message: str, limit: int = _MAX_MESSAGE) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."
