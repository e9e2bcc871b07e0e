"""Background work of an app: plain tasks, interval timers and crontabs.

The schedules are pure functions of the clock (timers use the drift-free
:mod:`streamkit._periodic`), so they are tested on a mock clock; the runners only
sleep until the next time and call the user's function.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

import attrs
import trio
from croniter import croniter

from ._errors import ConfigError
from ._periodic import run_periodically
from ._validate import positive_number

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["BackgroundTask", "next_cron_time", "run_background_task"]

log = logging.getLogger("streamkit.background")

Kind = Literal["task", "timer", "crontab"]


def _valid_cron(
    instance: BackgroundTask, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is not None and not croniter.is_valid(value):
        raise ConfigError("crontab", f"{value!r} is not a valid crontab expression")


@attrs.frozen(kw_only=True)
class BackgroundTask:
    """A function the worker runs beside the processors.

    Attributes:
        name: the function's name, for logs.
        fn: an ``async def`` taking no arguments.
        kind: ``"task"`` runs once (restart it yourself with a loop if it should run
            forever); ``"timer"`` runs every ``interval`` seconds; ``"crontab"`` runs
            at the times ``cron`` describes (local time).
        on_leader: run only on the worker currently elected leader; cancelled when
            leadership is lost and started on the new leader.
    """

    name: str
    fn: Callable[[], Awaitable[object]]
    kind: Kind
    on_leader: bool = False
    interval: float | None = None
    cron: str | None = attrs.field(default=None, validator=_valid_cron)

    def __attrs_post_init__(self) -> None:
        if self.kind == "timer":
            positive_number.check("interval", self.interval)


def next_cron_time(expression: str, now: datetime) -> datetime:
    """The next time after ``now`` that the crontab ``expression`` matches."""
    following: datetime = croniter(expression, now).get_next(datetime)
    return following


async def run_background_task(task: BackgroundTask) -> None:
    """Run ``task`` according to its kind, until cancelled (or, for a task, done).

    Error handling:
        An exception from the function propagates: background work failing is a bug
        the worker must not hide.
    """
    if task.kind == "task":
        await task.fn()
        return
    if task.kind == "timer":
        assert task.interval is not None

        async def fire() -> None:
            log.debug("timer %s firing", task.name)
            await task.fn()

        # Ticks stay on one grid however long a run takes; missed ones are skipped.
        await run_periodically(task.interval, fire, first=task.interval)
    assert task.cron is not None
    while True:
        now = datetime.now().astimezone()
        delay = (next_cron_time(task.cron, now) - now) / timedelta(seconds=1)
        await trio.sleep(max(0.0, delay))
        log.debug("crontab %s firing", task.name)
        await task.fn()
