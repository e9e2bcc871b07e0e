"""Cron jobs: every worker enqueues each tick of a job's schedule, with a job id per
tick, so that the dedupe keeps one run per tick across the fleet."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import trio

from .._errors import RedisUnavailable
from .._redis import retry_idempotent
from ._model import JobCall

if TYPE_CHECKING:
    from ._handle import Job, QueueLike

__all__ = ["run_cron", "tick_id"]

log = logging.getLogger("streamkit.jobs")


async def run_cron(queue: QueueLike, job: Job) -> None:
    """Enqueue each tick of ``job``'s schedule once, with a job id per tick, until
    cancelled; the latest tick missed before it started, if it is not too late."""
    from croniter import croniter

    schedule = job.schedule
    assert schedule is not None
    now = datetime.now(UTC)
    previous: datetime = croniter(schedule.expression, now).get_prev(datetime)
    late = (now - previous).total_seconds()
    if late <= schedule.misfire_grace:
        await _enqueue_tick(queue, job, previous)
    else:
        handle = queue.handle(tick_id(job, previous))
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
                late,
                schedule.misfire_grace,
            )
    tick = croniter(schedule.expression, previous).get_next(datetime)
    while True:
        # Wall-clock times: sleep, then look at the clock again (it may have moved).
        wait = (tick - datetime.now(UTC)).total_seconds()
        if wait > 0:
            await trio.sleep(wait)
            continue
        await _enqueue_tick(queue, job, tick)
        tick = croniter(schedule.expression, tick).get_next(datetime)


def tick_id(job: Job, tick: datetime) -> str:
    """The job id of ``job``'s run at ``tick``: the same on every worker."""
    return f"cron:{job.name}:{int(tick.timestamp())}"


async def _enqueue_tick(queue: QueueLike, job: Job, tick: datetime) -> None:
    try:
        await queue.enqueue_calls(job, [JobCall(job_id=tick_id(job, tick))])
    except RedisUnavailable as exc:
        log.warning("cron job %s: could not enqueue the tick of %s: %s", job.name, tick, exc)
    else:
        log.debug("cron job %s: tick %s", job.name, tick.isoformat())
