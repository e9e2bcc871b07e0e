"""Exit codes: the errors a command fails with, printed as one line without a traceback.

1 for a failure the user can act on (Redis unavailable, workers still running), 2 for
bad input or configuration (a path, a record, an option), 128 + N when stopped by
signal N, as a shell expects.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import IO, TYPE_CHECKING, Any, NoReturn

import asyncclick as click

from .. import _logs
from .._literal import printable

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["BadInput", "CommandError", "Stopped", "fail", "quiet_pipe"]

log = logging.getLogger("streamkit.cli")


class CommandError(click.ClickException):
    """A failure the user can act on: printed without a traceback, exit code 1."""

    exit_code = 1

    def format_message(self) -> str:
        """The message, each of its lines escaped: it may quote text from Redis."""
        return "\n".join(printable(line) for line in self.message.split("\n"))

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the message, or log it as an error where logs are JSON lines."""
        if _logs.current_format() == "json":
            log.error("%s", self.format_message())
        else:
            super().show(file)


class BadInput(CommandError):
    """The command was given something unusable (a path, a record): exit code 2."""

    exit_code = 2


class Stopped(CommandError):
    """Stopped by a signal: exit code 128 + the signal's number, as a shell expects."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum  # type: ignore[misc]


def fail(message: str, exit_code: int = 1) -> NoReturn:
    """Stop the command with ``message`` and ``exit_code`` (see the module's codes)."""
    if exit_code > 128:
        raise Stopped(message, exit_code - 128)
    raise (BadInput if exit_code == 2 else CommandError)(message)


@contextlib.contextmanager
def quiet_pipe() -> Iterator[None]:
    """The block, ended quietly (exit code 0, as a filter's) if the reader of standard
    output went away (``... | head``): inside ``async with app``, whose Redis errors'
    translation would take the ``BrokenPipeError`` for a lost connection to Redis."""
    try:
        yield
    except BrokenPipeError:
        # What is still buffered, and the interpreter's flush at exit, go nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
