"""What a queue holds: its counts by status, and its dead letters, read, replayed and
purged, each in bounded steps."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs

from .._lua import script
from .._redis import LuaScript, retry_idempotent
from .._wire import text
from . import _scripts
from ._handle import decode_info
from ._model import PRIORITIES

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from .._redis import Redis
    from ._handle import QueueLike
    from ._layout import ShardKeys
    from ._model import JobInfo

__all__ = ["QueueCounts", "act_on_dead", "count_jobs", "merge_counts", "read_dead_letters"]

#: Dead jobs replayed or purged per script call.
_DEAD_CHUNK = 200
#: Entries per read of a dead-letter stream.
_PAGE = 1000

_COUNTS = LuaScript(script("jobs/counts"))
REPLAY = LuaScript(script("jobs/replay"))
PURGE = LuaScript(script("jobs/purge"))


@attrs.frozen(kw_only=True)
class QueueCounts:
    """How many jobs a queue holds, by status (see :meth:`JobQueue.counts`).

    Attributes:
        queued: jobs in the ready queue of each priority, not running (retries that
            are due included).
        scheduled: jobs waiting for their time.
        waiting: jobs waiting for the jobs they depend on.
        running: jobs running now.
        retrying: jobs whose last try failed, waiting for their next try (in the
            schedule, or due and queued).
        dead: jobs in the dead-letter queue.
        succeeded: jobs that succeeded (a running total).
        aborted: jobs aborted (a running total).
        expired: jobs expired (a running total).
        pending: jobs not over yet (sent, scheduled, waiting, held, running or
            retrying), each counted once.
        by_name: the same counts per job name: name -> status -> count.
        held: jobs held back by a rate limit, a concurrency limit or a pause.
    """

    queued: dict[str, int]
    scheduled: int
    waiting: int
    running: int
    retrying: int
    dead: int
    succeeded: int
    aborted: int
    expired: int
    pending: int
    by_name: dict[str, dict[str, int]]
    held: int = 0


def merge_counts(counts: Sequence[QueueCounts]) -> QueueCounts:
    """The counts of several queues (an app's default and named queues) as one: each
    count summed, by priority and by job name too (a job name lives on one queue, the
    one it is routed to, so its row is that queue's)."""
    queued: dict[str, int] = {}
    by_name: dict[str, dict[str, int]] = {}
    for one in counts:
        for priority, n in one.queued.items():
            queued[priority] = queued.get(priority, 0) + n
        for name, per_status in one.by_name.items():
            mine = by_name.setdefault(name, {})
            for status, n in per_status.items():
                mine[status] = mine.get(status, 0) + n
    return QueueCounts(
        queued=queued,
        scheduled=sum(c.scheduled for c in counts),
        waiting=sum(c.waiting for c in counts),
        running=sum(c.running for c in counts),
        retrying=sum(c.retrying for c in counts),
        dead=sum(c.dead for c in counts),
        succeeded=sum(c.succeeded for c in counts),
        aborted=sum(c.aborted for c in counts),
        expired=sum(c.expired for c in counts),
        pending=sum(c.pending for c in counts),
        by_name=by_name,
        held=sum(c.held for c in counts),
    )


async def count_jobs(queue: QueueLike) -> QueueCounts:
    """How many jobs ``queue`` holds, by status, priority and job name."""
    by_name: dict[str, dict[str, int]] = {}
    queued = dict.fromkeys(PRIORITIES, 0)
    for keys in queue.shard_keys:
        # Read in steps of PENDING_BUDGET pending entries: one step, unless many
        # jobs run or were put back.
        cursors: list[Any] = ["-", "-", "-"]
        first = True
        while any(cursors):
            flat, lengths, running, cursors = await retry_idempotent(
                _COUNTS,
                queue.redis,
                keys.keys,
                (keys.base, _scripts.PENDING_BUDGET, *cursors),
                what="counting jobs",
            )
            cursors = [text(c) for c in cursors]
            if first:
                first = False
                for field, value in zip(flat[::2], flat[1::2], strict=True):
                    status, _, name = text(field).partition("|")
                    slot = by_name.setdefault(name, {})
                    slot[status] = slot.get(status, 0) + int(value)
                for prio, length in zip(PRIORITIES, lengths, strict=True):
                    queued[prio] += int(length)
            for prio, count in zip(PRIORITIES, running, strict=True):
                queued[prio] -= int(count)
    totals: dict[str, int] = {}
    for per_status in by_name.values():
        for status, value in per_status.items():
            totals[status] = totals.get(status, 0) + value
    return QueueCounts(
        queued=queued,
        scheduled=totals.get("scheduled", 0),
        waiting=totals.get("waiting", 0),
        running=totals.get("executing", 0),
        retrying=totals.get("retry", 0),
        dead=totals.get("dead", 0),
        succeeded=totals.get("success", 0),
        aborted=totals.get("aborted", 0),
        expired=totals.get("expired", 0),
        pending=sum(
            totals.get(status, 0)
            for status in ("sent", "scheduled", "waiting", "held", "executing", "retry")
        ),
        by_name={n: s for n, s in sorted(by_name.items()) if any(s.values())},
        held=totals.get("held", 0),
    )


async def read_dead_letters(queue: QueueLike, limit: int | None) -> list[JobInfo]:
    """The jobs in ``queue``'s dead-letter queue, oldest first, with their errors."""
    out: list[tuple[int, JobInfo]] = []
    for keys in queue.shard_keys:
        # The oldest `limit` of every shard, merged by when they died.
        async for entries in _dead_entries(queue.redis, keys, limit):
            job_ids = [text(entry.field_values[b"id"]) for entry in entries]
            # A page's jobs in one pipeline: one round trip, not one per job.
            every_fields = await retry_idempotent(
                _hgetall_many,
                queue.redis,
                [keys.job(job_id) for job_id in job_ids],
                what="reading dead jobs",
            )
            for entry, job_id, fields in zip(entries, job_ids, every_fields, strict=True):
                if fields.get(b"status") == b"dead":
                    died = int(text(entry.identifier).partition("-")[0])
                    out.append((died, decode_info(queue.name, job_id, fields)))
    out.sort(key=lambda pair: pair[0])
    return [info for _, info in out[:limit]]


async def _dead_entries(
    redis: Redis, keys: ShardKeys, limit: int | None
) -> AsyncIterator[list[Any]]:
    """The entries of a shard's dead-letter stream, oldest first, ``limit`` at
    most, in pages of ``_PAGE`` (one read never walks the whole stream)."""
    start, left = "-", math.inf if limit is None else limit
    while left > 0:
        count = int(min(left, _PAGE))
        page = await retry_idempotent(
            redis.xrange, keys.dead, start, "+", count, what="reading dead jobs"
        )
        if page:
            yield list(page)
        if len(page) < count:
            return
        left -= len(page)
        start = "(" + text(page[-1].identifier)


async def _hgetall_many(redis: Redis, keys: list[str]) -> list[dict[bytes, bytes]]:
    if not keys:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        requests = [pipe.hgetall(key) for key in keys]
    return [await request for request in requests]


async def act_on_dead(
    queue: QueueLike,
    script: LuaScript,
    ids: Sequence[str] | None,
    what: str,
    on_progress: Callable[[int, int], object] | None,
) -> list[str]:
    """Run ``script`` (replay or purge) over dead jobs, ``_DEAD_CHUNK`` a call: those
    in ``ids``, or every dead job of every shard; the ids it acted on."""
    done: list[str] = []
    grouped: dict[int, list[str]] = {}
    if ids is None:
        # Every shard's own dead jobs: a job without an id of the caller's lives on
        # the shard it was sent to (round robin), not on the one its id hashes to.
        for keys in queue.shard_keys:
            grouped[keys.shard] = [
                text(entry.field_values[b"id"])
                async for entries in _dead_entries(queue.redis, keys, None)
                for entry in entries
            ]
    else:
        for job_id in ids:
            handle = await queue.find(job_id)
            grouped.setdefault(handle.shard, []).append(job_id)
    for shard, group in grouped.items():
        keys = queue.shard_keys[shard]
        for i in range(0, len(group), _DEAD_CHUNK):
            step = group[i : i + _DEAD_CHUNK]
            reply = await retry_idempotent(
                script, queue.redis, keys.keys, (keys.base, *step), what=what
            )
            done.extend(text(x) for x in reply)
            if on_progress is not None:
                on_progress(len(step), len(reply))
    return done
