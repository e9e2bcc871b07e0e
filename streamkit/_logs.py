"""Logs: context fields on every record, and the console and JSON formats.

Where a record comes from is kept in a context variable, set once per scope rather
than once per record: the worker sets the processor and member for everything an
executor runs, the rebalancer sets the partition in each partition's task, and the job
worker sets the job for each try. Trio tasks start with a copy of the context of the
task that started them, so the fields reach every task below (and threads started by
``trio.to_thread``) at no cost per event. :class:`LogContextFilter`, on a handler,
copies them onto each record it sees, with the worker's name (``host:pid``).

Two formats: :class:`ConsoleLogFormatter`, a readable line with the context compact
(``[orders p3]``), and :class:`JsonLogFormatter`, one JSON object per line (a
traceback is a string field, never extra lines).
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import sys
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TextIO

import orjson
from pythonjsonlogger.orjson import OrjsonFormatter

from ._errors import ConfigError
from ._literal import printable

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from contextlib import AbstractContextManager

__all__ = [
    "LOG_FORMATS",
    "ConsoleLogFormatter",
    "JsonLogFormatter",
    "LogContextFilter",
    "LogFormat",
    "configure_logging",
    "current_format",
    "line_for_signal_handler",
    "log_context",
    "partitions_text",
    "without_context",
    "worker_name",
]

LogFormat = Literal["console", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("console", "json")

_context: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "streamkit_log_context", default=MappingProxyType({})
)


def worker_name() -> str:
    """This process's name in logs, halt records and ``streamkit status``: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def partitions_text(partitions: Iterable[int]) -> str:
    """Partitions for a log line, runs as ranges: ``partitions 0-3, 6``,
    ``partition 5``, ``no partitions``."""
    numbers = sorted(set(partitions))
    if not numbers:
        return "no partitions"
    runs: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if number is not None:
            start = previous = number
    return f"partition{'s' if len(numbers) > 1 else ''} {', '.join(runs)}"


def log_context(**fields: object) -> AbstractContextManager[None]:
    """Add ``fields`` to every record logged inside the block, by this task and by the
    tasks (and ``trio.to_thread`` threads) it starts meanwhile.

    Blocks nest: an inner block adds to the outer one's fields, or overrides them.
    Setting it costs a dictionary copy, once per block: use it per scope (a partition,
    a job), never per event. The fields reach a handler's output through
    :class:`LogContextFilter`.

    Example::

        with streamkit.log_context(shard=3):
            log.info("starting")  # a JSON line with "shard": 3
    """
    return _LogContext(fields)


def without_context() -> AbstractContextManager[None]:
    """No context fields on the records logged inside the block (the worker's name
    still): for what is said once for the whole process, from whichever task."""
    return _LogContext(None)


class _LogContext:
    """What :func:`log_context` returns: a class, as it is entered once per job, and
    half as costly as a generator-based context manager."""

    __slots__ = ("_fields", "_token")

    def __init__(self, fields: Mapping[str, object] | None) -> None:
        self._fields = fields

    def __enter__(self) -> None:
        fields = self._fields
        self._token = _context.set(
            MappingProxyType({}) if fields is None else {**_context.get(), **fields}
        )

    def __exit__(self, *exc_info: object) -> None:
        _context.reset(self._token)


class LogContextFilter(logging.Filter):
    """A handler filter that adds the context fields to every record it passes.

    It sets ``worker`` (this process's ``host:pid``) and each field of the current
    :func:`log_context` (``processor``, ``partition``, ``member``, ``queue``,
    ``job``, ``job_id`` where streamkit set them) as attributes of the record, unless
    the record has the attribute already (given with ``extra=``). It drops nothing.

    Put it on a handler, not a logger (a logger's filters skip the records its
    children propagate)::

        handler.addFilter(streamkit.lowlevel.LogContextFilter())

    Args:
        worker: the ``worker`` field; this process's ``host:pid`` by default.
    """

    def __init__(self, worker: str | None = None) -> None:
        super().__init__()
        self.worker = worker_name() if worker is None else worker

    def filter(self, record: logging.LogRecord) -> bool:
        attributes = record.__dict__
        attributes.setdefault("worker", self.worker)
        for name, value in _context.get().items():
            attributes.setdefault(name, value)
        return True


