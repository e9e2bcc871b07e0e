"""The ``streamkit`` command line."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, Literal, NoReturn

import asyncclick as click
import attrs
import orjson
import trio
from asyncclick.core import ParameterSource
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from . import _logs
from ._admin import (
    delete_stream_keys,
    live_members,
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
from ._fleet import (
    NO_RATES,
    counts_by_name,
    counts_json,
    fleet_json,
    job_history,
    job_json,
    take_snapshot,
)
from ._fleet_view import ago, jobs_table, jobs_title, members_table, status_table
from ._groups import leaves
from ._keys import validate_name
from ._redis import open_redis
from ._sendmany import SendOutcome, check_lines, parse_marks, resume_command, send_lines
from ._settings import Settings
from ._streams import Stream
from ._supervisor import WORKER_INDEX_VARIABLE, check_member_ids, run_supervisor
from ._urls import mask_url
from ._worker import Worker, run_worker, select_processors
from .jobs import JobNotFound, JobQueue, JobStatus, open_job_queue

if TYPE_CHECKING:
    import types
    from collections.abc import AsyncIterator, Mapping, Sequence

    from ._app import Processor
    from ._fleet import ProcessorSnapshot
    from ._logs import LogFormat
    from .jobs import JobInfo, QueueCounts

__all__ = ["cli", "main"]

log = logging.getLogger("streamkit.cli")

MAX_REPORTED_ERRORS = 20

stderr = Console(stderr=True)


class CommandError(click.ClickException):
    """A failure the user can act on: printed without a traceback, exit code 1."""

    exit_code = 1

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
@logging_options
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    default=None,
    help="Jobs run at once by this worker process (default: the job_concurrency setting, 32).",
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="Run N worker processes under a supervisor that restarts those that die.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    metavar="PORT",
    help=(
        "Serve Prometheus metrics over HTTP on PORT (default: the metrics_port setting, "
        "unset). With --processes N, worker i serves on PORT + i. Needs streamkit[metrics]."
    ),
)
@click.option(
    "--metrics-host",
    metavar="HOST",
    default=None,
    help="Address of the metrics endpoint (default: the metrics_host setting, 127.0.0.1).",
)
async def worker(
    app_path: str,
    processors: str | None,
    redis_url: str | None,
    log_level: str,
    log_format: LogFormat,
    concurrency: int | None,
    processes: int,
    metrics_port: int | None,
    metrics_host: str | None,
) -> None:
    """Run an app's processors, jobs and background tasks.

    Start as many workers as you like, on one machine or many: the partitions of
    each stream are spread over them and move when workers join, leave or die.
    SIGINT or SIGTERM stops a worker gracefully (current events finish and are
    acknowledged, leases are released); a second signal exits at once.

    With --processes N, this process supervises N worker processes: it restarts
    those that die and passes signals on to them.
    """
    configure_logging(log_level, log_format)
    app = load_app(app_path, redis_url)
    names = processor_names(app, processors)
    try:
        select_processors(app, names)
    except ConfigError as exc:
        fail(str(exc), 2)
    if processes > 1:
        await supervise_workers(app, names, processes)
        return
    app.settings = metrics_settings(app.settings, metrics_port, metrics_host, os.environ)
    log.info("using Redis at %s", mask_url(app.settings.redis_url))
    status = _WorkerStarted()
    try:
        await run_worker(
            app,
            processors=names,
            handle_signals=True,
            concurrency=concurrency,
            task_status=status,
        )
    except StreamkitError as exc:
        fail(with_stream_path(exc, app_path), 2 if isinstance(exc, ConfigError) else 1)
    except BaseExceptionGroup as group:
        found = leaves(group)
        if found and all(isinstance(leaf, StreamkitError) for leaf in found):
            fail(
                with_stream_path(found[0], app_path), 2 if isinstance(found[0], ConfigError) else 1
            )
        raise
    # Exit status 0 only for a stop that was asked for (a signal, Worker.stop): a
    # worker that ended on its own must be restarted by its supervisor.
    if status.worker is not None and not status.worker._stopping:
        fail(f"worker of {app.name} stopped without being asked to; see the log above")


def metrics_settings(
    settings: Settings, port: int | None, host: str | None, environ: Mapping[str, str]
) -> Settings:
    """``settings`` with the worker's ``--metrics-port`` and ``--metrics-host``; worker
    ``i`` of ``--processes N`` (``STREAMKIT_WORKER_INDEX``) serves on the port plus ``i``."""
    changes: dict[str, Any] = {}
    if host is not None:
        changes["metrics_host"] = host
    port = settings.metrics_port if port is None else port
    index = environ.get(WORKER_INDEX_VARIABLE)
    if port and index is not None:
        port += int(index)
    if port != settings.metrics_port:
        changes["metrics_port"] = port
    return attrs.evolve(settings, **changes) if changes else settings


async def supervise_workers(app: App, names: list[str] | None, processes: int) -> None:
    """``worker --processes N``: run N copies of this very command, without
    ``--processes``, under a supervisor (see :func:`run_supervisor`)."""
    try:
        check_member_ids(select_processors(app, names), os.environ, processes=processes)
    except ConfigError as exc:
        fail(str(exc), 2)
    command = [sys.executable, "-m", "streamkit", "worker", *given_arguments(without="processes")]
    outcome = await run_supervisor(
        command, processes=processes, handle_signals=True, config_error_code=BadInput.exit_code
    )
    if outcome.code:
        fail(outcome.reason, outcome.code)


def given_arguments(*, without: str) -> list[str]:
    """The current command's arguments and the options given (not defaulted), as
    command-line words, leaving out the parameter named ``without``."""
    ctx = click.get_current_context()
    words: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if name is None or name == without:
            continue
        value = ctx.params[name]
        if isinstance(param, click.Argument):
            words.extend(str(v) for v in (value if param.multiple else [value]))
        elif isinstance(param, click.Option) and (
            ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
        ):
            if param.count:
                words.extend([param.opts[0]] * int(value))
            elif param.is_flag:
                if value:
                    words.append(param.opts[0])
                elif param.secondary_opts:
                    words.append(param.secondary_opts[0])
            else:
                for item in value if param.multiple else [value]:
                    words.extend([param.opts[0], str(item)])
    return words


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
@click.option(
    "--watch",
    "-w",
    is_flag=True,
    help="Refresh every --interval seconds until Ctrl-C: in place on a terminal, "
    "one snapshot after another otherwise (one JSON document per line with --json).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="With --watch: seconds between refreshes.",
)
async def status(
    app_path: str, redis_url: str | None, as_json: bool, watch: bool, interval: float
) -> None:
    """Show each processor's workers and partitions: who, lag, pending, last event.

    Then the app's job queue, if it declares jobs. A worker is named host:pid, plus its member id if it is a static member. The
    table fits the terminal; --json prints everything, for scripts. --watch keeps
    the view up to date, with each partition's rate (events/s).
    """
    ctx = click.get_current_context()
    if not watch and ctx.get_parameter_source("interval") is not ParameterSource.DEFAULT:
        fail("--interval goes with --watch", 2)
    app = load_app(app_path, redis_url)
    if watch:
        from ._watch import watch_status

        try:
            await watch_status(app, interval=interval, as_json=as_json)
        except StreamkitError as exc:
            fail(str(exc))
        return
    try:
        async with app:
            snapshot = await take_snapshot(app)
    except StreamkitError as exc:
        fail(str(exc))
    if as_json:
        click.echo(orjson.dumps(fleet_json(snapshot), option=orjson.OPT_INDENT_2))
        return
    console = Console(highlight=False)
    console.print(f"app {app.name}, Redis at {snapshot.redis_url}", soft_wrap=True)
    if not snapshot.processors:
        console.print(f"app {app.name} has no processors")
    now = datetime.now(UTC)
    for processor in snapshot.processors:
        console.print()
        console.print(members_table(processor, now))
        console.print(status_table(processor, now))
        print_halted(console, app_path, processor)
    if snapshot.jobs is not None:
        console.print()
        console.print(jobs_title(snapshot.jobs, NO_RATES))
        names = list(counts_by_name(snapshot.jobs.counts, snapshot.jobs.declared))
        console.print(jobs_table(snapshot.jobs, names, console.width))


def print_halted(console: Console, app_path: str, processor: ProcessorSnapshot) -> None:
    """One entry per partition the processor is halted on, with the command to resume."""
    for row in processor.partitions:
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


@cli.command()
@click.argument("app_path", metavar="MODULE:APP")
@redis_url_option
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    required=True,
    help="The port to listen on (0: any free port; the URL is printed).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between readings of Redis (however many pages are open).",
)
async def dashboard(
    app_path: str, redis_url: str | None, host: str, port: int, interval: float
) -> None:
    """Serve a read-only web dashboard of an app: its processors' partitions, workers,
    lag and throughput (with a chart), and its job queue.

    The page reads /api/status (the same JSON as `streamkit status --json`, with
    rates) every second; /api/jobs/ID shows a job. Needs the dashboard extra:
    pip install '/path/to/streamkit[dashboard]'. Ctrl-C stops it.
    """
    app = load_app(app_path, redis_url)
    try:
        import hypercorn  # noqa: F401
    except ImportError:
        fail("the dashboard needs hypercorn: pip install '/path/to/streamkit[dashboard]'", 2)
    from ._dashboard import run_dashboard

    def serving(url: str) -> None:
        click.echo(f"serving the dashboard of app {app.name} on {url} (Ctrl-C stops)")

    try:
        await run_dashboard(app, host=host, port=port, interval=interval, on_serving=serving)
    except ConfigError as exc:
        fail(str(exc), 2)
    except StreamkitError as exc:
        fail(str(exc))


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


# ---------------------------------------------------------------------------- jobs

#: What each job status means, as ``streamkit jobs show`` says it.
STATUS_GLOSSES: dict[JobStatus, str] = {
    JobStatus.SCHEDULED: "delayed until it is due",
    JobStatus.WAITING: "for the jobs it depends on",
    JobStatus.SENT: "queued for a worker",
    JobStatus.EXECUTING: "running now",
    JobStatus.RETRY: "a try failed; waiting for the next",
    JobStatus.DEAD: "in the dead-letter queue",
    JobStatus.EXPIRED: "not started before it expired",
}


@attrs.frozen
class QueueTarget:
    """The job queue a ``streamkit jobs`` command works on: an app's, or one by name.

    Attributes:
        name: the queue's name (an app's queue is named after the app).
        shards: its shard count.
        settings: where Redis is, and how to connect.
        app: the app whose queue it is, if it was given as MODULE:APP.
        path: how the command was told which queue, to repeat in hints.
    """

    name: str
    shards: int
    settings: Settings
    app: App | None
    path: str

    def describe(self) -> str:
        owner = f"app {self.app.name}" if self.app is not None else "no app"
        plural = "" if self.shards == 1 else "s"
        return f"queue {self.name} ({owner}, {self.shards} shard{plural})"


def queue_target(
    app_path: str | None, queue_name: str | None, shards: int | None, redis_url: str | None
) -> QueueTarget:
    """The queue named by MODULE:APP or by --queue (and --shards), checked."""
    if app_path is not None and queue_name is not None:
        fail(f"give MODULE:APP or --queue NAME, not both (got {app_path} and {queue_name})", 2)
    if app_path is None and queue_name is None:
        fail(
            "give MODULE:APP (an app that declares jobs), or --queue NAME for a queue "
            "opened with open_job_queue(redis, NAME)",
            2,
        )
    if app_path is not None:
        if shards is not None:
            fail("--shards goes with --queue: an app's queue has its job_shards setting", 2)
        app = load_app(app_path, redis_url)
        if not app.jobs:
            fail(f"{app_path}: app {app.name} declares no jobs (@app.job), so no job queue", 2)
        return QueueTarget(app.name, app.settings.job_shards, app.settings, app, app_path)
    assert queue_name is not None
    try:
        validate_name("--queue", queue_name)
        overrides: dict[str, Any] = {} if redis_url is None else {"redis_url": redis_url}
        settings = Settings.from_env(**overrides)
    except ConfigError as exc:
        fail(str(exc), 2)
    count = shards if shards is not None else settings.job_shards
    return QueueTarget(queue_name, count, settings, None, f"--queue {queue_name}")


@contextlib.asynccontextmanager
async def open_target(target: QueueTarget) -> AsyncIterator[JobQueue]:
    """Connect, and yield the target's queue."""
    if target.app is not None:
        async with target.app:
            yield target.app.job_queue
        return
    settings = target.settings
    async with (
        open_redis(
            settings.redis_url,
            connect_timeout=settings.connect_timeout,
            give_up_after=settings.connect_give_up_after,
        ) as redis,
        open_job_queue(redis, target.name, shards=target.shards) as queue,
    ):
        yield queue


