"""Schedules: every worker enqueues each tick of a schedule, with a job id per tick, so
that the dedupe keeps one run per tick across the fleet.

Two kinds: a job declared with a schedule (``@app.cron``), known to the code of every
worker; and schedules added, changed and removed at runtime (:meth:`JobQueue.
set_schedule <streamkit.jobs.JobQueue.set_schedule>`), kept in Redis (a hash on the
queue's shard 0, with a version number that each change bumps), which every worker
reads again when the version moves (it looks every second).

:func:`run_ticks` is the timing of one schedule, on a clock it is given, so that it is
tested on Trio's mock clock across a daylight-saving change.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
import orjson
import trio

from .._errors import ConfigError, RedisUnavailable
from .._lua import script
from .._redis import LuaScript, health_of, retry_idempotent
from .._wire import text
from ._crontime import next_tick
from ._layout import shard_for
from ._limits import limit_key_of, limit_shard
from ._model import JobCall, Schedule
from ._outcome import describe

if TYPE_CHECKING:
    from ._handle import Job, JobDecorator, QueueLike

__all__ = [
    "ScheduleInfo",
    "Ticking",
    "check_schedulable",
    "cron_decorator",
    "remove_schedule",
    "run_schedules",
    "run_ticks",
    "set_schedule",
    "tick_id",
    "timezone",
]

log = logging.getLogger("streamkit.jobs")

#: How often a worker looks for changes to the runtime schedules (seconds).
SCHEDULES_POLL = 1.0
#: Longest sleep between two looks at the wall clock while waiting for a tick (s).
_NAP = 60.0

_SCHEDULE = LuaScript(script("jobs/schedule"))

Clock = Callable[[], datetime]


def wall_clock() -> datetime:
    """The wall clock, in UTC."""
    return datetime.now(UTC)


def timezone(name: str | None) -> ZoneInfo | None:
    """The timezone named ``name`` (an IANA name such as ``"Europe/Paris"``).

    Error handling:
        :class:`~streamkit.ConfigError` for a name the timezone database does not know.
    """
    if name is None:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            "tz", f"unknown timezone {name!r} (an IANA name, like 'Europe/Paris')"
        ) from None


def check_expression(expression: str) -> None:
    """Raise :class:`~streamkit.ConfigError` unless ``expression`` is a crontab
    expression croniter accepts."""
    from croniter import croniter

    if not isinstance(expression, str) or not croniter.is_valid(expression):
        raise ConfigError("cron", f"{expression!r} is not a valid crontab expression")


def cron_decorator(
    declare: Callable[[Callable[..., Any]], Job[Any, Any]],
    expression: str,
    *,
    misfire_grace: float,
    tz: str | None,
) -> JobDecorator:
    """The decorator ``@queue.cron(...)`` and ``@app.cron(...)`` return: it declares
    the function with ``declare`` (the queue's or the app's ``job``) and gives the job
    its schedule. ``expression``, ``tz`` and ``misfire_grace`` are checked now.

    Error handling:
        :class:`~streamkit.ConfigError` for a bad expression, timezone or grace, or
        (when it declares the function) a debounced or throttled job.
    """
    check_expression(expression)
    timezone(tz)
    schedule = Schedule(expression=expression, misfire_grace=misfire_grace, tz=tz)

    def scheduled(fn: Callable[..., Any]) -> Job[Any, Any]:
        job = declare(fn)
        if job.options.coalesced is not None:
            raise ConfigError(
                job.options.coalesced, f"cron job {job.name}: its schedule says when it runs"
            )
        check_schedulable(job, (), {}, what=f"cron job {job.name}")
        job.schedule = schedule
        return job

    return cast("JobDecorator", scheduled)


@attrs.frozen(kw_only=True)
class Ticking:
    """The timing of one schedule.

    Attributes:
        name: what the log lines call it.
        expression: its crontab expression.
        tz: its timezone (``None``: UTC).
        misfire_grace: a tick missed by at most this many seconds still runs.
        since: no tick before this (a schedule added at runtime), if set.
    """

    name: str
    expression: str
    tz: ZoneInfo | None
    misfire_grace: float
    since: datetime | None = None


async def run_ticks(
    ticking: Ticking,
    fire: Callable[[datetime], Awaitable[None]],
    *,
    clock: Clock = wall_clock,
    skipped: Callable[[datetime], Awaitable[None]] | None = None,
) -> None:
    """Call ``fire(tick)`` at each tick of ``ticking``, on ``clock``, until cancelled.

    First the latest tick missed before now, if it is at most ``misfire_grace`` late
    (and not before ``since``). A tick found more than ``misfire_grace`` late when
    its time comes (the clock jumped, the process was frozen) is skipped, and the
    next tick within the grace is run instead; ``skipped`` hears of the latest tick
    missed before it started, when it was too late.
    """
    grace = timedelta(seconds=ticking.misfire_grace)
    expression, tz = ticking.expression, ticking.tz
    now = clock()
    horizon = now - grace
    if ticking.since is not None and ticking.since > horizon:
        horizon = ticking.since - timedelta(microseconds=1)
    last = None
    tick = next_tick(expression, tz, horizon)
    while tick <= now:
        last, tick = tick, next_tick(expression, tz, tick)
    if last is not None:
        await fire(last)
    elif skipped is not None and ticking.since is None:
        await skipped(now)
    while True:
        now = clock()
        wait = (tick - now).total_seconds()
        if wait > 0:
            # Wall-clock times: sleep, then look at the clock again (it may have moved).
            await trio.sleep(min(wait, _NAP))
            continue
        if now - tick > grace:
            log.info(
                "schedule %s: skipped ticks missed by over %gs (misfire_grace), up to %s",
                ticking.name,
                ticking.misfire_grace,
                tick.isoformat(),
            )
            tick = next_tick(expression, tz, now - grace)
            continue
        await fire(tick)
        tick = next_tick(expression, tz, tick)


def check_schedulable(
    job: Job[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any], *, what: str
) -> None:
    """Raise :class:`~streamkit.ConfigError` unless a schedule (``what``) can enqueue
    ``job`` with ``args`` and ``kwargs`` at each tick: not a debounced or throttled
    job (its key places it; a tick has an id of its own), nor one whose limit key
    fails on those arguments. (The arguments are checked against the function
    before.)"""
    options = job.options
    if options.coalesced is not None:
        raise ConfigError(
            options.coalesced,
            f"{what}: job {job.name} is {options.coalesced}d by its key, and a schedule "
            f"enqueues each tick with an id of its own; schedule a job without "
            f"{options.coalesced}=",
        )
    if options.limit_key is not None:
        try:
            limit_key_of(job.name, options.limit_key, job.bind_arguments, args, kwargs)
        except ConfigError as exc:
            why = str(exc).removeprefix(f"{exc.setting}: ")
            raise ConfigError("limit_key", f"{what}: {why}") from None
        except Exception as exc:  # the job's own limit_key function
            raise ConfigError(
                "limit_key",
                f"{what}: the limit_key of job {job.name} fails on its arguments: {describe(exc)}",
            ) from exc


def tick_id(name: str, tick: datetime, *, runtime: bool = False) -> str:
    """The job id of schedule ``name``'s run at ``tick``: the same on every worker
    (``cron:NAME:UNIX_TIME`` for a declared job, ``sched:NAME:UNIX_TIME`` for a
    schedule added at runtime)."""
    return f"{'sched' if runtime else 'cron'}:{name}:{int(tick.timestamp())}"


def _fitting_id(queue: QueueLike, job: Job[Any, Any], job_id: str, call: JobCall) -> str:
    """``job_id``, or, for a job whose limits bind it to a shard its id does not map
    to, the id with the smallest suffix ``~N`` that does (the same on every worker)."""
    options = job.options
    key = None
    if options.limit_key is not None:
        key = limit_key_of(job.name, options.limit_key, job.bind_arguments, call.args, call.kwargs)
    home = limit_shard(job.name, key, options.limited_by_name, queue.shards)
    if home is None or shard_for(job_id, queue.shards) == home:
        return job_id
    n = 1
    while shard_for(f"{job_id}~{n}", queue.shards) != home:
        n += 1
    return f"{job_id}~{n}"


async def enqueue_tick(
    queue: QueueLike,
    job: Job[Any, Any],
    what: str,
    tick: datetime,
    job_id: str,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    said: set[str] | None = None,
) -> None:
    """Enqueue the run of ``job`` at ``tick``, deduplicated by ``job_id`` (``what``
    names the schedule in the log lines).

    Error handling:
        A tick that cannot be enqueued (Redis unreachable, or a call the queue refuses:
        a schedule set by an older version, a limit key that fails) is logged and
        skipped: one bad schedule never stops a worker. ``said`` keeps the causes
        logged already, so that a cause is said once per schedule, not every tick.
    """
    try:
        call = JobCall(args=args, kwargs=kwargs or {})
        call = attrs.evolve(call, job_id=_fitting_id(queue, job, job_id, call))
        await queue.enqueue_calls(job, [call])
    except RedisUnavailable as exc:
        log.warning("%s: could not enqueue the tick of %s: %s", what, tick.isoformat(), exc)
    except Exception as exc:
        cause = describe(exc)
        if said is None or cause not in said:
            if said is not None:
                said.add(cause)
            log.error(
                "%s: its ticks cannot be enqueued (%s); skipped (said once) until it is "
                "changed or removed",
                what,
                cause,
                exc_info=exc,
            )
    else:
        log.debug("%s: tick %s", what, tick.isoformat())


async def run_cron(queue: QueueLike, job: Job[Any, Any], *, clock: Clock = wall_clock) -> None:
    """Enqueue each tick of ``job``'s declared schedule once, until cancelled."""
    schedule = job.schedule
    assert schedule is not None

    said: set[str] = set()

    async def fire(tick: datetime) -> None:
        await enqueue_tick(
            queue, job, f"cron job {job.name}", tick, tick_id(job.name, tick), said=said
        )

    async def skipped(now: datetime) -> None:
        from croniter import croniter

        previous: datetime = croniter(
            schedule.expression, now.astimezone(timezone(schedule.tz) or UTC)
        ).get_prev(datetime)
        handle = queue.handle(tick_id(job.name, previous))
        exists = await retry_idempotent(
            queue.redis.exists,
            [queue.shard_keys[handle.shard].job(handle.id)],
            what="checking a cron tick",
        )
        if not exists:
            log.info(
                "cron job %s: skipped the tick of %s, missed while no worker ran "
                "(%.0fs late; misfire_grace is %gs)",
                job.name,
                previous.isoformat(),
                (now - previous).total_seconds(),
                schedule.misfire_grace,
            )

    ticking = Ticking(
        name=job.name,
        expression=schedule.expression,
        tz=timezone(schedule.tz),
        misfire_grace=schedule.misfire_grace,
    )
    await run_ticks(ticking, fire, clock=clock, skipped=skipped)


