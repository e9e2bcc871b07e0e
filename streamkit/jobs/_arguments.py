"""A job's arguments checked against its function: at enqueue, and on the worker, where
they are decoded and record parameters become records again (pure).

At enqueue (:func:`check_argument_types`, called by every client through
:meth:`Job.check_arguments <streamkit.jobs.Job.check_arguments>`), each argument of
an annotated parameter must pass its annotation by the rule records follow
(:mod:`streamkit._codec_check`): its JSON, as the job stores it, structures back into
the annotation. ``Any``, unannotated parameters, ``*args``/``**kwargs`` and
annotations the converter cannot check (a protocol, a callable, a class of your own
that is not an attrs class) pass as they are.

On the worker (:func:`decode_arguments`), record parameters are structured by the same
converter; other arguments are passed as their JSON, unchecked: a workflow feeds a
step the result of the one before it (a failure callback, the failure's details),
which its annotation need not describe. Arguments come from any producer (an older or
newer version of the app, another language, a hand-written ``XADD``), so nothing in
them may raise anything but :class:`BadArguments`.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Hashable, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import cattrs
import orjson

from .._codec_check import (
    EXACT_TYPES,
    check_value,
    describe_invalid,
    mapping_key_type,
    type_name,
    value_problems,
)
from .._errors import EncodeError
from .._json_converter import converter
from ._model import dumps
from ._outcome import describe

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "FED",
    "BadArguments",
    "Declared",
    "check_argument_types",
    "checked_parameters",
    "decode_arguments",
]

#: Problems named in a message, at most (a list of a million wrong items is not).
_MAX_PROBLEMS = 5
#: Characters of a message, at most.
_MAX_MESSAGE = 2000


class Declared(Hashable, Protocol):
    """What checking arguments needs of a declared job (a :class:`~streamkit.jobs.Job`,
    which imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def fn(self) -> Callable[..., Any]: ...
    @property
    def signature(self) -> inspect.Signature: ...
    def check_arity(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None: ...


class BadArguments(Exception):
    """A job's arguments cannot be given to its function; the message says why."""


def decode_arguments(job: Declared, raw: object) -> tuple[list[Any], dict[str, Any]]:
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
            job.check_arity(args, kwargs)
        except TypeError as exc:
            raise BadArguments(str(exc)) from None
        return _structure(job, args, kwargs)
    except BadArguments as exc:
        raise BadArguments(_cut(str(exc))) from None
    except Exception as exc:  # anything else a value can make a converter raise
        raise BadArguments(_cut(f"job {job.name}: {describe(exc)}")) from None


def _structure(
    job: Declared, args: list[Any], kwargs: dict[str, Any]
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


def _structure_one(job: Declared, name: str, value: Any, annotation: type) -> Any:
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
def _structured_params(job: Declared) -> dict[str, type]:
    """The parameters annotated with an attrs class (a record): structured again."""
    return {
        name: hint
        for name, hint in checked_parameters(job).items()
        if isinstance(hint, type) and attrs.has(hint)
    }


# -- the annotations checked, and the check -------------------------------------------


class _Fed:
    def __repr__(self) -> str:
        return "<the result fed in>"


#: Stands for the argument a workflow feeds a step (the result of the step before it),
#: unknown at enqueue: not checked.
FED: Any = _Fed()

# Generic collections the converter structures (and so checks) by their arguments.
_COLLECTIONS = frozenset(
    {list, tuple, set, frozenset, dict}
    | {getattr(typing, name) for name in ("List", "Tuple", "Set", "FrozenSet", "Dict")}
)


def _checkable(annotation: Any) -> bool:
    """Whether the converter checks ``annotation`` by the records' rule (and so the
    enqueue may): scalars, enums, attrs classes, collections and unions of them."""
    if annotation in EXACT_TYPES or annotation is type(None):
        return True
    if isinstance(annotation, type) and (issubclass(annotation, Enum) or attrs.has(annotation)):
        return True
    origin = typing.get_origin(annotation)
    arguments = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in arguments if arg is not type(None)]
        # An optional value, or a union the converter tells apart (records only).
        return len(members) == 1 and _checkable(members[0])
    if origin in _COLLECTIONS or (
        isinstance(origin, type) and origin.__module__ == "collections.abc"
    ):
        return bool(arguments) and all(_checkable(arg) or arg is Any for arg in arguments)
    return False


@functools.cache
def checked_parameters(job: Declared) -> dict[str, Any]:
    """The parameters of ``job`` whose arguments are checked, with their annotations."""
    try:
        hints = typing.get_type_hints(job.fn)
    except Exception:
        return {}
    checked = {}
    for name, parameter in job.signature.parameters.items():
        hint = hints.get(name)
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if hint is not None and hint is not Any and _checkable(hint):
            checked[name] = hint
    return checked


@functools.cache
def _positions(job: Declared) -> tuple[str, ...]:
    """The names of the parameters positional arguments bind to, in order."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in job.signature.parameters.values() if p.kind in kinds)


def check_argument_types(
    job: Declared,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> None:
    """Check the arguments of a call the function accepts against its annotations.

    Error handling:
        :class:`~streamkit.EncodeError` for an argument that is not JSON at all, as
        the encoding says it; ``TypeError`` naming the job, the argument, the type
        declared and the type given (``job charge: argument amount: expected int, got str '100'``).
    """
    checked = checked_parameters(job)
    if not checked:
        return
    positions = _positions(job)
    if len(args) <= len(positions):
        given = dict(zip(positions, args, strict=False))
        given.update(kwargs)
    else:  # a *args parameter takes the rest
        given = dict(job.signature.bind(*args, **kwargs).arguments)
    what = f"the arguments of job {job.name}"
    problems: list[str] = []
    for name, annotation in checked.items():
        if name not in given:
            continue
        value = given[name]
        if value is FED:
            continue
        keyed = _keyed_by_other_than_str(annotation)
        if keyed is not None and value is not None:
            problems.append(
                f"argument {name}: a job cannot take a {type_name(keyed)}: its arguments "
                f"are JSON, whose object keys are strings, so the job would get its "
                f"{type_name(mapping_key_type(keyed))} keys as str; declare the keys str (or "
                f"take a list of pairs)"
            )
            continue
        try:
            encode = functools.partial(dumps, what=f"{what}: argument {name}")
            check_value(annotation, value, encode)
        except EncodeError:
            raise  # not JSON at all: said as the encoding says it
        except RecursionError:
            problems.append(f"argument {name}: nested too deeply")
        except Exception as exc:
            problems += value_problems(f"argument {name}", annotation, value, exc)
    if problems:
        raise TypeError(f"job {job.name}: {describe_invalid(problems)}")


@functools.cache
def _keyed_by_other_than_str(annotation: Any) -> Any:
    """The first mapping annotation in ``annotation`` (itself, or within it) whose
    keys are not strings (``dict[int, int]``), or ``None``: JSON keeps no such key."""
    key = mapping_key_type(annotation)
    if key is not None and not (key is Any or (isinstance(key, type) and issubclass(key, str))):
        return annotation
    for argument in typing.get_args(annotation):
        found = _keyed_by_other_than_str(argument)
        if found is not None:
            return found
    return None


def _cut(message: str, limit: int = _MAX_MESSAGE) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."