def queue_options(function: Any) -> Any:
    """--queue, --shards and --redis-url, for a queue given without an app."""
    function = redis_url_option(function)
    function = click.option(
        "--shards",
        type=click.IntRange(min=1),
        default=None,
        metavar="N",
        help="With --queue: its shard count (default: STREAMKIT_JOB_SHARDS, else 1).",
    )(function)
    return click.option(
        "--queue",
        "queue_name",
        metavar="NAME",
        help="A queue opened with open_job_queue(redis, NAME), instead of MODULE:APP.",
    )(function)


def app_and_id(
    app_path: str | None, job_id: str | None, queue_name: str | None
) -> tuple[str | None, str]:
    """``[MODULE:APP] ID``: with --queue, a lone argument is the job id."""
    if job_id is None and queue_name is not None and app_path is not None:
        app_path, job_id = None, app_path
    if job_id is None:
        fail("missing the job ID (after MODULE:APP, or alone with --queue NAME)", 2)
    if not job_id:
        fail("the job ID is empty", 2)
    return app_path, job_id


def relative(moment: datetime | None, now: datetime) -> str:
    """``2026-01-01T10:00:00+00:00 (5s ago)``, ``... (in 2m)``, or ``-``."""
    if moment is None:
        return "-"
    stamp = moment.isoformat(timespec="seconds")
    if moment <= now:
        return f"{stamp} ({ago(moment, now)})"
    return f"{stamp} (in {ago(now, moment).removesuffix(' ago')})"