# ---------------------------------------------------------------- runtime schedules


@attrs.frozen(kw_only=True)
class ScheduleInfo:
    """A schedule of a queue (see :meth:`JobQueue.schedules`).

    Attributes:
        name: its name (a declared cron job's: the job's name).
        job: the job it enqueues.
        expression: its crontab expression.
        tz: its timezone (``None``: UTC).
        args: the positional arguments of each run.
        kwargs: the keyword arguments of each run.
        misfire_grace: a tick missed by at most this many seconds still runs.
        declared: whether it is declared in code (``@app.cron``) rather than added at
            runtime.
        next_at: when it ticks next.
    """

    name: str
    job: str
    expression: str
    tz: str | None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    misfire_grace: float = 60.0
    declared: bool = False
    next_at: datetime | None = None


def _encode(info: ScheduleInfo, since_ms: int) -> bytes:
    return orjson.dumps(
        {
            "job": info.job,
            "cron": info.expression,
            "tz": info.tz,
            "args": list(info.args),
            "kwargs": info.kwargs,
            "grace": info.misfire_grace,
            "since": since_ms,
        }
    )


def decode_schedule(name: str, raw: bytes, now: datetime | None = None) -> ScheduleInfo | None:
    """A runtime schedule as stored; ``None`` if it does not decode."""
    try:
        data = orjson.loads(raw)
        info = ScheduleInfo(
            name=name,
            job=str(data["job"]),
            expression=str(data["cron"]),
            tz=data.get("tz"),
            args=tuple(data.get("args") or ()),
            kwargs=dict(data.get("kwargs") or {}),
            misfire_grace=float(data.get("grace", 60.0)),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    if now is not None:
        try:
            info = attrs.evolve(info, next_at=next_tick(info.expression, timezone(info.tz), now))
        except Exception:  # a schedule someone wrote by hand: shown, never run
            return info
    return info


async def set_schedule(queue: QueueLike, info: ScheduleInfo) -> None:
    """Add or change the runtime schedule ``info.name`` of ``queue``."""
    keys = queue.shard_keys[0]
    since = int(wall_clock().timestamp() * 1000)
    await retry_idempotent(
        _SCHEDULE,
        queue.redis,
        keys.keys,
        (keys.base, "set", info.name, _encode(info, since)),
        what="setting a schedule",
    )


async def remove_schedule(queue: QueueLike, name: str) -> bool:
    """Remove the runtime schedule ``name`` of ``queue``; whether there was one."""
    keys = queue.shard_keys[0]
    removed = await retry_idempotent(
        _SCHEDULE, queue.redis, keys.keys, (keys.base, "del", name, ""), what="removing a schedule"
    )
    return bool(removed)


async def read_schedules(queue: QueueLike) -> dict[str, bytes]:
    """The runtime schedules of ``queue`` as stored, by name."""
    raw = await retry_idempotent(
        queue.redis.hgetall, queue.shard_keys[0].schedules, what="reading schedules"
    )
    return {text(name): value for name, value in raw.items()}


@attrs.define(eq=False)
class _Running:
    raw: bytes
    scope: trio.CancelScope


async def run_schedules(
    queue: QueueLike, jobs: dict[str, Job[Any, Any]], *, clock: Clock = wall_clock
) -> None:
    """Run the declared schedules of ``jobs`` and the runtime schedules of ``queue``
    whose jobs are among ``jobs``, following the changes to the latter, until
    cancelled."""
    async with trio.open_nursery() as nursery:
        for job in jobs.values():
            if job.schedule is not None:
                nursery.start_soon(functools.partial(run_cron, queue, job, clock=clock))
        running: dict[str, _Running] = {}
        version: Any = None
        unknown: set[str] = set()
        while True:
            try:
                now_version = await retry_idempotent(
                    queue.redis.get, queue.shard_keys[0].schedules_version, what="reading schedules"
                )
                if now_version != version:
                    stored = await read_schedules(queue)
                    version = now_version
                    for name in list(running):
                        if stored.get(name) != running[name].raw:
                            running.pop(name).scope.cancel(f"schedule {name} changed")
                    for name, raw in stored.items():
                        if name not in running:
                            scope = _start(nursery, queue, jobs, name, raw, clock, unknown)
                            if scope is not None:
                                running[name] = _Running(raw, scope)
            except RedisUnavailable as exc:
                # An outage: said once for the whole worker, by its outage log.
                health_of(queue.redis).unavailable(exc, what="reading the schedules")
            await trio.sleep(SCHEDULES_POLL)


def _start(
    nursery: trio.Nursery,
    queue: QueueLike,
    jobs: dict[str, Job[Any, Any]],
    name: str,
    raw: bytes,
    clock: Clock,
    unknown: set[str],
) -> trio.CancelScope | None:
    """Start running the runtime schedule ``name``; its scope, or ``None`` if this
    worker cannot run it (its job is not among ``jobs``, or it does not decode)."""
    info = decode_schedule(name, raw)
    job = jobs.get(info.job) if info is not None else None
    try:
        since = datetime.fromtimestamp(orjson.loads(raw)["since"] / 1000, UTC)
        tz = timezone(info.tz if info is not None else None)
        if info is not None:
            check_expression(info.expression)
    except Exception:  # written by hand, or by a newer version: shown, never run
        job = None
    if info is None or job is None:
        if name not in unknown:
            unknown.add(name)
            log.info("schedule %s: not run by this worker (its job is not one it runs)", name)
        return None
    try:
        job.check_arguments(info.args, info.kwargs)
        check_schedulable(job, info.args, info.kwargs, what=f"schedule {name}")
    except (ConfigError, TypeError) as exc:
        # Set by a producer that could not check it (a queue by name alone, an older
        # version), or before the job changed: never run, said once per cause.
        cause = f"{name}: {exc}"
        if cause not in unknown:
            unknown.add(cause)
            log.error("schedule %s: not run: %s (change or remove it)", name, exc)
        return None
    ticking = Ticking(
        name=name,
        expression=info.expression,
        tz=tz,
        misfire_grace=info.misfire_grace,
        since=since,
    )
    scope = trio.CancelScope()
    said: set[str] = set()

    async def fire(tick: datetime) -> None:
        await enqueue_tick(
            queue,
            job,
            f"schedule {name}",
            tick,
            tick_id(name, tick, runtime=True),
            info.args,
            info.kwargs,
            said,
        )

    async def run() -> None:
        with scope:
            await run_ticks(ticking, fire, clock=clock)

    nursery.start_soon(run)
    return scope
