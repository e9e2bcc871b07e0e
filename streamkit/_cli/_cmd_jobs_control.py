"""``streamkit jobs pause/resume`` and ``streamkit jobs schedules``: operator controls
of a job queue (registered on the ``jobs`` group)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncclick as click
import orjson

from .._errors import ConfigError, EncodeError
from .._literal import printable
from ._cmd_jobs import (
    QueueTarget,
    holds_nothing,
    jobs,
    nothing_there,
    open_target,
    queue_command,
    queue_options,
    queue_target,
)
from ._exits import fail
from ._options import WholeHelpGroup, json_option

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..jobs import ScheduleInfo

__all__ = ["jobs_pause", "jobs_resume", "jobs_schedules"]


def _queue_or_job_command(name: str, verb: str) -> Callable[[Any], Any]:
    """``streamkit jobs NAME [MODULE:APP] [--job NAME]``: a :func:`queue_command` on a
    queue, or on one job name on it, called with ``job_name`` (``None``: the queue)."""

    def register(function: Any) -> Any:
        function = queue_command(function)
        function = click.option(
            "--job", "job_name", metavar="NAME", help=f"{verb} this job name only."
        )(function)
        function = click.argument("app_path", metavar="[MODULE:APP]", required=False)(function)
        return jobs.command(name)(function)

    return register


def _what(job: str | None, queue: str) -> str:
    return f"job {job} of queue {queue}" if job else f"queue {queue}"


@_queue_or_job_command("pause", "Pause")
@click.option(
    "--force",
    is_flag=True,
    help="With --queue: pause it even if nothing of it is in Redis yet (before its first job).",
)
async def jobs_pause(
    target: QueueTarget,
    job_name: str | None,
    force: bool,
) -> None:
    """Pause a queue, or one job name on it: no new try starts on any worker until
    `streamkit jobs resume`. Nothing fails: the jobs wait (a paused job name's as
    held), and the tries running go on to their end.

    A queue named by --queue that has nothing in Redis (a typo, a wrong --shards or
    --redis-url) is refused unless --force is given."""
    async with open_target(target) as queue:
        # An app knows its queue; a name alone may be a typo, which a pause would write.
        if target.app is None and not force and await holds_nothing(queue):
            fail(f"{nothing_there(queue)}; not pausing it (--force pauses it anyway)", 2)
        try:
            await queue.pause(job_name)
        except ConfigError as exc:  # a job the app does not declare: a typo
            fail(str(exc), 2)
        paused = await queue.paused()
    click.echo(f"paused {printable(_what(job_name, target.name))} (paused: {', '.join(paused)})")


@_queue_or_job_command("resume", "Resume")
async def jobs_resume(
    target: QueueTarget,
    job_name: str | None,
) -> None:
    """Resume a queue, or one job name, paused by `streamkit jobs pause`: the jobs it
    held are queued again, in order."""
    async with open_target(target) as queue:
        try:
            released = await queue.resume(job_name)
        except ConfigError as exc:  # a job the app does not declare: a typo
            fail(str(exc), 2)
        paused = await queue.paused()
    let_out = f", {released:,} held job(s) queued again" if job_name else ""
    still = f" (still paused: {', '.join(paused)})" if paused else ""
    click.echo(f"resumed {printable(_what(job_name, target.name))}{let_out}{still}")


@jobs.group("schedules", cls=WholeHelpGroup)
def jobs_schedules() -> None:
    """List, set and remove a queue's schedules (cron jobs added at runtime)."""


def _schedule_json(info: ScheduleInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "job": info.job,
        "cron": info.expression,
        "tz": info.tz,
        "args": list(info.args),
        "kwargs": info.kwargs,
        "misfire_grace": info.misfire_grace,
        "declared": info.declared,
        "next_at": info.next_at.isoformat() if info.next_at else None,
    }