def _iso_time(created: float) -> str:
    """``created`` (Unix time) in ISO 8601, UTC, to the millisecond: ``...T12:00:00.123Z``."""
    moment = datetime.fromtimestamp(created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonLogFormatter(OrjsonFormatter):
    """One JSON object per record, on one line (python-json-logger's, with orjson).

    Keys: ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``; then the
    record's extra attributes, among them the context fields of
    :class:`LogContextFilter`; then ``traceback``, the formatted exception, when
    the record has one. Newlines inside values are escaped, so a line is a record.
    """

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={
                "asctime": "time",
                "levelname": "level",
                "name": "logger",
                "exc_info": "traceback",
            },
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _iso_time(record.created)

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        # The long fields last, after the context, for a reader scanning lines.
        for key in ("traceback", "stack_info"):
            if key in log_data:
                log_data[key] = log_data.pop(key)


class ConsoleLogFormatter(logging.Formatter):
    """A readable line: time, level, ``[label]``, the context compact, logger, message.

    The context shows the processor and partition (``[orders p3]``) or the job
    (``[job send_email 4f1c...]``); the worker and member ids, the same on most lines
    of a process, are left to the JSON format. An exception's traceback follows its
    line, as usual. Control characters in the message, the context and the traceback
    are written as escapes (``\\n``, ``\\x1b``): a record's message stays on one line
    and no escape code from logged data reaches the terminal.
    """

    def __init__(self, label: str | None = None) -> None:
        # The format only tells logging.Formatter to fill in asctime: formatMessage
        # lays the line out itself.
        super().__init__("%(asctime)s %(message)s")
        self._label = f"[{label}] " if label else ""

    def formatMessage(self, record: logging.LogRecord) -> str:
        # The message and the context carry text from Redis (errors, job names and
        # ids): escaped, so that a record is one line and no escape code reaches
        # the terminal.
        return (
            f"{record.asctime} {record.levelname:<7} {self._label}{_where(record)}"
            f"{record.name}: {printable(record.message)}"
        )

    def format(self, record: logging.LogRecord) -> str:
        # Another handler may have cached the traceback's text, unescaped, on the record.
        cached, record.exc_text = record.exc_text, None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatException(self, ei: Any) -> str:
        """The traceback on lines of its own, as usual, each line escaped."""
        return _printable_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _printable_lines(super().formatStack(stack_info))


def _printable_lines(text: str) -> str:
    return "\n".join(printable(line) for line in text.split("\n"))


def _where(record: logging.LogRecord) -> str:
    """The record's context, compact: ``[orders p3] ``, ``[job name id] ``, or ``""``."""
    fields = record.__dict__
    job = fields.get("job")
    if job is not None:
        parts = ["job", str(job), str(fields.get("job_id", "?"))]
    else:
        parts = []
        processor = fields.get("processor")
        if processor is not None:
            parts.append(str(processor))
        partition = fields.get("partition")
        if partition is not None:
            parts.append(f"p{partition}")
    return f"[{printable(' '.join(parts))}] " if parts else ""


# What configure_logging installed last: replaced, not added to, by the next call.
_installed: logging.Handler | None = None
_format: LogFormat = "console"
_worker = worker_name()


def configure_logging(
    level: str | int = "info",
    *,
    format: LogFormat = "console",  # noqa: A002 (the option's name)
    label: str | None = None,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Log to standard error in ``format``, with the context fields, as the worker does.

    Installs one handler on the root logger (replacing the one an earlier call
    installed; other handlers are left alone), with a
    :class:`~streamkit.lowlevel.LogContextFilter` and a
    :class:`~streamkit.lowlevel.JsonLogFormatter` (``"json"``) or
    :class:`~streamkit.lowlevel.ConsoleLogFormatter` (``"console"``), and sets the
    root logger's level. coredis's own records are silenced: streamkit reports what
    matters about connections itself.

    Args:
        level: the least severe records shown: ``"debug"``, ``"info"``,
            ``"warning"``, ``"error"`` (any case), or a number.
        format: ``"console"`` or ``"json"``.
        label: shown in brackets on every console line (``worker 2``).
        stream: where to write; standard error by default.

    Returns:
        the handler installed.

    Error handling:
        :class:`~streamkit.ConfigError` for an unknown format or level.
    """
    global _installed, _format, _worker
    if format not in LOG_FORMATS:
        raise ConfigError("log_format", f"must be one of {', '.join(LOG_FORMATS)}, got {format!r}")
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise ConfigError("log_level", f"unknown level {level!r}")
        level = number
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.addFilter(LogContextFilter())
    handler.setFormatter(JsonLogFormatter() if format == "json" else ConsoleLogFormatter(label))
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    root.setLevel(level)
    _installed, _format, _worker = handler, format, worker_name()
    # streamkit's Redis layer reports what an operator should see about connections
    # itself, once and with the URL masked (streamkit.redis: a connection lost, and
    # re-established). coredis's own records would repeat those, or describe its
    # internals (script reloads, optimistic transaction conflicts); it retries
    # nothing, so none of them hides a command sent twice.
    logging.getLogger("coredis").setLevel(logging.CRITICAL)
    return handler


def current_format() -> LogFormat:
    """The format :func:`configure_logging` set last (``"console"`` before any call)."""
    return _format


def line_for_signal_handler(message: str, *, logger: str, level: str = "WARNING") -> bytes:
    """``message`` as one line of the format :func:`configure_logging` set, for a
    signal handler to write with ``os.write`` (the logging module takes locks that
    the interrupted code may hold). Without context fields: a signal handler runs
    in whatever context was current."""
    if _format == "json":
        record: dict[str, Any] = {
            "time": _iso_time(datetime.now(UTC).timestamp()),
            "level": level,
            "logger": logger,
            "message": message,
            "worker": _worker,
        }
        return orjson.dumps(record) + b"\n"
    return f"{message}\n".encode()
