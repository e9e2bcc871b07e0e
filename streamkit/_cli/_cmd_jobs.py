"""``streamkit jobs``: a job queue's counts, one job, its dead jobs; abort a job."""

from __future__ import annotations

import contextlib
import functools
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import asyncclick as click
import attrs
import orjson

from .._errors import ConfigError, StreamkitError
from .._keys import validate_name
from .._literal import printable
from .._redis import open_redis, redis_errors
from .._settings import Settings
from .._urls import mask_url
from ..jobs import JobEvent, JobInfo, JobNotFound, JobQueue, JobStatus, open_job_queue
from ..jobs._layout import DEFAULT_QUEUE, routed_queue
from ..jobs._replies import event_cursors
from ._confirm import BulkAction, bulk_options, confirm_and_act
from ._exits import StdoutConsole, fail
from ._fleet import app_job_counts, counts_by_name, counts_json, iso, job_json
from ._jobs_view import by_name_table, counts_table, dead_jobs_table, job_lines
from ._loading import load_app, one_shot_settings
from ._options import WholeHelpGroup, json_option, limit_option, redis_url_option, stderr
from ._watch import until_signal

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._app import App
    from ..jobs import QueueCounts

__all__ = ["jobs"]


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
    app_path: str | None,
    queue_name: str | None,
    shards: int | None,
    redis_url: str | None,
    *,
    one_shot: bool = True,
) -> QueueTarget:
    """The queue named by MODULE:APP or by --queue (and --shards), checked; set for a
    one-shot command unless ``one_shot=False`` (one that follows: it waits for Redis
    at the start as it rides out an outage later)."""
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
        app = load_app(app_path, redis_url, one_shot=one_shot)
        # An app that declares no jobs still names its queue: jobs another module
        # (or open_job_queue(redis, NAME)) enqueued there are found all the same.
        return QueueTarget(app.name, app.settings.job_shards, app.settings, app, app_path)
    assert queue_name is not None
    try:
        for part in queue_name.split(".", 1):  # a name, or an app's named queue APP.QUEUE
            validate_name("--queue", part)
        overrides: dict[str, Any] = {} if redis_url is None else {"redis_url": redis_url}
        settings = Settings.from_env(**overrides)
        if one_shot:
            settings = one_shot_settings(settings)
    except ConfigError as exc:
        fail(str(exc), 2)
    count = shards if shards is not None else settings.job_shards
    return QueueTarget(queue_name, count, settings, None, f"--queue {queue_name}")


@contextlib.asynccontextmanager
async def open_target(target: QueueTarget, *, whole: bool = False) -> AsyncIterator[JobQueue]:
    """Connect, and yield the target's queue. An error of streamkit's, connecting or
    raised by the block, ends the command with it as one line (exit code 1). For a
    command reading the ``whole`` queue, a ``--queue`` with nothing in Redis is said
    so first."""
    try:
        async with _open_queue(target) as queue:
            if whole and target.app is None:  # (a command that reads the whole queue)
                await _say_if_unknown(queue)
            yield queue
    except StreamkitError as exc:
        fail(str(exc))


async def _say_if_unknown(queue: JobQueue) -> None:
    """Say (on stderr) when nothing of a queue named by ``--queue`` is in this Redis:
    no job was ever enqueued, paused or served there, so a mistyped name, a wrong
    ``--shards`` or ``--redis-url`` does not read as an empty queue."""
    if await holds_nothing(queue):
        stderr.print(f"note: {nothing_there(queue)}", markup=False, highlight=False)


async def holds_nothing(queue: JobQueue) -> bool:
    """Whether nothing of ``queue`` is in this Redis: no job was ever enqueued, paused
    or served there."""
    found = 0
    with redis_errors():
        for keys in queue.shard_keys:
            found += await queue.redis.exists([*keys.keys, keys.control])
    return not found


def nothing_there(queue: JobQueue) -> str:
    """What :func:`holds_nothing` means, for a message."""
    return (
        f"queue {queue.name} ({queue.shards} shard{'s' if queue.shards != 1 else ''})"
        f" has nothing in this Redis: no job was ever enqueued or served there (check the"
        f" name, --shards and --redis-url)"
    )


@contextlib.asynccontextmanager
async def _open_queue(target: QueueTarget) -> AsyncIterator[JobQueue]:
    if target.app is not None and target.app.jobs:
        async with target.app:
            yield target.app.job_queue
        return
    if target.app is not None:
        async with (
            target.app,
            open_job_queue(target.app.redis, target.name, shards=target.shards) as queue,
        ):
            yield queue
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


