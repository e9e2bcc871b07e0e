"""Claiming jobs for a worker: one loop per queue shard, feeding the try runners.

Each loop claims as many jobs as the worker has free slots (the claim script also
moves due scheduled jobs and takes over the jobs of dead workers), hands them to the
try runners' channel, and, with nothing to claim, waits on a blocking read of the
ready streams. A claim whose reply was lost may have claimed jobs: they are handed
back (without spending a try) once Redis answers again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import socket
import uuid
from collections.abc import Sequence  # noqa: TC003 (attrs resolves the annotations)
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._backoff import Backoff, retry_unavailable
from .._errors import GroupExists, NoSuchGroup, OutcomeUnknown, RedisUnavailable
from .._lua import script
from .._redis import LuaScript, call_once, health_of, retry_idempotent, run_blocking
from .._wire import text
from . import _scripts
from ._outcome import label

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ._handle import QueueLike
    from ._handoff import Handoff
    from ._threads import Reserved, Threads
    from ._tries import Tries

__all__ = ["RECLAIM_INTERVAL", "Claimer", "hand_back", "new_consumer"]

log = logging.getLogger("streamkit.jobs")

_CLAIM = LuaScript(script("jobs/claim"), hot=True)
_RECOVER = LuaScript(script("jobs/recover"))

#: How often an idle worker looks for jobs of dead workers (seconds): a job whose
#: worker died is taken over within ``lease_ttl`` plus this.
RECLAIM_INTERVAL = 0.5
#: Longest time one blocking read for new jobs waits.
_BLOCK = 2.0
#: Jobs one claim starts, at most (a claim is one script call).
_MAX_CLAIM = 200


def new_consumer() -> str:
    """A worker's name in its queue: host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def hand_back(queue: QueueLike, consumer: str, shard: int, running: Sequence[str]) -> int:
    """Hand back the jobs ``consumer`` holds on ``shard`` and does not run (not in
    ``running``), without spending a try: claimed by a reply that was lost, or
    claimed and not started when a stop came. Returns how many."""
    keys = queue.shard_keys[shard]
    lease_ms = math.ceil(queue.lease_ttl * 1000)
    cursors: list[Any] = ["-", "-", "-"]
    handed_back = 0
    while any(cursors):
        n, cursors = await retry_idempotent(
            _RECOVER,
            queue.redis,
            keys.keys,
            (keys.base, consumer, lease_ms, _scripts.HAND_BACK_BUDGET, *cursors, *running),
            what="handing back jobs claimed and not run",
        )
        handed_back += int(n)
    return handed_back


async def ensure_groups(queue: QueueLike, shard: int) -> None:
    """Create the consumer group of ``shard``'s ready streams, if they have none,
    retrying an unreachable Redis for as long as it takes (a worker starting while
    Redis restarts waits for it, as its claim loops do)."""
    keys = queue.shard_keys[shard]
    for priority in range(3):
        with contextlib.suppress(GroupExists):
            await retry_idempotent(
                functools.partial(
                    queue.redis.xgroup_create,
                    keys.ready(priority),
                    _scripts.GROUP,
                    "0",
                    mkstream=True,
                ),
                what="creating a job queue's consumer group",
                give_up_after=math.inf,
            )