def iso_ms(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="milliseconds") if moment is not None else None


def status_text(status: JobStatus) -> str:
    gloss = STATUS_GLOSSES.get(status)
    return f"{status.value} ({gloss})" if gloss else status.value


def call_text(info: JobInfo) -> str:
    """The job as a call: ``send_email('ada@example.com', retry=True)``."""
    parts = [repr(arg) for arg in info.args]
    parts += [f"{key}={value!r}" for key, value in info.kwargs.items()]
    return f"{info.name}({', '.join(parts)})"


def error_text(info: JobInfo) -> str:
    if info.error is None:
        return "-"
    return f"{info.error.type}: {info.error.message}" if info.error.message else info.error.type


def info_json(target: QueueTarget, counts: QueueCounts) -> dict[str, Any]:
    declared = target.app.jobs if target.app is not None else ()
    return {
        "queue": target.name,
        "app": target.app.name if target.app is not None else None,
        "shards": target.shards,
        "redis_url": mask_url(target.settings.redis_url),
        "counts": counts_json(counts),
        "by_name": counts_by_name(counts, declared),
    }


def counts_table(target: QueueTarget, counts: QueueCounts) -> Table:
    table = Table(title=f"queue {target.name}: jobs", title_justify="left")
    table.add_column("status")
    table.add_column("jobs", justify="right")
    rows = [
        *((f"queued, {prio} priority", n) for prio, n in counts.queued.items()),
        ("scheduled (delayed)", counts.scheduled),
        ("waiting for other jobs", counts.waiting),
        ("running", counts.running),
        ("retrying (waiting for a try)", counts.retrying),
        ("dead", counts.dead),
        ("succeeded (total)", counts.succeeded),
        ("aborted (total)", counts.aborted),
        ("expired (total)", counts.expired),
    ]
    for label, number in rows:
        table.add_row(label, f"{number:,}")
    return table