def queue_command(function: Any) -> Any:
    """:func:`queue_options`, and the command called with the queue they and its
    MODULE:APP argument (``app_path``) name, checked, as ``target`` (see
    :func:`queue_target`) instead of those four parameters."""
    return _with_target(function, with_job_id=False)


def job_command(function: Any) -> Any:
    """:func:`queue_command` for a command on one job: its ``[MODULE:APP] ID``
    arguments read as :func:`app_and_id` reads them, the ID checked first."""
    return _with_target(function, with_job_id=True)


def _with_target(function: Any, *, with_job_id: bool) -> Any:
    @functools.wraps(function)
    async def resolved(
        *,
        app_path: str | None,
        queue_name: str | None,
        shards: int | None,
        redis_url: str | None,
        **kwargs: Any,
    ) -> None:
        if with_job_id:
            app_path, kwargs["job_id"] = app_and_id(app_path, kwargs["job_id"], queue_name)
        # A command that follows (--follow) waits for Redis, as a watch does.
        one_shot = not kwargs.get("follow", False)
        target = queue_target(app_path, queue_name, shards, redis_url, one_shot=one_shot)
        await function(target=target, **kwargs)

    return queue_options(resolved)


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


@click.group(cls=WholeHelpGroup)
def jobs() -> None:
    """Inspect and control an app's job queue: counts, one job, dead jobs; abort a
    job; pause and resume; schedules.

    Name the queue by its app, MODULE:APP (the queue is named after the app, and its
    shard count is the app's job_shards setting), or, for a queue opened with
    open_job_queue(redis, NAME) without an app, by --queue NAME (with --shards and
    --redis-url as needed).
    """


@jobs.command("info")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@queue_command
@json_option
async def jobs_info(
    target: QueueTarget,
    as_json: bool,
) -> None:
    """Show how many jobs a queue holds, by status, priority and job name.

    Queued, scheduled, waiting, running, retrying and dead are the jobs in that state
    now; succeeded, aborted and expired are running totals.
    """
    async with open_target(target, whole=True) as queue:
        if target.app is not None and target.app.jobs:
            # Every queue of the app: a job routed to a named queue is counted there.
            counts = await app_job_counts(target.app)
        else:
            counts = await queue.counts()
    named = named_queues(target)
    undeclared = target.app is not None and not target.app.jobs
    if undeclared and not holds_any(counts):
        refuse_undeclared(target)
    report = info_json(target, counts)
    if named:
        report["named_queues"] = named
    if as_json:
        click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        return
    console = StdoutConsole(highlight=False)
    console.print(
        printable(f"{target.describe()}, Redis at {report['redis_url']}"),
        soft_wrap=True,
        markup=False,
    )
    if named:
        console.print(
            printable(
                f"with its named queue{'s' if len(named) > 1 else ''} {', '.join(named)}, "
                f"counted together (--queue {named[0]} for one alone)"
            ),
            markup=False,
            style="dim",
        )
    if undeclared:
        console.print(
            "the app declares no jobs (@app.job): these were enqueued elsewhere",
            markup=False,
            style="dim",
        )
    console.print()
    console.print(printable(f"queue {target.name}: jobs"), markup=False, style="bold")
    console.print(counts_table(counts))
    if report["by_name"]:
        console.print()
        console.print(printable(f"queue {target.name}: jobs by name"), markup=False, style="bold")
        console.print(by_name_table(report["by_name"]))


async def find_job(target: QueueTarget, queue: JobQueue, job_id: str) -> JobInfo:
    """Job ``job_id``'s record: on the target's queue, or, for an app, on whichever of
    its queues it is (a job routed to a named queue lives there).

    Error handling:
        :class:`~streamkit.jobs.JobNotFound` naming where it was looked for, with a
        hint at the named queues of apps for a queue given by ``--queue``.
    """
    named = named_queues(target)
    queues = [queue]
    if target.app is not None and named:  # queue is the app's default one
        queues += [target.app.job_queues[name.split(".", 1)[1]] for name in named]
    for candidate in queues:
        with contextlib.suppress(JobNotFound):
            return await candidate.info(job_id)
    if named:
        plural = "s" if len(named) > 1 else ""
        hint = f"; not on the app's named queue{plural} {', '.join(named)} either"
    elif target.app is None:
        hint = (
            f" (a job routed to a named queue of an app, @app.job(queue=...), is on"
            f" {target.name}.QUEUE: give MODULE:APP, or --queue {target.name}.QUEUE)"
        )
    else:
        hint = ""
    raise JobNotFound(job_id, queue.name, hint=hint)


