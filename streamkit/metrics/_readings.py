"""Readings from Redis for the metrics that need a round trip: lag and pending per
owned partition, late window events per owned partition, dead letters waiting, job
queue depths.

A background task refreshes them every few seconds (one pipeline per processor) into
plain values that the collector reads: a scrape never waits for Redis.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import BackendError, StreamkitError
from .._group_lag import undelivered
from .._periodic import next_tick
from .._redis import redis_errors
from .._state_late import late_counts, late_fields, late_keys, windowed_names
from .._wire import text

if TYPE_CHECKING:
    from .._redis import Redis
    from ..jobs import QueueCounts
    from ._source import Executor, Worker

__all__ = ["GroupReading", "Readings", "read_groups"]

log = logging.getLogger("streamkit.metrics")


@attrs.frozen
class GroupReading:
    """One partition's consumer group, as Redis reported it.

    Attributes:
        lag: entries not yet delivered to the group (``None``: more than a thousand,
            and Redis cannot tell how many).
        pending: entries delivered and not yet acknowledged.
    """

    lag: int | None
    pending: int


def _group_fields(groups: Any, group: str) -> dict[str, Any] | None:
    for info in groups or ():
        fields = {text(k): v for k, v in info.items()}
        if text(fields.get("name", b"")) == group:
            return fields
    return None


async def read_groups(redis: Redis, keys: list[str], group: str) -> list[GroupReading | None]:
    """``group``'s reading on each stream of ``keys`` (``None`` where it has none).

    One pipeline (each stream's groups, newest entry and length); if a stream is
    missing (it makes the pipeline fail), one command per stream instead. The lag is
    not Redis's own, which a restart from the AOF can leave wrong, but found from the
    entry ids (:func:`streamkit._group_lag.undelivered`): one more command for each
    stream with entries not delivered to the group yet.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    replies: list[Any]
    try:
        with redis_errors():
            async with redis.pipeline(transaction=False) as pipe:
                requests = [pipe.xinfo_groups(key) for key in keys]
            replies = [await request for request in requests]
    except StreamkitError as exc:
        if not _is_reply_error(exc):
            raise
        replies = []
        for key in keys:
            try:
                with redis_errors():
                    replies.append(await redis.xinfo_groups(key))
            except StreamkitError as exc:
                if not _is_reply_error(exc):
                    raise
                replies.append(None)
    found = [_group_fields(reply, group) for reply in replies]
    present = [key for key, fields in zip(keys, found, strict=True) if fields is not None]
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            newest_requests = {key: pipe.xrevrange(key, count=1) for key in present}
            length_requests = {key: pipe.xlen(key) for key in present}
        newest = {key: await request for key, request in newest_requests.items()}
        lengths = {key: int(await request) for key, request in length_requests.items()}
    readings: list[GroupReading | None] = []
    for key, fields in zip(keys, found, strict=True):
        if fields is None:
            readings.append(None)
            continue
        last = newest[key]
        lag = await undelivered(
            redis, key, fields, newest=last[0].identifier if last else None, length=lengths[key]
        )
        readings.append(GroupReading(lag, int(fields.get("pending", 0))))
    return readings


def _is_reply_error(exc: StreamkitError) -> bool:
    """Whether Redis answered with an error (a missing stream), not failed to answer."""
    return isinstance(exc, BackendError)


@attrs.define(eq=False)
class Readings:
    """The latest readings of a worker's partitions and job queue.

    Attributes:
        groups: per processor name, per partition owned at the last refresh, its
            consumer group's reading.
        dead_letters: per processor name, the length of its dead-letter stream.
        late: per processor name (writing windowed tables), per partition owned at the
            last refresh, its late events by windowed table, as committed.
        jobs: the job queue's counts, if the worker runs jobs.
        refreshed_at: Trio-clock time of the last successful refresh (``None``: none
            yet, or the last one failed, so there is nothing current to report).
    """

    groups: dict[str, dict[int, GroupReading]] = attrs.field(factory=dict)
    dead_letters: dict[str, int] = attrs.field(factory=dict)
    late: dict[str, dict[int, dict[str, int]]] = attrs.field(factory=dict)
    jobs: QueueCounts | None = None
    refreshed_at: float | None = None

    def clear(self) -> None:
        self.groups = {}
        self.dead_letters = {}
        self.late = {}
        self.jobs = None
        self.refreshed_at = None

    async def refresh(self, worker: Worker) -> None:
        """Read everything again from Redis.

        Error handling:
            :class:`~streamkit.StreamkitError` (Redis unavailable, say); the previous
            readings are dropped first, so nothing stale is reported.
        """
        redis = worker.app.redis
        groups: dict[str, dict[int, GroupReading]] = {}
        dead_letters: dict[str, int] = {}
        late: dict[str, dict[int, dict[str, int]]] = {}
        try:
            for executor in list(worker.executors):
                name = executor.processor.name
                groups[name], dead_letters[name] = await _read_executor(redis, executor)
                counts = await _read_late(redis, executor)
                if counts is not None:
                    late[name] = counts
            jobs = await worker.app.job_queue.counts() if worker.jobs is not None else None
        except BaseException:
            self.clear()
            raise
        self.groups, self.dead_letters, self.late, self.jobs = groups, dead_letters, late, jobs
        self.refreshed_at = trio.current_time()

    async def run(
        self,
        worker: Worker,
        interval: float,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Refresh every ``interval`` seconds (drift-free) until cancelled; a failed
        refresh is logged (once until one succeeds again) and tried at the next tick."""
        task_status.started()
        start = trio.current_time()
        failing = False
        while True:
            try:
                # A refresh that hangs must not outlive its tick.
                with trio.fail_after(interval):
                    await self.refresh(worker)
            except (StreamkitError, trio.TooSlowError) as exc:
                self.clear()
                if not failing:
                    log.warning(
                        "metrics: reading lag and queue depths failed: %s", exc or "timeout"
                    )
                failing = True
            else:
                if failing:
                    log.info("metrics: reading lag and queue depths again")
                failing = False
            await trio.sleep_until(next_tick(start, interval, trio.current_time()))


async def _read_executor(redis: Redis, executor: Executor) -> tuple[dict[int, GroupReading], int]:
    processor = executor.processor
    owned = sorted(executor.rebalancer.owned.value)
    keys = [processor.stream.key(p) for p in owned]
    readings = await read_groups(redis, keys, processor.group) if keys else []
    with redis_errors():
        dead = await redis.xlen(processor.keys.dead_letter_key)
    return {p: r for p, r in zip(owned, readings, strict=True) if r is not None}, int(dead)


async def _read_late(redis: Redis, executor: Executor) -> dict[int, dict[str, int]] | None:
    """Per owned partition, the late events of each windowed table the processor
    writes (``None`` if it writes none): one ``HMGET`` per partition, pipelined."""
    processor = executor.processor
    names = windowed_names(processor.tables)
    if not names:
        return None
    owned = sorted(executor.rebalancer.owned.value)
    spec = processor.stream.spec
    keys = late_keys(spec.app, spec.name, processor.name, owned)
    fields = late_fields(names)
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            requests = [pipe.hmget(key, fields) for key in keys]
        replies = [await request for request in requests]
    return {p: late_counts(names, r) for p, r in zip(owned, replies, strict=True)}
