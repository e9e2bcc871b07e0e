"""``streamkit sendmany``: check every line first, then send, and account for every line.

The command reads JSON Lines, checks every line (JSON, the record's fields, its
partition key, its encoding) before sending anything, then appends the records
partition by partition, one chunk (one Lua call, all or nothing) at a time. Every
chunk's outcome is known: appended, not appended, or unknown (the connection was lost
with it in flight). When sending stops early (a Redis error, a signal), the report
says exactly which lines are in Redis and gives the command that sends the rest
without duplicates.

A chunk is cut by count and by bytes exactly as ``send_many`` cuts its appends (see
:func:`streamkit._wire.chunk_bounds`), so that each chunk is one Lua call.

Why per-partition marks: the partitions of a window are sent concurrently, so when
one fails, others may be further along. The chunks of one partition go in order, so
what is in Redis is, per partition, every line up to some line. ``--skip N`` plus
``--skip-sent PARTITION:LINE,...`` describes that exactly.
"""

from __future__ import annotations

import shlex
import signal
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import ConfigError, EncodeError, OutcomeUnknown, StreamkitError
from .._urls import mask_url
from .._wire import DEFAULT_SEND_CHUNK_BYTES, chunk_bounds

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from .._streams import Stream

__all__ = ["Line", "SendOutcome", "check_lines", "parse_marks", "send_lines"]

# Windows of this many chunks per partition are sent at a time: the pipeline of every
# partition stays full, and a graceful stop finishes within one window.
CHUNKS_PER_WINDOW = 4


@attrs.frozen
class Line:
    """A checked input line: its number (from 1), partition, record and encoded size."""

    number: int
    partition: int
    record: Any
    size: int = 0


def check_record_key(stream: Stream[Any], record: Any) -> tuple[int, int]:
    """The partition of ``record`` and its encoded size, checking its key and encoding.

    Error handling:
        ``ValueError`` saying what is wrong with the key or the encoding.
    """
    try:
        partition = stream.partition_of(record)
    except ConfigError as exc:
        raise ValueError(f"partition key {describe_key(stream)}: {exc}") from None
    except Exception as exc:  # the user's partition_by function, or a missing field
        raise ValueError(
            f"cannot compute the partition key {describe_key(stream)}: {type(exc).__name__}: {exc}"
        ) from None
    try:
        fields = stream.codec.encode(record)
    except EncodeError as exc:
        raise ValueError(f"cannot encode the record: {exc}") from None
    return partition, sum(len(name) + len(value) for name, value in fields.items())


def describe_key(stream: Stream[Any]) -> str:
    by = stream.partition_by
    if isinstance(by, str):
        return f"(field {by!r})"
    return f"(partition_by={getattr(by, '__qualname__', repr(by))})"


def check_lines(
    stream: Stream[Any],
    lines: Iterable[bytes],
    parse: Callable[[bytes], Any],
    *,
    skip: int = 0,
    marks: dict[int, int] | None = None,
) -> tuple[list[Line], list[str], int]:
    """Check every line; return (the lines to send, the errors, lines already sent).

    Lines up to ``skip``, blank lines, and lines whose partition's mark says they were
    sent are left out. ``parse`` turns a line into a record or raises ``ValueError``.
    """
    marks = marks or {}
    checked: list[Line] = []
    errors: list[str] = []
    already = 0
    for number, text in enumerate(lines, start=1):
        if number <= skip:
            continue
        if not text.strip():
            continue
        try:
            record = parse(text)
            partition, size = check_record_key(stream, record)
        except ValueError as exc:
            errors.append(f"line {number}: {exc}")
            continue
        if number <= marks.get(partition, 0):
            already += 1
            continue
        checked.append(Line(number, partition, record, size))
    return checked, errors, already


