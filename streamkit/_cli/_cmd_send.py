"""``streamkit send`` and ``sendmany``: records from the command line into a stream."""

from __future__ import annotations

import signal
from typing import IO, TYPE_CHECKING, Any

import asyncclick as click
import orjson

from .._errors import EncodeError, MetadataMismatch, StreamkitError
from .._literal import printable
from ._exits import fail
from ._loading import load_stream, with_stream_path
from ._options import progress_bar, redis_url_option, stopping_notice
from ._sendmany import SendOutcome, check_lines, parse_marks, resume_command, send_lines

if TYPE_CHECKING:
    from .._streams import Stream

__all__ = ["parse_record", "send", "sendmany"]

MAX_REPORTED_ERRORS = 20


@click.command()
@click.argument("stream_path", metavar="MODULE:STREAM")
@click.argument("record_json", metavar="JSON")
@redis_url_option
async def send(stream_path: str, record_json: str, redis_url: str | None) -> None:
    """Send one record, given as a JSON object, to a stream.

    \b
    Example:
      streamkit send shop:orders \\
        '{"order_id": 1, "customer": "ada", "amount": 9.5, "created_at": "2026-01-01T00:00:00Z"}'
    """
    app, stream = load_stream(stream_path, redis_url, sending=True)
    try:
        record = parse_record(stream, record_json)
    except ValueError as exc:
        fail(f"invalid record: {exc}", 2)
    try:
        async with app:
            [entry_id] = await stream.send(record)
    except StreamkitError as exc:
        # (a stream used with settings other than those recorded: configuration, 2)
        fail(
            f"{with_stream_path(exc, stream_path)}\nnothing was sent",
            2 if isinstance(exc, MetadataMismatch) else 1,
        )
    click.echo(
        f"sent to {app.name}.{stream.name} partition {stream.partition_of(record)}: {entry_id}"
    )


@click.command()
@click.argument("stream_path", metavar="MODULE:STREAM")
@click.argument("source", type=click.File("rb"), metavar="FILE")
@redis_url_option
@click.option(
    "--chunk-size", type=click.IntRange(min=1), default=None, help="Records per round trip."
)
@click.option(
    "--skip",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="Skip the first N lines of FILE (sent by an earlier, interrupted sendmany).",
)
@click.option(
    "--skip-sent",
    "skip_sent",
    metavar="PARTITION:LINE,...",
    help="Also skip each listed partition's lines up to LINE (as an interrupted "
    "sendmany's message says).",
)
async def sendmany(
    stream_path: str,
    source: IO[bytes],
    redis_url: str | None,
    chunk_size: int | None,
    skip: int,
    skip_sent: str | None,
) -> None:
    """Send many records from a JSON Lines FILE ('-' for standard input).

    Every line is checked before anything is sent (JSON, the record's fields, its
    partition key): if any line is bad, the errors are listed with their line
    numbers and nothing is sent. Blank lines are skipped.

    If sending stops early (a Redis error, Ctrl-C, SIGTERM), the message says exactly
    which lines are in Redis and gives the command that sends the rest without
    duplicates (with --skip and --skip-sent). A first Ctrl-C lets the records in
    flight finish; a second one stops at once.
    """
    app, stream = load_stream(stream_path, redis_url, sending=True)
    try:
        marks = parse_marks(skip_sent, stream.partition_count)
    except ValueError as exc:
        fail(f"--skip-sent: {exc}", 2)
    try:
        lines, errors, already = check_lines(
            stream, source, lambda text: parse_record(stream, text), skip=skip, marks=marks
        )
    except KeyboardInterrupt:
        fail("interrupted while checking the input; nothing was sent", 130)
    if errors:
        shown = "\n".join(errors[:MAX_REPORTED_ERRORS])
        more = len(errors) - MAX_REPORTED_ERRORS
        if more > 0:
            shown += f"\n... and {more} more bad lines"
        fail(f"{len(errors)} bad line(s), nothing was sent:\n{shown}", 2)
    if not lines:
        click.echo("no records to send" + (f" ({already} already sent)" if already else ""))
        return

    outcome = SendOutcome(lines, skip, dict(marks))
    chunk = chunk_size if chunk_size is not None else stream.settings.send_chunk_size
    with progress_bar("sending") as progress:
        task = progress.add_task("send", total=len(lines))

        def on_sent(n: int) -> None:
            progress.update(task, advance=n)

        on_signal = stopping_notice(progress, "once the records in flight are sent")

        try:
            async with app:
                await send_lines(
                    stream, outcome, chunk_size=chunk, on_sent=on_sent, on_signal=on_signal
                )
        except StreamkitError as exc:
            outcome.error = outcome.error or exc
        except KeyboardInterrupt:
            outcome.signal = signal.SIGINT
    if outcome.complete and outcome.error is None:
        click.echo(f"sent {len(lines):,} records to {app.name}.{stream.name}")
        return
    report = outcome.report(resume_command(stream_path, source.name, redis_url, chunk_size))
    if outcome.error is not None:
        fail(f"{with_stream_path(outcome.error, stream_path)}\n{report}")
    signum = outcome.signal or signal.SIGINT
    how = "at once, by a second signal" if outcome.hard_stopped else "after the records in flight"
    fail(f"stopped by {signal.Signals(signum).name} {how}\n{report}", 128 + signum)


#: Characters of a bad line shown in its error.
EXCERPT_WIDTH = 60


def excerpt(text: str, position: int, width: int = EXCERPT_WIDTH) -> str:
    """``text`` around ``position``, cut to ``width`` characters (``…`` where cut),
    escaped: a bad line shown in one line of an error."""
    start = max(0, min(position - width // 2, len(text) - width))
    shown = text[start : start + width]
    return f"{'…' if start else ''}{printable(shown)}{'…' if start + width < len(text) else ''}"


def parse_record(stream: Stream[Any], text: str | bytes) -> Any:
    """Parse one JSON object into the stream's record type.

    Error handling:
        ``ValueError`` with a short description of what is wrong.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    text = text.rstrip("\r\n")
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        # orjson's own message counts lines and characters of what it was given: one
        # line here, whose number the caller says. Show the text where it went wrong.
        raise ValueError(
            f"invalid JSON ({exc.msg} at column {exc.pos + 1}): {excerpt(text, exc.pos)}"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    try:
        return stream.codec.from_dict(data)
    except EncodeError as exc:
        raise ValueError(str(exc)) from None
