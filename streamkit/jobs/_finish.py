"""Recording the outcomes of ended tries (fenced, batched per shard), and renewing the
leases of the running ones.

Both are fenced by the claim's token: a worker whose lease ran out (paused, cut off)
records nothing, and the renewal that finds a job taken over or aborted cancels its try.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio
from trio_util import AsyncValue

from .._backoff import Backoff, retry_unavailable
from .._errors import RedisUnavailable
from .._meter import TIMING, JobMeter
from .._periodic import next_tick
from .._redis import LuaScript, retry_idempotent
from .._wire import text
from . import _scripts

if TYPE_CHECKING:
    from ._handle import QueueLike
    from ._tries import Tries, Try

__all__ = ["UNKNOWN_JOB", "Outbox", "renew_leases"]

log = logging.getLogger("streamkit.jobs")

_FINISH = LuaScript(_scripts.FINISH_LUA)
_RENEW = LuaScript(_scripts.RENEW_LUA)

#: The outcomes of tries counted for streamkit.metrics, by the finish script's name
#: for them (a try put back at a stop, "release", is not counted).
_COUNTED_OUTCOMES = {"ok": "succeeded", "retry": "retried", "dead": "dead", "aborted": "aborted"}
#: The job name counted for jobs of a name this worker does not know.
UNKNOWN_JOB = "(unknown)"


@attrs.define(eq=False)
class Outbox:
    """The outcomes of ended tries, per shard, until a finish script records them.

    Attributes:
        flushed: counts the flushes that got their reply (a drain waits on it).
    """

    queue: QueueLike
    tries: Tries
    meter: JobMeter
    backoff: Backoff = attrs.field(factory=Backoff)
    flushed: AsyncValue[int] = attrs.field(init=False, factory=lambda: AsyncValue(0))
    # Per shard: [id, token, outcome, data, number] of each ended try not recorded yet.
    _items: list[list[list[Any]]] = attrs.field(init=False)
    _ready: list[trio.Event] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._items = [[] for _ in range(self.queue.shards)]
        self._ready = [trio.Event() for _ in range(self.queue.shards)]

    def put(self, current: Try, outcome: str, data: bytes | str, number: int) -> None:
        """Record that ``current`` ended with ``outcome`` (see the finish script for
        ``data`` and ``number``), as soon as the shard's finisher can."""
        current.finished = True
        counted = _COUNTED_OUTCOMES.get(outcome)
        if counted is not None:
            seconds = time.perf_counter() - current.started if TIMING.on else None
            name = current.job.name if current.job is not None else UNKNOWN_JOB
            self.meter.count(name, counted, seconds)
        self._items[current.shard].append([current.id, current.token, outcome, data, number])
        self._ready[current.shard].set()

    async def finisher(self, shard: int) -> None:
        """Record ``shard``'s outcomes as they come, until cancelled."""
        while True:
            await self._ready[shard].wait()
            # The outcomes stay in the outbox (and their leases renewed) while Redis
            # cannot be reached.
            await retry_unavailable(
                functools.partial(self.flush, shard),
                backoff=self.backoff,
                give_up_after=None,
                what="finishing jobs",
            )

    async def flush(self, shard: int) -> None:
        """Send the outcomes of ended tries of ``shard`` in one fenced script.

        Error handling:
            On any error or cancellation the outcomes go back to the outbox, to be
            sent again: safe, since a finish that ran already is refused (fenced)
            the second time.
        """
        batch = self._items[shard]
        self._items[shard] = []
        self._ready[shard] = trio.Event()
        if not batch:
            return
        keys = self.queue.shard_keys[shard]
        args: list[Any] = [keys.base, math.ceil(self.queue.lease_ttl * 1000)]
        for item in batch:
            args.extend(item)
        try:
            reply = await retry_idempotent(
                _FINISH, self.queue.redis, keys.keys, args, what="finishing jobs"
            )
        except BaseException:
            self._items[shard][:0] = batch
            self._ready[shard].set()
            raise
        for item, committed in zip(batch, reply, strict=True):
            self.tries.forget(item[0], item[1])
            if not committed and item[2] != "release":
                log.warning(
                    "job %s: not recorded: another worker took it over (this worker's lease "
                    "on it had run out)",
                    item[0],
                )
        self.flushed.value += 1


async def renew_leases(queue: QueueLike, consumer: str, tries: Tries) -> None:
    """Renew the leases of ``tries`` every ``min(lease_ttl / 3, 1 s)``, until cancelled."""
    period = min(queue.lease_ttl / 3, 1.0)
    start = trio.current_time()
    while True:
        await trio.sleep_until(next_tick(start, period, trio.current_time()))
        try:
            await renew(queue, consumer, tries)
        except RedisUnavailable as exc:
            log.warning("renewing job leases: %s", exc)
        except trio.TooSlowError:
            # Redis hung for a whole lease; the next renewal finds the jobs another
            # worker took over meanwhile, and cancels their tries here.
            log.warning("renewing job leases: no answer within %gs (lease_ttl)", queue.lease_ttl)


async def renew(queue: QueueLike, consumer: str, tries: Tries) -> None:
    """Renew the leases of ``tries`` once; cancel those taken over or aborted."""
    per_shard: dict[int, list[Any]] = {}
    for current in list(tries.running.values()):
        per_shard.setdefault(current.shard, []).extend((current.id, current.token))
    for shard, pairs in per_shard.items():
        keys = queue.shard_keys[shard]
        with trio.move_on_after(queue.lease_ttl / 2) as attempt:
            lost, aborts = await retry_idempotent(
                _RENEW,
                queue.redis,
                keys.keys,
                (keys.base, consumer, *pairs),
                what="renewing job leases",
                give_up_after=queue.lease_ttl / 2,
            )
        if attempt.cancelled_caught:
            log.warning("renewing job leases: no answer from Redis; retrying")
            continue
        for job_id in lost:
            taken = tries.running.get(text(job_id))
            if taken is not None and not taken.finished:
                taken.take_over()
        for job_id, reason in aborts:
            aborted = tries.running.get(text(job_id))
            if aborted is not None and not aborted.finished and aborted.abort_reason is None:
                aborted.abort(text(reason))
                log.info("job %s: aborted (%s)", aborted.id, aborted.abort_reason)