def named_queues(target: QueueTarget) -> list[str]:
    """The full names of the named queues of the target's app (``APP.QUEUE``), sorted;
    none for a queue given by ``--queue``."""
    if target.app is None or not target.app.jobs:
        return []
    app = target.app
    return [routed_queue(app.name, short) for short in app.queue_names() if short != DEFAULT_QUEUE]


def holds_any(counts: QueueCounts) -> bool:
    """Whether a queue holds any job, or ever ran one (its totals)."""
    return bool(
        sum(counts.queued.values())
        + counts.scheduled
        + counts.waiting
        + counts.running
        + counts.retrying
        + counts.dead
        + counts.succeeded
        + counts.aborted
        + counts.expired
    )


@jobs.command("show")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@click.argument("job_id", metavar="ID", required=False)
@job_command
@json_option
async def jobs_show(
    target: QueueTarget,
    job_id: str,
    as_json: bool,
) -> None:
    """Show one job: status, arguments, tries, times, worker, progress, last error.

    The last error comes with its traceback, as the worker formatted it.
    """
    async with open_target(target) as queue:
        info = await find_job(target, queue, job_id)
    if as_json:
        click.echo(orjson.dumps(job_json(info), option=orjson.OPT_INDENT_2))
        return
    for line in job_lines(info, datetime.now(UTC)):
        click.echo(line)


@jobs.command("events")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@click.option("--follow", is_flag=True, help="Keep printing new events until interrupted.")
@click.option(
    "--after",
    metavar="CURSOR",
    default=None,
    help="Resume after the event of this cursor (the last column, or the JSON's cursor).",
)
@queue_command
@json_option
async def jobs_events(
    target: QueueTarget,
    follow: bool,
    after: str | None,
    as_json: bool,
) -> None:
    """Print the state changes of a queue's jobs: enqueued, started, progress,
    retried, released, succeeded, dead, aborted, expired; oldest kept first.

    Each shard keeps about 10,000 events. With --json, one JSON object a line.
    """
    try:  # checked before connecting: a cursor of this queue's shards
        event_cursors(after, target.shards)
    except ConfigError as exc:
        fail(f"--after: {exc.reason}", 2)
    # --follow runs until Ctrl-C (or SIGTERM), which ends it cleanly, connecting too
    # (the signal's scope is outside the connecting's), and rides out an outage.
    async with (
        until_signal() if follow else contextlib.nullcontext(),
        open_target(target, whole=True) as queue,
    ):
        await check_declared_or_held(target, queue)
        async for event in queue.events(after=after, follow=follow):
            print_event(event, as_json=as_json)


def refuse_undeclared(target: QueueTarget) -> NoReturn:
    """Exit 2: the app named declares no jobs and its queue holds none (a mistyped
    app, most likely)."""
    assert target.app is not None
    fail(
        f"{target.path}: app {target.app.name} declares no jobs (@app.job), and its "
        f"queue {target.name} holds none",
        2,
    )


async def check_declared_or_held(target: QueueTarget, queue: JobQueue) -> None:
    """:func:`refuse_undeclared` if the app declares no jobs and its queue holds none."""
    if target.app is not None and not target.app.jobs and not holds_any(await queue.counts()):
        refuse_undeclared(target)


def print_event(event: JobEvent, *, as_json: bool) -> None:
    """One job event as ``streamkit jobs events`` prints it: a line, or JSON."""
    if as_json:
        line = {**attrs.asdict(event), "at": iso(event.at, "milliseconds")}
        click.echo(orjson.dumps(line).decode())
        return
    detail = "" if event.detail is None else orjson.dumps(event.detail).decode()
    if len(detail) > 120:
        detail = detail[:119] + "…"
    click.echo(
        printable(
            f"{iso(event.at, 'milliseconds')}  {event.kind:<9}  {event.job_id}  "
            f"{event.name}  {detail}  {event.cursor}"
        )
    )


