"""Enqueueing: the enqueue script's per-job options, and a batch of jobs sent in
bounded calls (by count, dependencies and bytes), a few at a time."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
import trio

from .._errors import ConfigError
from .._redis import LuaScript, call_once
from .._validate import positive_number
from . import _scripts
from ._batches import chunks
from ._model import PRIORITIES

if TYPE_CHECKING:
    from ._handle import QueueLike
    from ._model import JobCall, JobRef, When

__all__ = ["at_ms", "ms", "options_field", "send_jobs"]

#: Jobs (and the dependencies they name) per enqueue script call, at most.
ENQUEUE_CHUNK = 250

_ENQUEUE = LuaScript(_scripts.ENQUEUE_LUA)


def options_field(call: JobCall, after: list[JobRef]) -> bytes:
    """The per-job options field of the enqueue script: "" when there are none."""
    opts: dict[str, Any] = {}
    if call.priority is not None:
        opts["p"] = PRIORITIES[call.priority]
    if call.delay is not None:
        opts["d"] = ms(call.delay, "delay")
    if call.at is not None:
        opts["a"] = at_ms(call.at, "at")
    if call.expires is not None:
        opts["e"] = (
            at_ms(call.expires, "expires")
            if isinstance(call.expires, datetime)
            else -ms(call.expires, "expires")
        )
    if call.job_id is not None:
        opts["w"] = 1
    if after:
        opts["after"] = [h.id for h in after]
    return orjson.dumps(opts) if opts else b""


def ms(value: When | None, name: str) -> int:
    """``value`` (seconds or a ``timedelta``) in whole milliseconds, 0 for ``None``."""
    if value is None:
        return 0
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    positive_number.check(name, seconds) if seconds != 0 else None
    return math.ceil(seconds * 1000)


def at_ms(value: datetime | None, name: str) -> int:
    """The Unix time of ``value`` (timezone-aware) in milliseconds, 0 for ``None``."""
    if value is None:
        return 0
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ConfigError(name, f"must be a timezone-aware datetime, got {value!r}")
    return math.ceil(value.timestamp() * 1000)


async def send_jobs(
    queue: QueueLike,
    shard: int,
    defaults: tuple[Any, ...],
    fields: list[Any],
    costs: list[int] | None,
) -> None:
    """Send one shard's jobs (``fields``: id, args, options of each), in calls of at
    most ``ENQUEUE_CHUNK`` jobs and dependencies and about ``MAX_CALL_BYTES``, a
    few calls at a time."""
    keys = queue.shard_keys[shard]
    sizes = [
        len(fields[i]) + len(fields[i + 1]) + len(fields[i + 2]) for i in range(0, len(fields), 3)
    ]
    calls = list(chunks(sizes, max_cost=ENQUEUE_CHUNK, costs=costs))

    async def send(jobs: range) -> None:
        await call_once(
            _ENQUEUE,
            queue.redis,
            keys.keys,
            (keys.base, *defaults, *fields[3 * jobs.start : 3 * jobs.stop]),
            what=f"enqueueing jobs on {queue.name}",
        )

    if len(calls) == 1:
        await send(calls[0])
        return
    # A few calls in flight at once: the server runs one while the next arrives.
    limiter = trio.CapacityLimiter(4)

    async def limited(jobs: range) -> None:
        async with limiter:
            await send(jobs)

    async with trio.open_nursery() as nursery:
        for jobs in calls:
            nursery.start_soon(limited, jobs)
