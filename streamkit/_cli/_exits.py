"""Exit codes: the errors a command fails with, printed as one line without a traceback.

1 for a failure the user can act on (Redis unavailable, workers still running), 2 for
bad input or configuration (a path, a record, an option), 128 + N when stopped by
signal N, as a shell expects.

A command whose standard output's reader went away (``streamkit read ... | head -1``)
stops there, quietly, with exit code 0, as ``--watch`` always did: the reader wanted
no more, which is no failure of the command's (``set -o pipefail`` scripts go on), and
no signal stopped it (Python ignores ``SIGPIPE``), so neither click's 1 nor 141 says
what happened. See :func:`stdout_gone`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import sys
from typing import IO, Any, NoReturn

import asyncclick as click
from rich.console import Console

from .. import _logs
from .._errors import ConfigError, MetadataMismatch
from .._literal import printable
from .._nurseries import exception_chain

__all__ = [
    "BadInput",
    "CommandError",
    "StdoutConsole",
    "Stopped",
    "exit_code_of",
    "fail",
    "silence_stdout",
    "stdout_gone",
]

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


def exit_code_of(exc: BaseException) -> int:
    """A streamkit error's exit code: 2 for one of configuration (a bad setting, or a
    stream used with settings other than Redis records for it: no restart mends it),
    else 1."""
    return 2 if isinstance(exc, (ConfigError, MetadataMismatch)) else 1


def fail(message: str, exit_code: int = 1) -> NoReturn:
    """Stop the command with ``message`` and ``exit_code`` (see the module's codes)."""
    if exit_code > 128:
        raise Stopped(message, exit_code - 128)
    raise (BadInput if exit_code == 2 else CommandError)(message)


def stdout_gone(exc: BaseException) -> bool:
    """Whether ``exc`` comes of writing to a standard output whose reader went away.

    ``exc`` may be the ``BrokenPipeError`` itself or carry it (as its cause or context,
    or in a group): the Redis client's error handling takes any ``ConnectionError``
    raised inside a connected block, a write to standard output's included, for a lost
    connection to Redis. A ``BrokenPipeError`` counts only if standard output is a pipe
    with no reader now, so that a Redis socket's own is still said as such.
    """
    return any(isinstance(e, BrokenPipeError) for e in exception_chain(exc)) and _no_reader()


class StdoutConsole(Console):
    """A rich console on standard output whose reader going away is a
    ``BrokenPipeError``, as for any other write (:func:`stdout_gone`), rather than
    rich's own ``SystemExit(1)``: every command's output goes through one."""

    def on_broken_pipe(self) -> None:
        """Raise ``BrokenPipeError`` (called while rich handles the first)."""
        raise BrokenPipeError(errno.EPIPE, "standard output's reader went away")


def silence_stdout() -> None:
    """Point standard output at ``/dev/null``, so that what is left in its buffer, flushed
    at exit, goes nowhere instead of failing again (``Exception ignored ... BrokenPipeError``)."""
    with contextlib.suppress(AttributeError, ValueError, OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _no_reader() -> bool:
    """Whether standard output is a pipe whose reading end is closed (``poll`` says
    ``POLLERR`` of a pipe's writing end then)."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, ValueError, OSError):
        return False
    return any(mask & select.POLLERR for _, mask in events)
