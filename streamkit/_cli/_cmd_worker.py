"""``streamkit worker``: run an app, in this process or in N supervised ones."""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import asyncclick as click
import attrs
import trio
from asyncclick.core import ParameterSource

from .._errors import ConfigError, StreamkitError
from .._nurseries import leaves
from .._urls import mask_url
from .._worker import Worker, run_worker, select_processors, select_queues
from ._exits import BadInput, exit_code_of, fail
from ._loading import load_app, with_stream_path
from ._logging import configure_logging, logging_options
from ._options import redis_url_option
from ._supervisor import (
    WORKER_INDEX_VARIABLE,
    check_member_ids,
    run_supervisor,
    watch_lifeline,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from .._app import App
    from .._logs import LogFormat
    from .._settings import Settings

__all__ = ["metrics_settings", "worker"]

log = logging.getLogger("streamkit.cli")

#: Options holding secrets (a Redis URL may hold a password; a token): ``worker --processes N``
#: hands them to its worker processes in these environment variables instead of on
#: their command lines. A worker process reads them where the option was not given.
SECRET_OPTIONS = {
    "redis_url": "STREAMKIT_WORKER_REDIS_URL",
    "metrics_token": "STREAMKIT_WORKER_METRICS_TOKEN",
}


@click.command()
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
    "--queues",
    "-q",
    metavar="NAMES",
    help="Comma-separated job queues to serve: 'default' (the one named after the app) "
    "and the names given as @app.job(queue=...) (default: all of the app's).",
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
@click.option(
    "--metrics-token",
    metavar="TOKEN",
    default=None,
    help="Answer only scrapes that send 'Authorization: Bearer TOKEN' (at least 16 "
    "characters; default: the metrics_token setting, STREAMKIT_METRICS_TOKEN, which "
    "keeps it out of ps).",
)
async def worker(
    app_path: str,
    processors: str | None,
    redis_url: str | None,
    log_level: str,
    log_format: LogFormat,
    concurrency: int | None,
    queues: str | None,
    processes: int,
    metrics_port: int | None,
    metrics_host: str | None,
    metrics_token: str | None,
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
    if os.environ.get(WORKER_INDEX_VARIABLE) is not None:
        # A worker process of `--processes N`: it stops if its supervisor dies, and
        # takes its supervisor's secret options.
        watch_lifeline(os.environ)
        redis_url = redis_url or os.environ.get(SECRET_OPTIONS["redis_url"])
        metrics_token = metrics_token or os.environ.get(SECRET_OPTIONS["metrics_token"])
    app = load_app(app_path, redis_url, one_shot=False)
    names = processor_names(app, processors)
    queue_names = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    try:
        select_processors(app, names)
        select_queues(app, queue_names)
    except ConfigError as exc:
        fail(str(exc), 2)
    if processes > 1:
        await supervise_workers(app, names, processes)
        return
    app.settings = metrics_settings(
        app.settings, metrics_port, metrics_host, os.environ, token=metrics_token
    )
    log.info("using Redis at %s", mask_url(app.settings.redis_url))
    try:
        async with trio.open_nursery() as nursery:
            running: Worker = await nursery.start(
                functools.partial(
                    run_worker,
                    app,
                    processors=names,
                    handle_signals=True,
                    concurrency=concurrency,
                    queues=queue_names,
                )
            )
    except StreamkitError as exc:
        fail(with_stream_path(exc, app_path), exit_code_of(exc))
    except BaseExceptionGroup as group:
        found = leaves(group)
        if found and all(isinstance(leaf, StreamkitError) for leaf in found):
            fail(with_stream_path(found[0], app_path), exit_code_of(found[0]))
        raise
    # Exit status 0 only for a stop that was asked for (a signal, Worker.stop): a
    # worker that ended on its own must be restarted by its supervisor.
    if not running.stop_requested:
        fail(f"worker of {app.name} stopped without being asked to; see the log above")


def metrics_settings(
    settings: Settings,
    port: int | None,
    host: str | None,
    environ: Mapping[str, str],
    *,
    token: str | None = None,
) -> Settings:
    """``settings`` with the worker's ``--metrics-port``, ``--metrics-host`` and
    ``--metrics-token``; worker ``i`` of ``--processes N`` (``STREAMKIT_WORKER_INDEX``)
    serves on the port plus ``i``."""
    changes: dict[str, Any] = {}
    if host is not None:
        changes["metrics_host"] = host
    if token is not None:
        changes["metrics_token"] = token
    port = settings.metrics_port if port is None else port
    index = environ.get(WORKER_INDEX_VARIABLE)
    if port and index is not None:
        port += int(index)
    if port != settings.metrics_port:
        changes["metrics_port"] = port
    return attrs.evolve(settings, **changes) if changes else settings


async def supervise_workers(app: App, names: list[str] | None, processes: int) -> None:
    """``worker --processes N``: run N copies of this very command, without
    ``--processes``, under a supervisor (see :func:`run_supervisor`).

    The secret options (:data:`SECRET_OPTIONS`) reach the worker processes in their
    environment, not on their command lines, which any user of the machine can read
    (``ps``)."""
    try:
        check_member_ids(select_processors(app, names), os.environ, processes=processes)
    except ConfigError as exc:
        fail(str(exc), 2)
    ctx = click.get_current_context()
    environ = dict(os.environ)
    for name, variable in SECRET_OPTIONS.items():
        environ.pop(variable, None)
        if ctx.params.get(name) is not None:
            environ[variable] = str(ctx.params[name])
    words = given_arguments(without={"processes", *SECRET_OPTIONS})
    outcome = await run_supervisor(
        [sys.executable, "-m", "streamkit", "worker", *words],
        processes=processes,
        handle_signals=True,
        config_error_code=BadInput.exit_code,
        environ=environ,
    )
    if outcome.code:
        fail(outcome.reason, outcome.code)


def given_arguments(*, without: Collection[str]) -> list[str]:
    """The current command's arguments and the options given (not defaulted), as
    command-line words, leaving out the parameters named in ``without``."""
    ctx = click.get_current_context()
    words: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if name is None or name in without:
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
