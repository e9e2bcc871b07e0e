"""Checks for settings and arguments: each rule written once, used everywhere.

A :class:`Check` is an attrs validator (``attrs.field(validator=positive_number)``) that
can also check a plain argument (``positive_number.check("grace", grace)``). Every
failure is a :class:`ConfigError` naming the setting and the value.

Numbers are ints or floats but never bools (``True`` is an ``int`` to Python, not a
count or a duration to a user), and never NaN, which compares false with everything
and so would slip past a bare ``value > 0``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeGuard

import attrs

from ._defaults import MINIMUM_TTL
from ._errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "Check",
    "at_least",
    "fraction",
    "is_int",
    "is_number",
    "non_negative_int",
    "non_negative_number",
    "one_of",
    "port_number",
    "positive_finite_number",
    "positive_int",
    "positive_number",
    "valid_ttl",
]


def is_int(value: object) -> TypeGuard[int]:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """True for an ``int`` or ``float`` that is neither a ``bool`` nor NaN."""
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


@attrs.frozen
class Check:
    """A rule a setting's value must follow.

    Attributes:
        accepts: true for a valid value.
        requirement: what a valid value is, completing "must be ...".
    """

    accepts: Callable[[object], bool]
    requirement: str

    def check(self, name: str, value: object) -> None:
        """Raise :class:`ConfigError` naming ``name`` unless ``value`` follows the rule."""
        if not self.accepts(value):
            raise ConfigError(name, f"must be {self.requirement}, got {value!r}")

    def __call__(self, instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        """The attrs validator form: the field's name is the setting's name."""
        self.check(attribute.name, value)

    def or_none(self) -> Check:
        """The same rule, also accepting ``None`` (an unset optional setting)."""
        return Check(
            lambda value: value is None or self.accepts(value), f"{self.requirement} or None"
        )


def at_least(minimum: float, *, finite: bool = False) -> Check:
    """A number ``>= minimum`` (and not infinite, if ``finite``)."""

    def accepts(value: object) -> bool:
        return is_number(value) and value >= minimum and (not finite or math.isfinite(value))

    return Check(accepts, f"a {'finite ' if finite else ''}number >= {minimum}")


def one_of(*choices: object) -> Check:
    """One of ``choices`` (compared with ``==``)."""
    return Check(lambda value: value in choices, f"one of {', '.join(map(str, choices))}")


def _positive_int(value: object) -> bool:
    return is_int(value) and value >= 1


def _non_negative_int(value: object) -> bool:
    return is_int(value) and value >= 0


def _positive_number(value: object) -> bool:
    return is_number(value) and value > 0


def _positive_finite_number(value: object) -> bool:
    return is_number(value) and value > 0 and math.isfinite(value)


def _port_number(value: object) -> bool:
    return is_int(value) and 0 <= value <= 65535


def _fraction(value: object) -> bool:
    return is_number(value) and 0 <= value <= 1


#: A count: an int ``>= 1``.
positive_int = Check(_positive_int, "a positive integer")
#: An int ``>= 0``.
non_negative_int = Check(_non_negative_int, "an integer >= 0")
#: A number ``> 0``; infinity allowed (say, "wait forever").
positive_number = Check(_positive_number, "a number > 0")
#: A finite number ``> 0``.
positive_finite_number = Check(_positive_finite_number, "a finite number > 0")
#: A number ``>= 0``; infinity allowed.
non_negative_number = at_least(0)
#: A number from 0 to 1, both included.
fraction = Check(_fraction, "a number from 0 to 1")
#: A TCP port: an int from 0 (any free port) to 65535.
port_number = Check(_port_number, "a port number from 0 to 65535")


#: A lease TTL, in seconds: finite, and at least :data:`~streamkit._defaults.MINIMUM_TTL`.
valid_ttl = at_least(MINIMUM_TTL, finite=True)
