"""The ``streamkit`` command line."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, NoReturn

import asyncclick as click
import attrs
import orjson
import trio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ._admin import (
    MemberStatus,
    PartitionStatus,
    delete_stream_keys,
    lease_owner_name,
    live_members,
    member_statuses,
    processor_status,
    reset_positions,
    resume_partitions,
)
from ._app import App
from ._deadletters import (
    count_dead_letters,
    list_dead_letters,
    parse_dead_letter_id,
    purge_dead_letters,
    replay_dead_letters,
)
from ._errors import ConfigError, EncodeError, MetadataMismatch, StreamkitError
from ._groups import leaves
from ._sendmany import SendOutcome, check_lines, parse_marks, resume_command, send_lines
from ._streams import Stream
from ._urls import mask_url
from ._worker import Worker, run_worker, select_processors

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._app import Processor

__all__ = ["cli", "main"]

log = logging.getLogger("streamkit.cli")

MAX_REPORTED_ERRORS = 20

stderr = Console(stderr=True)


class CommandError(click.ClickException):
    """A failure the user can act on: printed without a traceback, exit code 1."""

    exit_code = 1


class BadInput(CommandError):
    """The command was given something unusable (a path, a record): exit code 2."""

    exit_code = 2


class Stopped(CommandError):
    """Stopped by a signal: exit code 128 + the signal's number, as a shell expects."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum  # type: ignore[misc]


def fail(message: str, exit_code: int = 1) -> NoReturn:
    if exit_code > 128:
        raise Stopped(message, exit_code - 128)
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
    except ModuleNotFoundError as exc:
        if exc.name is not None and _is_parent_or_same(exc.name, module_name):
            fail(f"cannot import {module_name!r}: {exc}", 2)
        fail(import_failure(module_name, exc), 2)
    except StreamkitError as exc:
        where = user_frame(exc)
        fail(f"importing {module_name!r} failed{where}: {exc}", 2)
    except Exception as exc:
        fail(import_failure(module_name, exc), 2)
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            fail(f"{module_name!r} has no attribute {attribute!r}", 2)
    return target


def _is_parent_or_same(missing: str, module_name: str) -> bool:
    """Whether the module that was not found is ``module_name`` or one of its packages."""
    return module_name == missing or module_name.startswith(missing + ".")


def _user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback outside importlib and this module."""
    frames = traceback.extract_tb(exc.__traceback__)
    return [
        frame
        for frame in frames
        if "importlib" not in frame.filename and frame.filename != __file__
    ]


def user_frame(exc: BaseException) -> str:
    """Where the user's code raised ``exc``: " at FILE line N", or "" if unknown."""
    here = os.path.dirname(__file__)
    frames = [f for f in _user_frames(exc) if not f.filename.startswith(here + os.sep)]
    if not frames:
        return ""
    return f" at {os.path.relpath(frames[-1].filename)} line {frames[-1].lineno}"


def import_failure(module_name: str, exc: BaseException) -> str:
    """A one-line header, then the user's own traceback (without streamkit's frames)."""
    lines = traceback.format_list(_user_frames(exc))
    lines += traceback.format_exception_only(type(exc), exc)
    body = "".join(["Traceback (most recent call last):\n", *lines]).rstrip()
    return f"module {module_name!r} failed to import; its traceback:\n{body}"


def with_stream_path(exc: BaseException, path: str) -> str:
    """``exc``'s message, with the stream's real MODULE:STREAM in a delete-stream hint.

    ``path`` is the stream's own path, or the path of anything in its module (an app).
    """
    message = str(exc)
    if not isinstance(exc, MetadataMismatch) or "MODULE:STREAM" not in message:
        return message
    module_name = path.partition(":")[0]
    module = sys.modules.get(module_name)
    for name, value in vars(module).items() if module is not None else ():
        if isinstance(value, Stream) and value.name == exc.stream:
            return message.replace("MODULE:STREAM", f"{module_name}:{name}")
    return message


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
    # No envvar here: STREAMKIT_REDIS_URL is read by the app's Settings, below the
    # App's own keyword arguments. Reading it here too would let the environment
    # override App(redis_url=...), unlike everywhere else.
    return click.option(
        "--redis-url",
        metavar="URL",
        help=(
            "Redis to use, overriding the app's redis_url (which comes from "
            "App(redis_url=...), else STREAMKIT_REDIS_URL, else redis://127.0.0.1:6379)."
        ),
    )(function)