def by_name_table(target: QueueTarget, by_name: dict[str, dict[str, int]]) -> Table:
    table = Table(title=f"queue {target.name}: jobs by name", title_justify="left")
    table.add_column("job", overflow="fold")
    table.add_column("jobs by status", overflow="fold", ratio=1)
    for name, per_count in by_name.items():
        shown = ", ".join(f"{n:,} {count}" for count, n in per_count.items() if n)
        table.add_row(Text(name), Text(shown or "none"))
    return table


@cli.group(cls=WholeHelpGroup)
def jobs() -> None:
    """Inspect an app's job queue: counts, one job, dead jobs; abort a job.

    Name the queue by its app, MODULE:APP (the queue is named after the app, and its
    shard count is the app's job_shards setting), or, for a queue opened with
    open_job_queue(redis, NAME) without an app, by --queue NAME (with --shards and
    --redis-url as needed).
    """


@jobs.command("info")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@queue_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
async def jobs_info(
    app_path: str | None,
    queue_name: str | None,
    shards: int | None,
    redis_url: str | None,
    as_json: bool,
) -> None:
    """Show how many jobs a queue holds, by status, priority and job name.

    Queued, scheduled, waiting, running, retrying and dead are the jobs in that state
    now; succeeded, aborted and expired are running totals.
    """
    target = queue_target(app_path, queue_name, shards, redis_url)
    try:
        async with open_target(target) as queue:
            counts = await queue.counts()
    except StreamkitError as exc:
        fail(str(exc))
    report = info_json(target, counts)
    if as_json:
        click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        return
    console = Console(highlight=False)
    console.print(
        f"{target.describe()}, Redis at {report['redis_url']}", soft_wrap=True, markup=False
    )
    console.print(counts_table(target, counts))
    if report["by_name"]:
        console.print(by_name_table(target, report["by_name"]))