def parse_marks(text: str | None, partition_count: int) -> dict[int, int]:
    """Parse ``--skip-sent`` (``PARTITION:LINE,...``).

    Error handling:
        ``ValueError`` naming the bad part.
    """
    marks: dict[int, int] = {}
    if not text:
        return marks
    for part in text.split(","):
        partition_text, sep, line_text = part.strip().partition(":")
        try:
            partition, line = int(partition_text), int(line_text)
        except ValueError:
            partition = line = -1
        if not sep or not 0 <= partition < partition_count or line < 1:
            raise ValueError(
                f"{part.strip()!r} is not PARTITION:LINE (a partition from 0 to "
                f"{partition_count - 1} and a line number)"
            )
        marks[partition] = max(line, marks.get(partition, 0))
    return marks


@attrs.define(eq=False)
class SendOutcome:
    """What happened to the lines of one sendmany run.

    Attributes:
        lines: the lines this run was to send, in input order.
        skip: the ``--skip`` it ran with.
        marks: partition -> last line of it known to be in Redis (from ``--skip-sent``
            and this run).
        sent: how many of ``lines`` were appended.
        unknown: lines whose chunk's outcome is unknown.
        error: the error that stopped sending, if any.
        signal: the signal that stopped sending, if any.
        hard_stopped: whether a second signal cancelled the chunks in flight.
    """

    lines: list[Line]
    skip: int
    marks: dict[int, int]
    sent: int = 0
    unknown: list[Line] = attrs.field(factory=list)
    error: StreamkitError | None = None
    signal: int | None = None
    hard_stopped: bool = False
    _done: list[bool] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._done = [False] * len(self.lines)

    @property
    def complete(self) -> bool:
        return self.sent == len(self.lines)

    def appended(self, indices: Iterable[int]) -> None:
        """The lines at ``indices`` (in :attr:`lines`) are in Redis."""
        for index in indices:
            self._done[index] = True
            line = self.lines[index]
            self.marks[line.partition] = max(line.number, self.marks.get(line.partition, 0))
            self.sent += 1

    def prefix(self) -> int:
        """N such that every line up to N is in Redis (or was skipped, or blank)."""
        for index, done in enumerate(self._done):
            if not done:
                return self.lines[index].number - 1
        return self.lines[-1].number if self.lines else self.skip

    def resume_marks(self, prefix: int) -> dict[int, int]:
        return {p: line for p, line in sorted(self.marks.items()) if line > prefix}

    def report(self, command: list[str]) -> str:
        """What was sent, what was not, and the command that sends the rest."""
        total = len(self.lines)
        out: list[str] = []
        if self.sent == 0:
            out.append(f"nothing was sent (0 of {total:,} records)")
        else:
            sent_numbers = [
                line.number for line, done in zip(self.lines, self._done, strict=True) if done
            ]
            first, last = sent_numbers[0], sent_numbers[-1]
            prefix = self.prefix()
            if prefix >= last:
                out.append(f"sent {self.sent:,} of {total:,} records: lines {first:,}-{last:,}")
            else:
                beyond = self.resume_marks(prefix)
                where = ", ".join(f"{p} up to line {n:,}" for p, n in beyond.items())
                out.append(
                    f"sent {self.sent:,} of {total:,} records: every line up to {prefix:,}, "
                    f"and the lines of partition(s) {where}"
                )
        if self.unknown:
            numbers = [line.number for line in self.unknown]
            out.append(
                f"{len(numbers):,} record(s) may or may not be in Redis (their outcome is "
                f"unknown): {describe_numbers(numbers)}; check before sending them again"
            )
        prefix = self.prefix()
        marks = self.resume_marks(prefix)
        resume = [*command, "--skip", str(prefix)]
        if marks:
            resume += ["--skip-sent", ",".join(f"{p}:{n}" for p, n in marks.items())]
        out.append(
            "to send the rest without duplicates"
            + (" (and the records whose outcome is unknown)" if self.unknown else "")
            + ": "
            + " ".join(shlex.quote(part) for part in resume)
        )
        return "\n".join(out)


