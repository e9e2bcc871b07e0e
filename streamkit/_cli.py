"""The ``streamkit`` command line."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import IO, TYPE_CHECKING, Any, NoReturn

import asyncclick as click
import attrs
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ._admin import (
    PartitionStatus,
    live_members,
    processor_status,
    reset_positions,
    resume_partitions,
)
from ._app import App
from ._deadletters import list_dead_letters, purge_dead_letters, replay_dead_letters
from ._errors import ConfigError, EncodeError, StreamkitError
from ._streams import Stream
from ._worker import run_worker, select_processors

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._app import Processor

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
    app = app_of(path, stream)
    if redis_url is not None:
        app.settings = attrs.evolve(app.settings, redis_url=redis_url)
    return app, stream


def app_of(path: str, stream: Stream[Any]) -> App:
    """The app that declared ``stream``, found beside it in its module."""
    module = sys.modules[path.partition(":")[0]]
    for candidate in vars(module).values():
        if isinstance(candidate, App) and candidate.streams.get(stream.name) is stream:
            return candidate
    fail(f"{path}: the app that declared this stream is not in its module", 2)


def load_app(path: str, redis_url: str | None) -> App:
    app = load_object(path)
    if not isinstance(app, App):
        fail(f"{path} is a {type(app).__name__}, not a streamkit App", 2)
    if redis_url is not None:
        app.settings = attrs.evolve(app.settings, redis_url=redis_url)
    return app


def load_processor(app: App, name: str) -> Processor:
    try:
        [processor] = select_processors(app, [name])
    except ConfigError as exc:
        fail(str(exc), 2)
    return processor


def confirm(question: str, *, refused: str) -> None:
    """Ask ``question``; unless the answer is yes (no input counts as no), fail."""
    try:
        if click.confirm(question, default=False, err=True):
            return
    except click.Abort:
        click.echo(err=True)
    fail(refused)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # streamkit's Redis layer reports what an operator should see about connections
    # itself, once and with the URL masked (streamkit.redis: a connection lost, and
    # re-established). coredis's own records would repeat those, or describe its
    # internals (script reloads, optimistic transaction conflicts); it retries
    # nothing, so none of them hides a command sent twice.
    logging.getLogger("coredis").setLevel(logging.CRITICAL)


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


@cli.command()
@click.argument("app_path", metavar="MODULE:APP")
@click.option(
    "--processors",
    "-p",
    metavar="NAMES",
    help="Comma-separated processors to run (default: all of the app's).",
)
@redis_url_option
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
async def worker(
    app_path: str, processors: str | None, redis_url: str | None, log_level: str
) -> None:
    """Run an app's processors and background tasks.

    Start as many workers as you like, on one machine or many: the partitions of
    each stream are spread over them and move when workers join, leave or die.
    SIGINT or SIGTERM stops a worker gracefully (current events finish and are
    acknowledged, leases are released); a second signal exits at once.
    """
    configure_logging(log_level)
    app = load_app(app_path, redis_url)
    names = [n.strip() for n in processors.split(",") if n.strip()] if processors else None
    try:
        select_processors(app, names)
    except ConfigError as exc:
        fail(str(exc), 2)
    try:
        await run_worker(app, processors=names, handle_signals=True)
    except StreamkitError as exc:
        fail(str(exc))


@cli.command()
@click.argument("app_path", metavar="MODULE:APP")
@redis_url_option
async def status(app_path: str, redis_url: str | None) -> None:
    """Show each processor's partitions: owner, lag, pending entries, last event."""
    app = load_app(app_path, redis_url)
    if not app.processors:
        click.echo(f"app {app.name} has no processors")
        return
    console = Console()
    try:
        async with app:
            for processor in app.processors.values():
                rows = await processor_status(app, processor)
                console.print(status_table(app, processor, rows))
                print_halted(console, app_path, processor, rows)
    except StreamkitError as exc:
        fail(str(exc))