@jobs.command("show")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@click.argument("job_id", metavar="ID", required=False)
@queue_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
async def jobs_show(
    app_path: str | None,
    job_id: str | None,
    queue_name: str | None,
    shards: int | None,
    redis_url: str | None,
    as_json: bool,
) -> None:
    """Show one job: status, arguments, tries, times, worker, progress, last error.

    The last error comes with its traceback, as the worker formatted it.
    """
    app_path, job_id = app_and_id(app_path, job_id, queue_name)
    target = queue_target(app_path, queue_name, shards, redis_url)
    try:
        async with open_target(target) as queue:
            info = await queue.info(job_id)
    except StreamkitError as exc:
        fail(str(exc))
    if as_json:
        click.echo(orjson.dumps(job_json(info), option=orjson.OPT_INDENT_2))
        return
    now = datetime.now(UTC)
    rows: list[tuple[str, str]] = [
        ("status", status_text(info.status)),
        ("call", call_text(info)),
        ("priority", info.priority),
        ("tries", f"{info.tries} of {info.max_tries}"),
        ("enqueued", relative(info.enqueued_at, now)),
    ]
    if info.due_at is not None:
        rows.append(("due", relative(info.due_at, now)))
    if info.expires_at is not None:
        rows.append(("expires", relative(info.expires_at, now)))
    rows += [
        ("started", relative(info.started_at, now)),
        ("finished", relative(info.finished_at, now)),
        ("worker", info.worker or "-"),
    ]
    if info.progress is not None:
        done = f"{info.progress:.0%}"
        rows.append(
            ("progress", f"{done} {info.progress_message}" if info.progress_message else done)
        )
    if info.lost:
        rows.append(("lost", f"its worker died while running it {info.lost} time(s)"))
    rows.append(("error", error_text(info)))
    rows.append(("history", "oldest first"))
    click.echo(f"job {info.id} of queue {info.queue}")
    for label, value in rows:
        click.echo(f"  {label:<9} {value}")
    for at, what in job_history(info):
        click.echo(f"    {iso_ms(at) or '-':<29} {what}")
    if info.error is not None and info.error.traceback:
        click.echo("  traceback of the last failed try:")
        for line in info.error.traceback.rstrip().splitlines():
            click.echo(f"    {line}")


