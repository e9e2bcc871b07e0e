"""What a try's end makes of its job: ok, retry or dead, and the error it keeps (pure).

:func:`decide` is the whole rule; the worker applies its verdict (see ``_run``), and
tests check it without Redis.
"""

from __future__ import annotations

import math
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

import attrs
import orjson

if TYPE_CHECKING:
    from .._backoff import Backoff
    from ._model import JobOptions

__all__ = [
    "MAX_MESSAGE",
    "MAX_TRACEBACK",
    "Failure",
    "Retry",
    "Verdict",
    "decide",
    "describe",
    "label",
    "retry_delay",
    "safe_str",
    "type_name",
]

#: Characters of an error's message kept in a job's record, at most: an exception's
#: text comes from anywhere, and the record must stay well within Redis' limits.
MAX_MESSAGE = 8_000
#: Characters of an error's traceback kept, at most (its end: the innermost frames).
MAX_TRACEBACK = 32_000


def type_name(exc: BaseException) -> str:
    """The qualified name of ``exc``'s type, without ``builtins.``."""
    cls = type(exc)
    module = cls.__module__
    return (
        cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"
    )


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder if that raises."""
    try:
        return str(exc)
    except Exception:
        return f"<{type_name(exc)} whose str() failed>"


def label(value: object) -> str:
    """``value`` (bytes from Redis) as text for a log line, whatever its bytes."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def describe(exc: BaseException) -> str:
    """``type: message`` of ``exc``, for a one-line error."""
    return f"{type_name(exc)}: {safe_str(exc)}"


def _head(value: str, limit: int) -> str:
    if len(value) <= limit:
        return value
    return f"{value[: limit - 40]}... ({len(value) - limit + 40} characters cut)"


def _tail(value: str, limit: int) -> str:
    if len(value) <= limit:
        return value
    return f"({len(value) - limit + 40} characters cut) ...{value[-(limit - 40) :]}"


def _cut_type(value: str) -> str:
    return _head(value, 200)


def _cut_message(value: str) -> str:
    return _head(value, MAX_MESSAGE)


def _cut_traceback(value: str) -> str:
    return _tail(value, MAX_TRACEBACK)


class Retry(Exception):
    """Raised by a job to be tried again after ``delay`` (seconds or a ``timedelta``;
    ``None``: its backoff's delay), whatever its ``retry_on``.

    The try counts as a failed one: with no try left, the job ends dead.

    Attributes:
        delay: seconds before the next try, or ``None`` for the job's backoff.
    """

    def __init__(self, delay: float | timedelta | None = None, message: str = "") -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if seconds is not None and not (
            isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds >= 0
        ):
            raise ValueError(f"Retry(delay=...) must be seconds from 0 up, got {delay!r}")
        self.delay: float | None = seconds
        super().__init__(message or (f"retry in {seconds:g}s" if seconds is not None else "retry"))


@attrs.frozen
class Failure:
    """Why a try failed, as its job's record keeps it.

    Attributes:
        type: the exception's qualified name, or what ended the try (``"Timeout"``,
            ``"BadInput"``, ...).
        message: its message.
        traceback: the formatted traceback, "" if there is none.
        unretried: why it is never retried, whatever tries are left (``None``: it is
            retried while tries are left).
        delay_ms: the delay before the next try that the job asked for (``raise
            Retry(delay=...)``), instead of its backoff's; ``None`` if it did not.
    """

    type: str = attrs.field(converter=_cut_type)
    message: str = attrs.field(converter=_cut_message)
    traceback: str = attrs.field(default="", converter=_cut_traceback)
    unretried: str | None = None
    delay_ms: int | None = None

    @classmethod
    def of(cls, exc: BaseException, *, unretried: str | None = None) -> Failure:
        """The failure of a try that raised ``exc`` (a :class:`Retry` is retried
        whatever ``unretried`` says, after the delay it asks for)."""
        if isinstance(exc, Retry):
            delay = None if exc.delay is None else max(0, math.ceil(exc.delay * 1000))
            return cls("Retry", safe_str(exc), "", None, delay)
        try:
            formatted = "".join(traceback.format_exception(exc))
        except Exception:  # a traceback is a courtesy: never a reason to fail
            formatted = ""
        return cls(type_name(exc), safe_str(exc), formatted, unretried)

    @property
    def why(self) -> str:
        """``type: message``, for a log line."""
        return f"{self.type}: {self.message}"

    def encode(self) -> bytes:
        """The JSON the finish script records as the job's error."""
        return orjson.dumps(
            {"type": self.type, "message": self.message, "traceback": self.traceback}
        )


@attrs.frozen
class Verdict:
    """What becomes of a job after a try.

    Attributes:
        outcome: ``"ok"`` (it succeeded), ``"retry"`` (another try, after
            ``delay_ms``) or ``"dead"`` (to the dead letters).
        delay_ms: milliseconds before the next try, for a retry.
    """

    outcome: Literal["ok", "retry", "dead"]
    delay_ms: int = 0


def retry_delay(backoff: Backoff, tries: int, draw: float) -> int:
    """Milliseconds before try ``tries + 1``: the backoff's ``tries``-th delay, cut by
    ``backoff.jitter * draw`` of itself (``draw`` from 0 to 1, at random); at least 1."""
    try:
        delay = min(backoff.initial * backoff.factor ** max(tries - 1, 0), backoff.maximum)
    except OverflowError:  # a growth past floats is past the maximum
        delay = backoff.maximum
    return max(1, math.ceil(delay * (1 - backoff.jitter * draw) * 1000))


def decide(options: JobOptions, tries: int, failure: Failure | None, draw: float) -> Verdict:
    """The verdict on try number ``tries`` of a job declared with ``options``.

    Args:
        options: the job's options (``retries`` and ``backoff`` count here).
        tries: the number of the try that ended (1 for the first).
        failure: why it failed; ``None`` if it succeeded.
        draw: a random number from 0 to 1, for the retry delay's jitter.

    A failed try is retried while tries are left (``retries + 1`` in all), unless
    its failure is never retried (``unretried``); otherwise the job is dead. The delay
    is the one the job asked for (``raise Retry(delay=...)``), else the backoff's.
    """
    if failure is None:
        return Verdict("ok")
    if failure.unretried is None and tries < options.retries + 1:
        if failure.delay_ms is not None:
            return Verdict("retry", failure.delay_ms)
        return Verdict("retry", retry_delay(options.backoff, tries, draw))
    return Verdict("dead")