def describe_numbers(numbers: list[int], limit: int = 10) -> str:
    """``lines 3, 7-9, 12`` for sorted line numbers (at most ``limit`` ranges)."""
    ranges: list[tuple[int, int]] = []
    for n in sorted(numbers):
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], n)
        else:
            ranges.append((n, n))
    shown = [f"{a:,}" if a == b else f"{a:,}-{b:,}" for a, b in ranges[:limit]]
    more = len(ranges) - limit
    return "lines " + ", ".join(shown) + (f" and {more} more ranges" if more > 0 else "")


def resume_command(
    stream_path: str, source_name: str, redis_url: str | None, chunk_size: int | None
) -> list[str]:
    """The command line that repeats this run (without ``--skip``/``--skip-sent``)."""
    command = [
        "streamkit",
        "sendmany",
        stream_path,
        "-" if source_name == "<stdin>" else source_name,
    ]
    if redis_url is not None:
        command += ["--redis-url", mask_url(redis_url)]
    if chunk_size is not None:
        command += ["--chunk-size", str(chunk_size)]
    return command


async def send_lines(
    stream: Stream[Any],
    outcome: SendOutcome,
    *,
    chunk_size: int,
    on_sent: Callable[[int], None] | None = None,
    on_signal: Callable[[int], None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Send ``outcome.lines``, recording in ``outcome`` what happened to each.

    A first SIGINT or SIGTERM stops sending once the chunks in flight are done (their
    outcome known); a second one cancels them (their outcome unknown). Errors and
    signals are recorded in ``outcome``, not raised. ``on_sent(n)`` is called after
    each chunk, ``on_signal(signum)`` on the first signal.
    """
    lines = outcome.lines
    window = chunk_size * CHUNKS_PER_WINDOW * stream.partition_count
    stopping = False

    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

            async def watch_signals() -> None:
                nonlocal stopping
                async for signum in signals:
                    if outcome.signal is None:
                        outcome.signal = signum
                        stopping = True
                        if on_signal is not None:
                            on_signal(signum)
                    else:
                        outcome.hard_stopped = True
                        sending.cancel("a second signal")
                        return

            nursery.start_soon(watch_signals)
            task_status.started()
            with trio.CancelScope() as sending:
                await stream.check_metadata()
                for start in range(0, len(lines), window):
                    if stopping or outcome.error is not None:
                        break
                    await _send_window(
                        stream, outcome, start, lines[start : start + window], chunk_size, on_sent
                    )
            nursery.cancel_scope.cancel()


async def _send_window(
    stream: Stream[Any],
    outcome: SendOutcome,
    start: int,
    window: list[Line],
    chunk_size: int,
    on_sent: Callable[[int], None] | None,
) -> None:
    # Per partition: the indices (in outcome.lines) of its lines, in input order.
    indices: dict[int, list[int]] = {}
    for offset, line in enumerate(window):
        indices.setdefault(line.partition, []).append(start + offset)

    async def send_partition(mine: list[int]) -> None:
        sizes = [outcome.lines[i].size for i in mine]
        for first, end in chunk_bounds(sizes, chunk_size, DEFAULT_SEND_CHUNK_BYTES):
            if outcome.error is not None:
                return  # another partition failed: finish, start nothing new
            chunk = mine[first:end]
            try:
                await stream.send_many(
                    [outcome.lines[i].record for i in chunk], chunk_size=chunk_size
                )
            except OutcomeUnknown as exc:
                outcome.unknown.extend(outcome.lines[i] for i in chunk)
                outcome.error = outcome.error or exc
                return
            except StreamkitError as exc:
                outcome.error = outcome.error or exc
                return
            except trio.Cancelled:
                outcome.unknown.extend(outcome.lines[i] for i in chunk)
                raise
            outcome.appended(chunk)
            if on_sent is not None:
                on_sent(len(chunk))

    async with trio.open_nursery() as nursery:
        for mine in indices.values():
            nursery.start_soon(send_partition, mine)