@jobs.command("abort")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@click.argument("job_id", metavar="ID", required=False)
@click.option(
    "--reason",
    default="aborted by streamkit jobs abort",
    show_default=True,
    help="Recorded as the job's error message.",
)
@queue_options
async def jobs_abort(
    app_path: str | None,
    job_id: str | None,
    reason: str,
    queue_name: str | None,
    shards: int | None,
    redis_url: str | None,
) -> None:
    """Abort a job: a job not running ends aborted at once; a running one is
    cancelled by its worker within a second.

    A job that already ended (succeeded, dead, aborted, expired) is left as it is;
    the command says so, with exit code 0. Jobs waiting for it end dead.
    """
    app_path, job_id = app_and_id(app_path, job_id, queue_name)
    target = queue_target(app_path, queue_name, shards, redis_url)
    try:
        async with open_target(target) as queue:
            handle = await queue.find(job_id)
            info = await handle.info()
            status = await handle.abort(reason)
    except StreamkitError as exc:
        fail(str(exc))
    what = f"job {job_id} ({info.name})"
    # abort() answers ABORTED for a job it aborted and for one aborted before.
    if status is JobStatus.ABORTED and not info.status.final:
        click.echo(f"aborted {what}")
    elif status is JobStatus.EXECUTING:
        worker = f" on {info.worker}" if info.worker else ""
        click.echo(
            f"{what} is running{worker}: its worker cancels it within a second, and it ends aborted"
        )
    else:
        click.echo(f"{what} already ended {status.value}; nothing to abort")


@jobs.group("dlq", cls=WholeHelpGroup)
def jobs_dlq() -> None:
    """List, replay and purge a queue's dead jobs (the dead-letter queue)."""