class WholeHelpGroup(click.Group):
    """A group whose command list shows each command's whole first sentence."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            rows.append((name, command.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=WholeHelpGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streamkit")
def cli() -> None:
    """streamkit: partitioned, ordered event processing on Redis Streams.

    Streams and apps are named as MODULE:NAME, e.g. shop:orders (stream orders of shop.py),
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
      streamkit send shop:orders \\
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
        fail(f"{with_stream_path(exc, stream_path)}\nnothing was sent")
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
    app, stream = load_stream(stream_path, redis_url)
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
    with Progress(
        TextColumn("sending"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    ) as progress:
        task = progress.add_task("send", total=len(lines))

        def on_sent(n: int) -> None:
            progress.update(task, advance=n)

        def on_signal(signum: int) -> None:
            progress.console.print(
                f"{signal.Signals(signum).name}: stopping once the records in flight are "
                f"sent (a second signal stops at once)",
                highlight=False,
                soft_wrap=True,
            )

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
    help="Least severe log messages to show (on standard error).",
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
    names = processor_names(app, processors)
    try:
        select_processors(app, names)
    except ConfigError as exc:
        fail(str(exc), 2)
    log.info("using Redis at %s", mask_url(app.settings.redis_url))
    status = _WorkerStarted()
    try:
        await run_worker(app, processors=names, handle_signals=True, task_status=status)
    except StreamkitError as exc:
        fail(with_stream_path(exc, app_path))
    except BaseExceptionGroup as group:
        found = leaves(group)
        if found and all(isinstance(leaf, StreamkitError) for leaf in found):
            fail(with_stream_path(found[0], app_path))
        raise
    # Exit status 0 only for a stop that was asked for (a signal, Worker.stop): a
    # worker that ended on its own must be restarted by its supervisor.
    if status.worker is not None and not status.worker._stopping:
        fail(f"worker of {app.name} stopped without being asked to; see the log above")


class _WorkerStarted(trio.TaskStatus[Worker]):
    """Keeps the running worker, to tell a requested stop from any other end."""

    worker: Worker | None = None

    def started(self, value: Worker | None = None) -> None:
        self.worker = value


def processor_names(app: App, given: str | None) -> list[str] | None:
    """The names given to ``--processors``, or ``None`` (all) if it was not given."""
    if given is None:
        return None
    names = [name.strip() for name in given.split(",")]
    if not all(names):
        known = ", ".join(app.processors) or "none"
        fail(
            f"--processors: {given!r} has an empty processor name; give comma-separated "
            f"names (known: {known}), or leave the option out to run them all",
            2,
        )
    return names


@cli.command()
@click.argument("app_path", metavar="MODULE:APP")
@redis_url_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
async def status(app_path: str, redis_url: str | None, as_json: bool) -> None:
    """Show each processor's workers and partitions: who, lag, pending, last event.

    A worker is named host:pid, plus its member id if it is a static member. The
    table fits the terminal; --json prints everything, for scripts.
    """
    app = load_app(app_path, redis_url)
    url = mask_url(app.settings.redis_url)
    report: list[tuple[Processor, list[MemberStatus], list[PartitionStatus]]] = []
    try:
        async with app:
            for processor in app.processors.values():
                members = await member_statuses(app, processor)
                rows = await processor_status(app, processor)
                report.append((processor, members, rows))
    except StreamkitError as exc:
        fail(str(exc))
    if as_json:
        click.echo(orjson.dumps(status_json(app, url, report), option=orjson.OPT_INDENT_2))
        return
    console = Console(highlight=False)
    console.print(f"app {app.name}, Redis at {url}", soft_wrap=True)
    if not report:
        console.print(f"app {app.name} has no processors")
    now = datetime.now(UTC)
    for processor, members, rows in report:
        console.print()
        console.print(members_table(processor, members, now))
        console.print(status_table(processor, members, rows, now))
        print_halted(console, app_path, processor, rows)


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


def worker_names(members: list[MemberStatus]) -> dict[str, str]:
    """Member id, and lease owner ``host:pid``, -> the name shown for that worker."""
    names = {m.id: m.name for m in members}
    names.update({f"{m.host}:{m.pid}": m.name for m in members if m.host})
    return names


def partition_worker(row: PartitionStatus, names: dict[str, str]) -> str:
    """Who processes a partition: the lease holder, and where it moves if it does."""
    holder = (
        names.get(lease_owner_name(row.owner), lease_owner_name(row.owner)) if row.owner else None
    )
    assigned = names.get(row.assigned_to, row.assigned_to) if row.assigned_to else None
    if holder and assigned and holder != assigned:
        return f"{holder} → {assigned}"
    if holder:
        return holder
    if assigned:
        return f"waits for {assigned}"
    return "-"


def ago(moment: datetime | None, now: datetime) -> str:
    """``5s ago``, ``3m ago``, ``2h ago``, ``4d ago``: short enough for a narrow table."""
    if moment is None:
        return "-"
    seconds = max(0, int((now - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def members_table(processor: Processor, members: list[MemberStatus], now: datetime) -> Table:
    table = Table(
        title=f"processor {processor.name} (stream {processor.stream.name}): workers",
        title_justify="left",
    )
    table.add_column("worker", overflow="fold", ratio=3)
    table.add_column("state", overflow="fold", ratio=2)
    table.add_column("joined", no_wrap=True)
    for m in members:
        if m.alive:
            state = "alive"
        elif m.static:
            state = "dead (static: its partitions wait for it)"
        else:
            state = "dead (not reaped yet)"
        table.add_row(m.name, state, ago(m.joined_at, now))
    if not members:
        table.add_row("-", "no worker has run it", "-")
    return table


def status_table(
    processor: Processor, members: list[MemberStatus], rows: list[PartitionStatus], now: datetime
) -> Table:
    names = worker_names(members)
    table = Table(
        title=f"processor {processor.name} (stream {processor.stream.name}): partitions",
        title_justify="left",
    )
    table.add_column("partition", justify="right", no_wrap=True)
    table.add_column("worker", overflow="fold", ratio=1)
    for column in ("entries", "lag", "pending"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("last event", no_wrap=True)
    for row in rows:
        table.add_row(
            str(row.partition),
            partition_worker(row, names),
            f"{row.length:,}",
            "?" if row.lag is None else f"{row.lag:,}",
            f"{row.pending:,}",
            ago(row.last_event_at, now),
        )
    return table


def status_json(
    app: App,
    url: str,
    report: list[tuple[Processor, list[MemberStatus], list[PartitionStatus]]],
) -> dict[str, Any]:
    processors = []
    for processor, members, rows in report:
        names = worker_names(members)
        processors.append(
            {
                "processor": processor.name,
                "stream": processor.stream.name,
                "workers": [{**attrs.asdict(m), "joined_at": iso(m.joined_at)} for m in members],
                "partitions": [
                    {
                        "partition": row.partition,
                        "worker": names.get(lease_owner_name(row.owner)) if row.owner else None,
                        "lease_owner": row.owner,
                        "assigned_to": names.get(row.assigned_to) if row.assigned_to else None,
                        "assigned_member_id": row.assigned_to,
                        "entries": row.length,
                        "lag": row.lag,
                        "pending": row.pending,
                        "last_event_at": iso(row.last_event_at),
                        "halted": None
                        if row.halted is None
                        else {
                            "error_type": row.halted.error_type,
                            "error": row.halted.error,
                            "entry_ids": list(row.halted.entry_ids),
                            "since": iso(row.halted.since),
                            "worker": row.halted.worker,
                        },
                    }
                    for row in rows
                ],
            }
        )
    return {"app": app.name, "redis_url": url, "processors": processors}


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment is not None else None


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


@cli.command("delete-stream")
@click.argument("stream_path", metavar="MODULE:STREAM")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help="Delete even while workers run its processors.")
@redis_url_option
async def delete_stream(stream_path: str, yes: bool, force: bool, redis_url: str | None) -> None:
    """Delete a stream's events, metadata and processors' membership, to recreate it.

    For a stream created with other settings (partition count, record type, partition
    key) than the code now uses. Only this stream's keys are deleted; its processors'
    dead letters are kept. Stop its workers first.
    """
    app, stream = load_stream(stream_path, redis_url)
    processors = [p for p in app.processors.values() if p.stream is stream]
    try:
        async with app:
            for processor in processors:
                alive = await live_members(app, processor)
                if alive and not force:
                    fail(
                        f"{len(alive)} worker(s) run {processor.name} on {stream.name} right "
                        f"now; stop them first, or pass --force; nothing was deleted"
                    )
            if not yes:
                confirm(
                    f"Delete all events of {app.name}.{stream.name} "
                    f"({stream.partition_count} partitions) and its recorded settings?",
                    refused="nothing was deleted",
                )
            deleted = await delete_stream_keys(app, stream, processors)
    except StreamkitError as exc:
        fail(str(exc))
    click.echo(f"deleted {app.name}.{stream.name} ({deleted:,} event(s))")


@cli.group(cls=WholeHelpGroup)
def deadletters() -> None:
    """List, replay and purge a processor's dead letters."""


@deadletters.command("list")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Show at most this many dead letters (the oldest); says how many more exist.",
)
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
            total = await count_dead_letters(app.redis, processor.keys)
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
    if total > len(letters):
        click.echo(
            f"showing the oldest {len(letters):,} of {total:,} dead letters; "
            f"pass --limit {total} to see them all"
        )


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
    """Confirm, then apply ``action`` (replay or purge) to the chosen dead letters.

    Given ids are checked first, in form and then in Redis: if any is not a dead
    letter of the processor, nothing is done (exit code 2).
    """
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    wanted: list[str] = []
    for given in ids:
        parsed = parse_dead_letter_id(given)
        if parsed is None:
            fail(
                f"--id {given!r} is not a dead letter id (ids look like 1767225600000-0; "
                f"`streamkit deadletters list {app_path} {processor.name}` shows them); "
                f"nothing was {done}",
                2,
            )
        if parsed not in wanted:
            wanted.append(parsed)
    which = f"{len(wanted)} dead letter(s)" if wanted else "all dead letters"
    try:
        async with app:
            if wanted:
                existing = {
                    letter.id for letter in await list_dead_letters(app.redis, processor.keys)
                }
                missing = [i for i in wanted if i not in existing]
                if missing:
                    fail(
                        f"{processor.name} has no dead letter {', '.join(missing)} "
                        f"(`streamkit deadletters list {app_path} {processor.name}` shows "
                        f"those it has); nothing was {done}",
                        2,
                    )
            if not yes:
                confirm(f"{ask} {which} of {processor.name}?", refused=f"nothing was {done}")
            count = await action(app, processor, wanted or None)
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
