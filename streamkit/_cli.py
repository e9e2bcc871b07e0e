"""The ``streamkit`` command line."""

from __future__ import annotations

import importlib
import os
import sys
from typing import IO, TYPE_CHECKING, Any, NoReturn

import asyncclick as click
import attrs
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ._errors import EncodeError, StreamkitError
from ._streams import Stream

if TYPE_CHECKING:
    from ._app import App

__all__ = ["cli", "main"]

MAX_REPORTED_ERRORS = 20

stderr = Console(stderr=True)


class CommandError(click.ClickException):
    """A failure the user can act on: printed without a traceback, exit code 1."""

    exit_code = 1


class BadInput(CommandError):
    """The command was given something unusable (a path, a record): exit code 2."""

    exit_code = 2


def fail(message: str, exit_code: int = 1) -> NoReturn:
    raise (BadInput if exit_code == 2 else CommandError)(message)


def load_object(path: str) -> Any:
    """Import ``module:attribute`` (``attribute`` may be dotted) and return it."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        fail(f"expected MODULE:NAME (for example myapp.streams:orders), got {path!r}", 2)
    # Like `python -m`, look in the working directory first.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"cannot import {module_name!r}: {exc}", 2)
    except StreamkitError as exc:
        fail(f"importing {module_name!r} failed: {exc}", 2)
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            fail(f"{module_name!r} has no attribute {attribute!r}", 2)
    return target


def load_stream(path: str, redis_url: str | None) -> tuple[App, Stream[Any]]:
    stream = load_object(path)
    if not isinstance(stream, Stream):
        fail(f"{path} is a {type(stream).__name__}, not a stream made by app.stream(...)", 2)
    app = stream.app
    if redis_url is not None:
        app.settings = attrs.evolve(app.settings, redis_url=redis_url)
    return app, stream


def redis_url_option(function: Any) -> Any:
    return click.option(
        "--redis-url",
        envvar="STREAMKIT_REDIS_URL",
        help="Redis to use, instead of the app's redis_url. [env: STREAMKIT_REDIS_URL]",
    )(function)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streamkit")
def cli() -> None:
    """streamkit: partitioned, ordered event processing on Redis Streams.

    Streams and apps are named as MODULE:NAME, e.g. examples.orders.app:orders,
    importable from the current directory.
    """


@cli.command()
@click.argument("stream_path", metavar="MODULE:STREAM")
@click.argument("record_json", metavar="JSON")
@redis_url_option
async def send(stream_path: str, record_json: str, redis_url: str | None) -> None:
    """Send one record, given as a JSON object, to a stream.

    \b
    Example:
      streamkit send examples.orders.app:orders \\
        '{"order_id": 1, "customer": "ada", "amount": 9.5, "created_at": "2026-01-01T00:00:00Z"}'
    """
    app, stream = load_stream(stream_path, redis_url)
    try:
        record = parse_record(stream, record_json)
    except ValueError as exc:
        fail(f"invalid record: {exc}", 2)
    try:
        async with app:
            [entry_id] = await stream.send(record)
    except StreamkitError as exc:
        fail(f"{exc}\nnothing was sent")
    click.echo(
        f"sent to {app.name}.{stream.name} partition {stream.partition_of(record)}: {entry_id}"
    )


@cli.command()
@click.argument("stream_path", metavar="MODULE:STREAM")
@click.argument("source", type=click.File("rb"), metavar="FILE")
@redis_url_option
@click.option(
    "--chunk-size", type=click.IntRange(min=1), default=None, help="Records per round trip."
)
async def sendmany(
    stream_path: str, source: IO[bytes], redis_url: str | None, chunk_size: int | None
) -> None:
    """Send many records from a JSON Lines FILE ('-' for standard input).

    Every line is checked before anything is sent: if any line is bad, the errors
    are listed with their line numbers and nothing is sent. Blank lines are skipped.
    """
    app, stream = load_stream(stream_path, redis_url)
    records: list[Any] = []
    line_numbers: list[int] = []
    errors: list[str] = []
    for number, line in enumerate(source, start=1):
        if not line.strip():
            continue
        try:
            records.append(parse_record(stream, line))
            line_numbers.append(number)
        except ValueError as exc:
            errors.append(f"line {number}: {exc}")
    if errors:
        shown = "\n".join(errors[:MAX_REPORTED_ERRORS])
        more = len(errors) - MAX_REPORTED_ERRORS
        if more > 0:
            shown += f"\n... and {more} more bad lines"
        fail(f"{len(errors)} bad line(s), nothing was sent:\n{shown}", 2)
    if not records:
        click.echo("no records to send")
        return

    sent = 0
    with Progress(
        TextColumn("sending"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    ) as progress:
        task = progress.add_task("send", total=len(records))

        def on_sent(n: int) -> None:
            nonlocal sent
            sent += n
            progress.update(task, completed=sent)

        try:
            async with app:
                await stream.send_many(records, chunk_size=chunk_size, on_sent=on_sent)
        except StreamkitError as exc:
            fail(f"{exc}\n{describe_partial_send(line_numbers, sent, len(records))}")
    click.echo(f"sent {len(records)} records to {app.name}.{stream.name}")


def describe_partial_send(line_numbers: list[int], sent: int, total: int) -> str:
    if sent == 0:
        return "nothing was sent"
    # send_many sends whole windows in order; the failing window may be partly sent.
    return (
        f"sent {sent} of {total} records (lines {line_numbers[0]}-{line_numbers[sent - 1]}); "
        f"records from line {line_numbers[sent]} on may not have been sent"
    )


def parse_record(stream: Stream[Any], text: str | bytes) -> Any:
    """Parse one JSON object into the stream's record type.

    Error handling:
        ``ValueError`` with a short description of what is wrong.
    """
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    try:
        return stream.codec.from_dict(data)
    except EncodeError as exc:
        raise ValueError(str(exc)) from None


def main() -> None:
    """Entry point of the ``streamkit`` console script."""
    cli(_anyio_backend="trio")