@jobs_dlq.command("list")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Show at most this many dead jobs; says how many more exist.",
)
@queue_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
async def jobs_dlq_list(
    app_path: str | None,
    limit: int,
    queue_name: str | None,
    shards: int | None,
    redis_url: str | None,
    as_json: bool,
) -> None:
    """Show a queue's dead jobs, oldest first, with their last errors."""
    target = queue_target(app_path, queue_name, shards, redis_url)
    try:
        async with open_target(target) as queue:
            dead = await queue.dead_letters(limit=limit)
            total = (await queue.counts()).dead
    except StreamkitError as exc:
        fail(str(exc))
    total = max(total, len(dead))
    if as_json:
        report = {"queue": target.name, "total": total, "jobs": [job_json(i) for i in dead]}
        click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        return
    if not dead:
        click.echo(f"queue {target.name} has no dead jobs")
        return
    table = Table(title=f"dead jobs of queue {target.name}", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("job", overflow="fold")
    table.add_column("failed", no_wrap=True)
    table.add_column("tries", justify="right", no_wrap=True)
    table.add_column("error", overflow="fold", ratio=1)
    now = datetime.now(UTC)
    for info in dead:
        first_line = error_text(info).splitlines()[0] if info.error else "-"
        table.add_row(
            Text(info.id),
            Text(info.name),
            ago(info.finished_at, now),
            f"{info.tries}/{info.max_tries}",
            Text(first_line),
        )
    Console(highlight=False).print(table)
    if total > len(dead):
        click.echo(
            f"showing {len(dead):,} of {total:,} dead jobs; pass --limit {total} to see them all"
        )


async def act_on_dead_jobs(
    action: Literal["replay", "purge"],
    *,
    target: QueueTarget,
    ids: tuple[str, ...],
    yes: bool,
) -> None:
    """Confirm, then replay or purge the chosen dead jobs (all by default).

    Given ids are checked first: if one is not a dead job of the queue, nothing is
    done (exit code 2).
    """
    done_word = "replayed" if action == "replay" else "purged"
    nothing = f"nothing was {done_word}"
    wanted = list(dict.fromkeys(ids))
    if any(not job_id for job_id in wanted):
        fail(f"--id: a job id is not empty; {nothing}", 2)
    listing = f"`streamkit jobs dlq list {target.path}` lists the dead ones"
    total = 0
    so_far = 0  # jobs replayed or purged, for a message if interrupted
    try:
        async with open_target(target) as queue:
            if wanted:
                problems: list[str] = []
                for job_id in wanted:
                    try:
                        status = (await queue.info(job_id)).status
                    except JobNotFound:
                        problems.append(f"{job_id} (no such job)")
                        continue
                    if status is not JobStatus.DEAD:
                        problems.append(f"{job_id} ({status.value})")
                if problems:
                    fail(
                        f"not dead jobs of queue {target.name}: {', '.join(problems)} "
                        f"({listing}); {nothing}",
                        2,
                    )
                total = len(wanted)
            else:
                total = (await queue.counts()).dead
                if not total:
                    click.echo(f"queue {target.name} has no dead jobs; {nothing}")
                    return
            which = f"{total:,} dead job(s)" if wanted else f"all {total:,} dead job(s)"
            if not yes:
                question = (
                    f"Replay {which} of queue {target.name}, their tries starting over?"
                    if action == "replay"
                    else f"Delete {which} of queue {target.name} for good?"
                )
                confirm(question, refused=nothing)
            act = queue.replay if action == "replay" else queue.purge
            with Progress(
                TextColumn(action),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=stderr,
                transient=True,
                disable=not stderr.is_terminal,
            ) as progress:
                task = progress.add_task(action, total=total)

                def on_progress(through: int, done: int) -> None:
                    nonlocal so_far
                    so_far += done
                    progress.update(task, advance=through)

                finished = await act(wanted or None, on_progress=on_progress)
    except StreamkitError as exc:
        if so_far:
            fail(f"{exc}\n{done_word} {so_far:,} of {total:,} dead job(s) before it")
        fail(str(exc))
    except KeyboardInterrupt:
        fail(f"interrupted: {done_word} {so_far:,} of {total:,} dead job(s)", 130)
    skipped = total - len(finished) if wanted else 0
    tail = f" ({skipped} were no longer dead)" if skipped else ""
    how = ", queued again with their tries reset" if action == "replay" else ""
    click.echo(f"{done_word} {len(finished):,} dead job(s) of queue {target.name}{how}{tail}")


@jobs_dlq.command("replay")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@click.option("--id", "ids", multiple=True, metavar="ID", help="Replay only these (repeatable).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@queue_options
async def jobs_dlq_replay(
    app_path: str | None,
    ids: tuple[str, ...],
    yes: bool,
    queue_name: str | None,
    shards: int | None,
    redis_url: str | None,
) -> None:
    """Queue dead jobs again, with their tries reset: all of them, or those of --id."""
    target = queue_target(app_path, queue_name, shards, redis_url)
    await act_on_dead_jobs("replay", target=target, ids=ids, yes=yes)


@jobs_dlq.command("purge")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@click.option("--id", "ids", multiple=True, metavar="ID", help="Purge only these (repeatable).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@queue_options
async def jobs_dlq_purge(
    app_path: str | None,
    ids: tuple[str, ...],
    yes: bool,
    queue_name: str | None,
    shards: int | None,
    redis_url: str | None,
) -> None:
    """Delete dead jobs and their records for good: all of them, or those of --id."""
    target = queue_target(app_path, queue_name, shards, redis_url)
    await act_on_dead_jobs("purge", target=target, ids=ids, yes=yes)


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