@jobs.command("abort")
@click.argument("app_path", metavar="[MODULE:APP]", required=False)
@click.argument("job_id", metavar="ID", required=False)
@click.option(
    "--reason",
    default="aborted by streamkit jobs abort",
    show_default=True,
    help="Recorded as the job's error message.",
)
@job_command
async def jobs_abort(
    target: QueueTarget,
    job_id: str,
    reason: str,
) -> None:
    """Abort a job: a job not running ends aborted at once; a running one is
    cancelled by its worker within a second.

    A job that already ended (succeeded, dead, aborted, expired) is left as it is;
    the command says so, with exit code 0. Jobs waiting for it end dead.
    """
    async with open_target(target) as queue:
        handle = await queue.find(job_id)
        info = await handle.info()
        status = await handle.abort(reason)
    what = printable(f"job {job_id} ({info.name})")
    # abort() answers ABORTED for a job it aborted and for one aborted before.
    if status is JobStatus.ABORTED and not info.status.final:
        click.echo(f"aborted {what}")
    elif status is JobStatus.EXECUTING:
        worker = f" on {printable(info.worker)}" if info.worker else ""
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
@limit_option(help="Show at most this many dead jobs; says how many more exist.")
@queue_command
@json_option
async def jobs_dlq_list(
    target: QueueTarget,
    limit: int,
    as_json: bool,
) -> None:
    """Show a queue's dead jobs, oldest first, with their last errors."""
    async with open_target(target, whole=True) as queue:
        await check_declared_or_held(target, queue)
        dead = await queue.dead_letters(limit=limit)
        total = (await queue.counts()).dead
    total = max(total, len(dead))
    if as_json:
        report = {"queue": target.name, "total": total, "jobs": [job_json(i) for i in dead]}
        click.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        return
    if not dead:
        click.echo(f"queue {target.name} has no dead jobs")
        return
    table = dead_jobs_table(target.name, dead, datetime.now(UTC))
    StdoutConsole(highlight=False).print(table)
    if total > len(dead):
        click.echo(
            f"showing {len(dead):,} of {total:,} dead jobs; pass --limit {total} to see them all"
        )


async def act_on_dead_jobs(
    verb: Literal["replay", "purge"],
    *,
    target: QueueTarget,
    ids: tuple[str, ...],
    yes: bool,
) -> None:
    """Confirm, then replay or purge the chosen dead jobs (all by default), one step
    at a time (see :func:`confirm_and_act`).

    Given ids are checked first: if one is not a dead job of the queue, nothing is
    done (exit code 2).
    """
    action = BulkAction(verb=verb, things="dead job(s)", owner=f"of queue {target.name}")
    wanted = list(dict.fromkeys(ids))
    if any(not job_id for job_id in wanted):
        fail(f"--id: a job id is not empty; {action.nothing}", 2)
    listing = f"`streamkit jobs dlq list {target.path}` lists the dead ones"
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
                        f"({listing}); {action.nothing}",
                        2,
                    )
                total = len(wanted)
            else:
                total = (await queue.counts()).dead
                if not total:
                    click.echo(f"queue {target.name} has no dead jobs; {action.nothing}")
                    return
            which = f"{total:,} dead job(s)" if wanted else f"all {total:,} dead job(s)"
            question = (
                f"Replay {which} of queue {target.name}, their tries starting over?"
                if verb == "replay"
                else f"Delete {which} of queue {target.name} for good?"
            )
            act = queue.replay if verb == "replay" else queue.purge
            count = await confirm_and_act(
                action,
                lambda on_progress: act(wanted or None, on_progress=on_progress),
                total=total,
                question=question,
                yes=yes,
            )
    except KeyboardInterrupt:
        fail(f"interrupted; {action.nothing}", 130)
    skipped = total - count if wanted else 0
    tail = f" ({skipped} were no longer dead)" if skipped else ""
    how = ", queued again with their tries reset" if verb == "replay" else ""
    click.echo(f"{action.done} {count:,} dead job(s) of queue {target.name}{how}{tail}")


def _dead_jobs_command(verb: Literal["replay", "purge"], summary: str) -> click.Command:
    """``streamkit jobs dlq replay`` or ``purge``: one command, told apart by its verb."""

    @jobs_dlq.command(verb, help=summary)
    @click.argument("app_path", metavar="[MODULE:APP]", required=False)
    @bulk_options(verb)
    @queue_command
    async def command(
        target: QueueTarget,
        ids: tuple[str, ...],
        yes: bool,
    ) -> None:
        await act_on_dead_jobs(verb, target=target, ids=ids, yes=yes)

    return command


jobs_dlq_replay = _dead_jobs_command(
    "replay", "Queue dead jobs again, with their tries reset: all of them, or those of --id."
)
jobs_dlq_purge = _dead_jobs_command(
    "purge", "Delete dead jobs and their records for good: all of them, or those of --id."
)
