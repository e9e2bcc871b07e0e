"""Logging of the commands that run for long: ``--log-level`` and ``--log-format``."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import asyncclick as click

from .. import _logs
from ._supervisor import WORKER_INDEX_VARIABLE

if TYPE_CHECKING:
    import types

    from .._logs import LogFormat

__all__ = ["configure_logging", "logging_options"]

log = logging.getLogger("streamkit.cli")


def configure_logging(level: str, log_format: LogFormat = "console") -> None:
    """Log to standard error in ``log_format``; a command that runs for long calls it
    first, so that even its import-time records are formatted.

    With ``"json"``, everything the process writes to standard error is a JSON line:
    a command's error (see :meth:`CommandError.show`) and an unexpected exception's
    traceback are logged as records.
    """
    # A worker process of `worker --processes N` says which one it is: the N workers
    # write to the same standard error. (A JSON line has the worker's host:pid.)
    index = os.environ.get(WORKER_INDEX_VARIABLE)
    _logs.configure_logging(
        level, format=log_format, label=None if index is None else f"worker {index}"
    )
    if log_format == "json":
        sys.excepthook = _log_uncaught


def _log_uncaught(
    kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None
) -> None:
    log.critical("stopped by an unexpected error: %r", exc, exc_info=(kind, exc, tb))


def logging_options(function: Any) -> Any:
    """``--log-level`` and ``--log-format``, for the commands that run for long."""
    function = click.option(
        "--log-format",
        type=click.Choice(_logs.LOG_FORMATS, case_sensitive=False),
        default="console",
        show_default=True,
        envvar="STREAMKIT_LOG_FORMAT",
        show_envvar=True,
        help="How log records are written (on standard error): readable lines, or one "
        "JSON object per line with worker, processor, partition and member fields.",
    )(function)
    return click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
        default="info",
        show_default=True,
        envvar="STREAMKIT_LOG_LEVEL",
        show_envvar=True,
        help="Least severe log messages to show (on standard error).",
    )(function)