@attrs.define(eq=False)
class Claimer:
    """Claims jobs of ``queue`` for the worker ``consumer``, into ``handoff``.

    :meth:`run` is one shard's loop; :meth:`stop` ends every loop (a drain).
    """

    queue: QueueLike
    consumer: str
    tries: Tries
    handoff: Handoff
    #: Called with a shard on which dependents of ended jobs are left to settle.
    unsettled: Callable[[int], object]
    #: The threads of the worker's ``def`` jobs: a claim takes no more jobs than are free.
    threads: Threads | None = None
    backoff: Backoff = attrs.field(factory=Backoff)
    # One scope per shard's loop (a scope may be entered once); stop cancels all.
    _scopes: list[trio.CancelScope] = attrs.field(init=False, factory=list)
    _stopped: bool = attrs.field(init=False, default=False)
    # Shards where a claim's reply was lost: their jobs are handed back.
    _orphans: set[int] = attrs.field(init=False, factory=set)

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped

    def stop(self, reason: str) -> None:
        """Claim no more jobs, on any shard, from now on."""
        self._stopped = True
        for scope in self._scopes:
            scope.cancel(reason)

    async def run(self, shard: int) -> None:
        """Claim the jobs of ``shard`` until stopped (returns then) or cancelled."""
        scope = trio.CancelScope()
        if self._stopped:
            scope.cancel("draining the job worker")
        self._scopes.append(scope)
        with scope:
            await self._loop(shard)

    async def _loop(self, shard: int) -> None:
        next_reclaim = 0.0
        delivered: list[Any] = []
        pauses: Iterator[float] | None = None
        while True:
            await self.tries.wait_free()
            threads: list[Reserved] = []
            counted = self.threads if self.threads is not None and self.threads.counted else None
            if counted is not None:
                await counted.wait_free()
            want = min(int(self.tries.free.value), _MAX_CLAIM)
            if counted is not None:
                # A claimed job is started: no more than the worker has threads for now.
                threads = counted.take(want)
                want = len(threads)
            if want <= 0:
                continue  # (the slots or threads went to another shard's claim)
            now = trio.current_time()
            reclaim = now >= next_reclaim
            if reclaim:
                next_reclaim = now + RECLAIM_INTERVAL
            try:
                reply = await retry_unavailable(
                    functools.partial(self._claim, shard, want, reclaim, delivered),
                    backoff=self.backoff,
                    give_up_after=None,
                    what="claiming jobs",
                    outage=health_of(self.queue.redis).outage,
                )
                if reply is not None and self.threads is not None:
                    self.threads.assign(threads, reply[0])
                    threads = []
            finally:
                for unused in threads:
                    unused.release_unused()
            if reply is None:
                continue  # the consumer group was created again
            delivered = []
            claimed, next_due, server_now, unsettled, paused = reply
            if unsettled:
                self.unsettled(shard)
            if shard in self._orphans:
                # Not the jobs of this reply: this worker is about to run them.
                await self._recover(shard, [label(job[0]) for job in claimed])
            self.tries.take_slots(len(claimed))
            self.handoff.put([(shard, job) for job in claimed])
            if claimed or self.tries.free.value <= 0:
                continue
            # Nothing to do: wait on the ready streams until something arrives, the
            # next scheduled job is due, or it is time to look for dead workers' jobs.
            wait = next_reclaim - trio.current_time()
            if next_due >= 0:
                wait = min(wait, (next_due - server_now) / 1000)
            wait = min(wait, _BLOCK)
            if wait <= 0.001:
                continue
            if paused:
                # The whole queue is paused: look again shortly, reading nothing.
                await trio.sleep(min(wait, RECLAIM_INTERVAL))
                continue
            try:
                delivered = await self._wait_for_jobs(shard, want, wait)
            except RedisUnavailable as exc:
                log.debug("waiting for jobs: %s", exc)
                pauses = pauses or self.backoff.delays()
                await trio.sleep(next(pauses))
            else:
                pauses = None

    async def _claim(
        self, shard: int, want: int, reclaim: bool, delivered: list[Any]
    ) -> list[Any] | None:
        """One claim: its reply, or ``None`` after creating a missing group.

        Error handling:
            :class:`OutcomeUnknown` when the reply was lost (or came later than a
            lease), noting that the shard's jobs are to be handed back.
        """
        keys = self.queue.shard_keys[shard]
        # Shielded: a stop waits for the reply of a claim sent, so that the jobs it
        # claimed are known, and handed back. Bounded: a reply later than a lease is
        # as good as lost.
        claiming = trio.CancelScope(
            shield=True, deadline=trio.current_time() + self.queue.lease_ttl
        )
        try:
            with claiming:
                reply: list[Any] = await call_once(
                    _CLAIM,
                    self.queue.redis,
                    keys.keys,
                    (
                        keys.base,
                        self.consumer,
                        want,
                        math.ceil(self.queue.lease_ttl * 1000),
                        "1" if reclaim else "0",
                        self.queue.max_deliveries,
                        self.tries.tokens(shard) if reclaim else b"{}",
                        *delivered,
                    ),
                    what="claiming jobs",
                )
        except NoSuchGroup:
            await ensure_groups(self.queue, shard)
            return None
        except OutcomeUnknown:
            self._orphans.add(shard)
            raise
        if claiming.cancelled_caught:
            self._orphans.add(shard)
            raise OutcomeUnknown(None, f"no answer within {self.queue.lease_ttl:g}s (lease_ttl)")
        return reply

    async def _wait_for_jobs(self, shard: int, want: int, wait: float) -> list[Any]:
        """Block up to ``wait`` seconds for new entries on ``shard``'s ready streams;
        the (priority, entry id, job id) triples delivered, for the next claim."""
        keys = self.queue.shard_keys[shard]
        streams = {keys.ready(p): ">" for p in range(3)}
        try:
            entries = await run_blocking(
                self.queue.redis,
                functools.partial(
                    _read_group,
                    consumer=self.consumer,
                    streams=streams,
                    count=want,
                    block_ms=max(1, round(wait * 1000)),
                ),
                within=wait + 5.0,
                what="waiting for jobs",
            )
        except NoSuchGroup:
            await ensure_groups(self.queue, shard)
            return []
        except OutcomeUnknown:
            self._orphans.add(shard)
            raise
        delivered: list[Any] = []
        for stream, items in (entries or {}).items():
            priority = int(text(stream)[-1])
            for item in items:
                delivered.extend((priority, item.identifier, item.field_values.get(b"id", b"")))
        return delivered

    async def _recover(self, shard: int, starting: Sequence[str]) -> None:
        """Hand back the jobs claimed on ``shard`` by a reply that was lost: those
        this worker holds and neither runs nor is ``starting``."""
        running = [t.id for t in self.tries.on_shard(shard)]
        running.extend(starting)
        try:
            handed_back = await hand_back(self.queue, self.consumer, shard, running)
        except RedisUnavailable as exc:
            log.warning("handing back jobs of a lost reply: %s; trying again later", exc)
            return
        self._orphans.discard(shard)
        if handed_back:
            log.info("handed back %d job(s) claimed by a reply that was lost", handed_back)


async def _read_group(
    redis: Any, *, consumer: str, streams: dict[str, str], count: int, block_ms: int
) -> Any:
    return await redis.xreadgroup(_scripts.GROUP, consumer, streams, count=count, block=block_ms)
