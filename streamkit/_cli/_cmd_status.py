"""``streamkit status`` (and ``--watch``) and ``streamkit dashboard``: how an app is doing."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial

import asyncclick as click
import orjson
from asyncclick.core import ParameterSource

from .._errors import ConfigError, StreamkitError
from ._exits import StdoutConsole, fail
from ._fleet import fleet_json, take_snapshot
from ._fleet_view import status_view
from ._loading import load_app
from ._options import json_option, redis_url_option

__all__ = ["dashboard", "status"]


#: ``--interval SECONDS`` (at least 0.1, default 1): ``@_interval_option(help=...)``.
_interval_option = partial(
    click.option,
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
)


@click.command()
@click.argument("app_path", metavar="MODULE:APP")
@redis_url_option
@json_option
@click.option(
    "--watch",
    "-w",
    is_flag=True,
    help="Refresh every --interval seconds until Ctrl-C: in place on a terminal, "
    "one snapshot after another otherwise (one JSON document per line with --json).",
)
@_interval_option(help="With --watch: seconds between refreshes.")
async def status(
    app_path: str, redis_url: str | None, as_json: bool, watch: bool, interval: float
) -> None:
    """Show each processor's workers and partitions: who, lag, pending, last event.

    Lag counts the events not processed yet (pending ones included); pending, those
    a worker holds and has not acknowledged. A halted partition shows as HALTED,
    with the command that resumes it. Each table the processor writes gets a column:
    its keys in each partition. Then the app's job queue, if it declares jobs. A
    worker is named host:pid, plus its member id if it is a static member. The view
    fits the terminal; --json prints everything, for scripts. --watch keeps it up to
    date, with each partition's rate (events/s).
    """
    ctx = click.get_current_context()
    if not watch and ctx.get_parameter_source("interval") is not ParameterSource.DEFAULT:
        fail("--interval goes with --watch", 2)
    app = load_app(app_path, redis_url, one_shot=not watch)
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
    console = StdoutConsole(highlight=False)
    view = status_view(snapshot, app_path=app_path, width=console.width, now=datetime.now(UTC))
    console.print(view)


@click.command()
@click.argument("app_path", metavar="MODULE:APP")
@redis_url_option
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    required=True,
    help="The port to listen on (0: any free port; the URL is printed).",
)
@_interval_option(help="Seconds between readings of Redis (however many pages are open).")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A host name the dashboard is reached by, besides localhost and the address "
    "it listens on (repeatable; '*': any). Requests for other hosts get 421.",
)
@click.option(
    "--token",
    metavar="TOKEN",
    help="The token every request must carry (at least 16 characters; default: the "
    "dashboard_token setting, STREAMKIT_DASHBOARD_TOKEN, which keeps it out of ps). "
    "Needed with a --host other machines reach.",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Need no token, even on a --host other machines reach: anyone who can reach "
    "it sees the fleet, job arguments and errors.",
)
async def dashboard(
    app_path: str,
    redis_url: str | None,
    host: str,
    port: int,
    interval: float,
    allowed_hosts: tuple[str, ...],
    token: str | None,
    no_auth: bool,
) -> None:
    """Serve a web dashboard of an app: its processors' partitions, workers, lag and
    throughput (with a chart), and its job queue, with its controls: abort a job,
    replay or purge a dead one, pause and resume the queue.

    The page reads /api/status (the same JSON as `streamkit status --json`, with
    rates) every second; /api/jobs/ID shows a job. Needs the dashboard extra:
    pip install '/path/to/streamkit[dashboard]'. Ctrl-C stops it. The controls are
    on behind its token, or on localhost; with --no-auth elsewhere it only shows.

    It answers only requests for localhost, the address it listens on and the
    --allowed-host names. On an address other machines reach it needs a token:
    a browser opens URL/?token=TOKEN once (a cookie keeps it logged in); scripts
    send 'Authorization: Bearer TOKEN'.
    """
    app = load_app(app_path, redis_url, one_shot=False)
    try:
        import hypercorn  # noqa: F401
    except ImportError:
        fail("the dashboard needs hypercorn: pip install '/path/to/streamkit[dashboard]'", 2)
    from ._dashboard import dashboard_access, run_dashboard

    try:
        access = dashboard_access(
            host,
            token=token if token is not None else app.settings.dashboard_token,
            allowed_hosts=allowed_hosts,
            no_auth=no_auth,
        )
    except ConfigError as exc:
        fail(str(exc).replace("token: ", "--token: ", 1), 2)

    def serving(url: str) -> None:
        click.echo(f"serving the dashboard of app {app.name} on {url} (Ctrl-C stops)")
        if access.token:
            click.echo(
                f"it needs its token: open {url}/?token=TOKEN once in a browser, "
                f"or send 'Authorization: Bearer TOKEN'"
            )

    try:
        await run_dashboard(
            app, host=host, port=port, interval=interval, access=access, on_serving=serving
        )
    except ConfigError as exc:
        fail(str(exc), 2)
    except StreamkitError as exc:
        fail(str(exc))