def print_halted(
    console: Console, app_path: str, processor: Processor, rows: list[PartitionStatus]
) -> None:
    """One entry per partition the processor is halted on, with the command to resume."""
    for row in rows:
        if row.halted is not None:
            console.print(
                f"[bold red]partition {row.partition} halted[/]: "
                f"{row.halted.describe().removeprefix('halted ')}",
                markup=True,
                highlight=False,
                soft_wrap=True,
            )
            console.print(
                f"  fix the cause, then: streamkit resume {app_path} {processor.name} "
                f"--partition {row.partition}   (--skip: skip the halted event)",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


def status_table(app: App, processor: Processor, rows: list[PartitionStatus]) -> Table:
    table = Table(
        title=f"{app.name}: processor {processor.name} on stream {processor.stream.name}",
        title_justify="left",
    )
    for column in ("partition", "assigned to", "lease held by", "entries", "lag", "pending"):
        table.add_column(
            column,
            justify="right" if column in ("partition", "entries", "lag", "pending") else "left",
        )
    table.add_column("last event")
    for row in rows:
        table.add_row(
            str(row.partition),
            row.assigned_to or "-",
            row.owner or "-",
            f"{row.length:,}",
            "?" if row.lag is None else f"{row.lag:,}",
            f"{row.pending:,}",
            row.last_event_at.isoformat(timespec="seconds") if row.last_event_at else "-",
        )
    return table


@cli.command()
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option(
    "--to",
    type=click.Choice(["start", "end"]),
    required=True,
    help="start: process every retained event again; end: skip all events sent so far.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help="Reset even while workers run the processor.")
@redis_url_option
async def reset(
    app_path: str, processor_name: str, to: str, yes: bool, force: bool, redis_url: str | None
) -> None:
    """Move a processor to the start or the end of its stream.

    Pending (delivered, unacknowledged) entries are forgotten. Stop the processor's
    workers first: a reset under running workers is refused unless --force.
    """
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    try:
        async with app:
            alive = await live_members(app, processor)
            if alive and not force:
                fail(
                    f"{len(alive)} worker(s) run {processor.name} right now "
                    f"({', '.join(alive)}); stop them first, or pass --force"
                )
            question = (
                f"Reset {processor.name} of {app.name} to the {to} of "
                f"{processor.stream.name} ({processor.stream.partition_count} partitions)?"
            )
            if not yes:
                confirm(question, refused="nothing was reset")
            await reset_positions(app, processor, to="start" if to == "start" else "end")
    except StreamkitError as exc:
        fail(str(exc))
    click.echo(f"{processor.name} now reads {processor.stream.name} from the {to}")


@cli.command()
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="A halted partition to resume (repeatable; default: every halted one).",
)
@click.option(
    "--skip",
    is_flag=True,
    help="Acknowledge the halted events without processing them, then go on.",
)
@redis_url_option
async def resume(
    app_path: str,
    processor_name: str,
    partitions: tuple[int, ...],
    skip: bool,
    redis_url: str | None,
) -> None:
    """Resume a processor on partitions where its exception policy halted.

    The worker owning each partition processes the halted event again (or, with
    --skip, the events after it) within a second. `streamkit status` lists the
    halted partitions and their errors.
    """
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    try:
        async with app:
            cleared = await resume_partitions(
                app, processor, partitions=list(partitions) or None, skip=skip
            )
    except ConfigError as exc:
        fail(str(exc), 2)
    except StreamkitError as exc:
        fail(str(exc))
    missing = sorted(set(partitions) - set(cleared))
    for partition, record in sorted(cleared.items()):
        skipped = ""
        if skip and record.entry_ids:
            skipped = f", skipping {', '.join(record.entry_ids)}"
        click.echo(f"resumed {processor.name} on partition {partition}{skipped}")
    if missing:
        fail(
            f"{processor.name} is not halted on partition "
            f"{', '.join(map(str, missing))} (see `streamkit status {app_path}`)"
        )
    if not cleared:
        fail(f"{processor.name} is not halted on any partition; nothing to resume")


@cli.group()
def deadletters() -> None:
    """List, replay and purge a processor's dead letters."""


@deadletters.command("list")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@redis_url_option
async def deadletters_list(
    app_path: str, processor_name: str, limit: int, redis_url: str | None
) -> None:
    """Show a processor's dead letters, oldest first."""
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    try:
        async with app:
            letters = await list_dead_letters(app.redis, processor.keys, count=limit)
    except StreamkitError as exc:
        fail(str(exc))
    if not letters:
        click.echo(f"{processor.name} has no dead letters")
        return
    table = Table(title=f"dead letters of {app.name}: {processor.name}", title_justify="left")
    for column in ("id", "failed at", "reason", "error", "partition", "entry id", "deliveries"):
        table.add_column(column)
    for letter in letters:
        error = f"{letter.error_type}: {letter.error}" if letter.error_type else letter.error
        table.add_row(
            letter.id,
            letter.failed_at.isoformat(timespec="seconds"),
            letter.reason,
            error,
            str(letter.partition),
            letter.entry_id,
            str(letter.delivery_count),
        )
    Console(width=200).print(table)


DeadLetterAction = Callable[["App", "Processor", "Sequence[str] | None"], Awaitable[int]]


async def replay_letters(app: App, processor: Processor, ids: Sequence[str] | None) -> int:
    settings = processor.stream.settings
    return await replay_dead_letters(
        app.redis,
        processor.stream.spec,
        processor.keys,
        partition_size=settings.partition_size,
        max_len=settings.max_len,
        ids=ids,
    )


async def purge_letters(app: App, processor: Processor, ids: Sequence[str] | None) -> int:
    return await purge_dead_letters(app.redis, processor.keys, ids=ids)


async def act_on_dead_letters(
    action: DeadLetterAction,
    *,
    ask: str,
    done: str,
    app_path: str,
    processor_name: str,
    ids: tuple[str, ...],
    yes: bool,
    redis_url: str | None,
) -> None:
    """Confirm, then apply ``action`` (replay or purge) to the chosen dead letters."""
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    which = f"{len(ids)} dead letter(s)" if ids else "all dead letters"
    if not yes:
        confirm(f"{ask} {which} of {processor.name}?", refused=f"nothing was {done}")
    try:
        async with app:
            count = await action(app, processor, ids or None)
    except StreamkitError as exc:
        fail(str(exc))
    click.echo(f"{done} {count} dead letter(s) of {processor.name}")


@deadletters.command("replay")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option("--id", "ids", multiple=True, metavar="ID", help="Replay only these (repeatable).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@redis_url_option
async def deadletters_replay(
    app_path: str, processor_name: str, ids: tuple[str, ...], yes: bool, redis_url: str | None
) -> None:
    """Send dead letters back to their partitions for processing again."""
    await act_on_dead_letters(
        replay_letters,
        ask="Replay",
        done="replayed",
        app_path=app_path,
        processor_name=processor_name,
        ids=ids,
        yes=yes,
        redis_url=redis_url,
    )


@deadletters.command("purge")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option("--id", "ids", multiple=True, metavar="ID", help="Purge only these (repeatable).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@redis_url_option
async def deadletters_purge(
    app_path: str, processor_name: str, ids: tuple[str, ...], yes: bool, redis_url: str | None
) -> None:
    """Delete dead letters for good."""
    await act_on_dead_letters(
        purge_letters,
        ask="Delete",
        done="purged",
        app_path=app_path,
        processor_name=processor_name,
        ids=ids,
        yes=yes,
        redis_url=redis_url,
    )


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