@jobs_schedules.command("list")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@queue_command
@json_option
async def schedules_list(
    target: QueueTarget,
    as_json: bool,
) -> None:
    """Show a queue's schedules: those declared in code (@app.cron), then those set
    at runtime, with when each ticks next."""
    async with open_target(target) as queue:
        found = await queue.schedules()
    if as_json:
        report = {"queue": target.name, "schedules": [_schedule_json(i) for i in found]}
        click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        return
    if not found:
        click.echo(f"queue {target.name} has no schedules")
        return
    for info in found:
        where = f" ({info.tz})" if info.tz else " (UTC)"
        kind = "declared" if info.declared else "runtime"
        call = ", ".join(
            [*(repr(a) for a in info.args), *(f"{k}={v!r}" for k, v in info.kwargs.items())]
        )
        nxt = info.next_at.isoformat(timespec="seconds") if info.next_at else "-"
        click.echo(
            printable(
                f"{info.name}: {info.job}({call}) at '{info.expression}'{where}, {kind}, next {nxt}"
            )
        )


def _json_option(value: str | None, what: str, kind: type) -> Any:
    if value is None:
        return kind()
    try:
        decoded = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        fail(f"{what}: not JSON ({exc})", 2)
    if not isinstance(decoded, kind):
        fail(f"{what}: must be a JSON {'list' if kind is list else 'object'}", 2)
    return decoded


@jobs_schedules.command("set")
@click.argument("words", nargs=-1, metavar="[MODULE:APP] NAME JOB CRON")
@click.option("--tz", metavar="ZONE", help="The timezone of its times (e.g. Europe/Paris; UTC).")
@click.option("--args", "args_json", metavar="JSON", help="Positional arguments, a JSON list.")
@click.option("--kwargs", "kwargs_json", metavar="JSON", help="Keyword arguments, a JSON object.")
@click.option(
    "--misfire-grace",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="A tick missed by at most this many seconds still runs.",
)
@queue_options
async def schedules_set(
    words: tuple[str, ...],
    tz: str | None,
    args_json: str | None,
    kwargs_json: str | None,
    misfire_grace: float,
    queue_name: str | None,
    shards: int | None,
    redis_url: str | None,
) -> None:
    """Add the schedule NAME, or change it: JOB runs at the times of CRON (a crontab
    expression, in quotes), once per tick across the workers, which pick the change
    up within a second."""
    if len(words) == 3:
        app_path, (name, job, cron) = None, words
    elif len(words) == 4:
        app_path, name, job, cron = words
    else:
        fail("give [MODULE:APP] NAME JOB CRON (MODULE:APP, or --queue NAME)", 2)
    target = queue_target(app_path, queue_name, shards, redis_url)
    args = _json_option(args_json, "--args", list)
    kwargs = _json_option(kwargs_json, "--kwargs", dict)
    async with open_target(target) as queue:
        try:
            info = await queue.set_schedule(
                name, job, cron, tz=tz, args=args, kwargs=kwargs, misfire_grace=misfire_grace
            )
        except (ConfigError, TypeError, EncodeError) as exc:
            fail(str(exc), 2)
    nxt = info.next_at.isoformat(timespec="seconds") if info.next_at else "-"
    click.echo(printable(f"schedule {name} of queue {target.name}: {job} at '{cron}', next {nxt}"))


@jobs_schedules.command("remove")
@click.argument("words", nargs=-1, metavar="[MODULE:APP] NAME")
@queue_options
async def schedules_remove(
    words: tuple[str, ...],
    queue_name: str | None,
    shards: int | None,
    redis_url: str | None,
) -> None:
    """Remove the schedule NAME (set at runtime): the workers stop running it within a
    second."""
    if len(words) == 1:
        app_path, name = None, words[0]
    elif len(words) == 2:
        app_path, name = words
    else:
        fail("give [MODULE:APP] NAME (MODULE:APP, or --queue NAME)", 2)
    target = queue_target(app_path, queue_name, shards, redis_url)
    async with open_target(target) as queue:
        removed = await queue.remove_schedule(name)
    if not removed:
        fail(f"queue {target.name} has no schedule {name!r} set at runtime", 2)
    click.echo(printable(f"removed schedule {name} of queue {target.name}"))
