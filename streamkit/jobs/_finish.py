"""Recording the outcomes of ended tries (fenced, batched per shard), settling the jobs
that depend on the ended ones, and renewing the leases of the running ones.

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
import orjson
import trio
from trio_util import AsyncValue

from .._backoff import Backoff, retry_unavailable
from .._errors import RedisUnavailable
from .._lua import script
from .._meter import TIMING, JobMeter
from .._periodic import next_tick
from .._redis import LuaScript, health_of, is_cluster, retry_idempotent
from .._streams import check_metadata
from .._wire import text
from ._batches import chunks
from ._emit import emit_arguments, relay_emitted
from ._layout import ShardKeys
from ._outcome import Failure, describe, label

if TYPE_CHECKING:
    from .._redis import Redis
    from ._handle import QueueLike
    from ._tries import Tries, Try

__all__ = ["UNKNOWN_JOB", "EmitRelay", "Outbox", "Settler", "renew_leases", "settle_all"]

log = logging.getLogger("streamkit.jobs")

_FINISH = LuaScript(script("jobs/finish"), hot=True)
_RENEW = LuaScript(script("jobs/renew"))
_SETTLE = LuaScript(script("jobs/settle"))
_DELIVER = LuaScript(script("jobs/deliver"))
_DELIVERED = LuaScript(script("jobs/delivered"))

#: The outcomes of tries counted for streamkit.metrics, by the finish script's name
#: for them (a try put back at a stop, "release", is not counted).
_COUNTED_OUTCOMES = {"ok": "succeeded", "retry": "retried", "dead": "dead", "aborted": "aborted"}
#: The job name counted for jobs of a name this worker does not know.
UNKNOWN_JOB = "(unknown)"
#: Outcomes per finish script call, at most.
_FINISH_CHUNK = 100
#: Leases per renewal script call, at most.
_RENEW_CHUNK = 500
#: Dependents settled per call of the settle script, at most.
SETTLE_STEP = 200
#: Messages to other shards delivered per round, at most.
_DELIVER_CHUNK = 100
#: How the error of an outcome put in place of a refused one starts.
_REFUSED = b'{"type":"OutcomeRefused"'
#: How often a worker looks at a shard's outbox of emitted records (Redis Cluster)
#: beside the relays its own finishes ask for: what a dead worker left (seconds).
EMIT_RELAY_EVERY = 5.0


@attrs.define(eq=False)
class Outbox:
    """The outcomes of ended tries, per shard, until a finish script records them.

    Attributes:
        flushed: counts the flushes that got their reply (a drain waits on it).
    """

    queue: QueueLike
    tries: Tries
    meter: JobMeter
    settler: Settler
    backoff: Backoff = attrs.field(factory=Backoff)
    #: Relays the records successes emitted, on Redis Cluster (``None`` on a server).
    emit_relay: EmitRelay | None = None
    flushed: AsyncValue[int] = attrs.field(init=False, factory=lambda: AsyncValue(0))
    # Per shard: [id, token, outcome, data, number, emitted...] of each ended try not
    # recorded yet.
    _items: list[list[list[Any]]] = attrs.field(init=False)
    _ready: list[trio.Event] = attrs.field(init=False)
    # The streams emitted to whose metadata was checked.
    _checked: set[str] = attrs.field(init=False, factory=set)

    def __attrs_post_init__(self) -> None:
        self._items = [[] for _ in range(self.queue.shards)]
        self._ready = [trio.Event() for _ in range(self.queue.shards)]

    async def check_streams(self, current: Try) -> None:
        """Check the metadata of the streams ``current`` emitted to, once per stream
        (as a producer's first send does).

        Error handling:
            :class:`~streamkit.MetadataMismatch` if a stream was created otherwise.
        """
        for spec, _, _, _ in current.emitted or ():
            if spec.name not in self._checked:
                await check_metadata(self.queue.redis, spec)
                self._checked.add(spec.name)

    def put(self, current: Try, outcome: str, data: bytes | str, number: int) -> None:
        """Record that ``current`` ended with ``outcome`` (see the finish script for
        ``data`` and ``number``), as soon as the shard's finisher can."""
        current.finished = True
        counted = _COUNTED_OUTCOMES.get(outcome)
        if counted is not None:
            seconds = time.perf_counter() - current.started if TIMING.on else None
            name = current.job.name if current.job is not None else UNKNOWN_JOB
            self.meter.count(name, counted, seconds)
        item = [current.id, current.token, outcome, data, number]
        emitted = current.emitted
        if emitted and outcome == "ok":
            # written with the success, only then (see jobs/_emit.py)
            item[4] = number + 2 * len(emitted)
            keys = self.queue.shard_keys[current.shard]
            item.extend(emit_arguments(emitted, keys, cluster=self.emit_relay is not None))
        self._items[current.shard].append(item)
        self._ready[current.shard].set()

    def put_progress(self, current: Try, value: bytes) -> None:
        """Write ``current``'s last progress value with its outcome, put next (in the
        same finish call, fenced like it)."""
        self._items[current.shard].append([current.id, current.token, "p", value, 0])
        self._ready[current.shard].set()

    def put_unheld(self, shard: int, job_id: bytes, token: str, outcome: str, data: bytes) -> None:
        """Record an outcome of a job whose try this worker does not hold (its id is
        not text)."""
        self.meter.count(UNKNOWN_JOB, _COUNTED_OUTCOMES[outcome], None)
        self._items[shard].append([job_id, token, outcome, data, 0])
        self._ready[shard].set()

    async def finisher(self, shard: int) -> None:
        """Record ``shard``'s outcomes as they come, until cancelled."""
        while True:
            await self._ready[shard].wait()
            # One moment more: the outcomes of tries ending together go in one call,
            # and the claim for their freed slots, sent the moment after they end,
            # reaches Redis first: the worker runs the next jobs while Redis records
            # these (at concurrency 32, a third more no-op jobs a second).
            await trio.lowlevel.checkpoint()
            # The outcomes stay in the outbox (and their leases renewed) while Redis
            # cannot be reached.
            await retry_unavailable(
                functools.partial(self.flush, shard),
                backoff=self.backoff,
                give_up_after=None,
                what="finishing jobs",
                outage=health_of(self.queue.redis).outage,
            )

    async def flush(self, shard: int) -> None:
        """Record the outcomes of ended tries of ``shard``: fenced finish scripts of at
        most ``_FINISH_CHUNK`` outcomes and about ``MAX_CALL_BYTES`` each.

        An outcome that Redis refuses to record (too big for the server's limits, say)
        ends its job dead with the error type ``OutcomeRefused`` instead, without
        holding back the others.

        Error handling:
            On any other error or cancellation the outcomes not recorded go back to
            the outbox, to be sent again: safe, since a finish that ran already is
            refused (fenced) the second time.
        """
        batch = self._items[shard]
        self._items[shard] = []
        if self._ready[shard].is_set():
            # Set by the outcomes taken here. An event not set stays: the finisher
            # may be waiting on it (this flush being a drain's), and the next outcome
            # must wake it (a new event would leave it waiting for ever).
            self._ready[shard] = trio.Event()
        if not batch:
            return
        sizes = [
            len(item[0]) + len(item[1]) + len(item[3]) + sum(map(_size, item[5:])) for item in batch
        ]
        for part in chunks(sizes, max_cost=_FINISH_CHUNK):
            try:
                await self._record(shard, batch[part.start : part.stop])
            except BaseException:
                self._items[shard][:0] = batch[part.start :]
                self._ready[shard].set()
                raise
        self.flushed.value += 1

    async def _finish(self, shard: int, items: list[list[Any]]) -> list[int]:
        keys = self.queue.shard_keys[shard]
        args: list[Any] = [keys.base, math.ceil(self.queue.lease_ttl * 1000)]
        for item in items:
            args.extend(item)
        replies, unsettled = await retry_idempotent(
            _FINISH, self.queue.redis, keys.keys, args, what="finishing jobs"
        )
        if unsettled:
            self.settler.wake(shard)
        return list(replies)

    async def _record(self, shard: int, items: list[list[Any]]) -> None:
        """Record ``items`` in one call or, if Redis refuses it, one by one."""
        try:
            reply = await self._finish(shard, items)
        except RedisUnavailable:
            raise
        except Exception as exc:  # refused: the request, or a value in it
            if len(items) == 1:
                await self._refused(shard, items[0], exc)
            else:
                for item in items:
                    await self._record(shard, [item])
            return
        for item, committed in zip(items, reply, strict=True):
            if item[2] == "p":
                continue  # a progress value, not an outcome
            if committed == 1 and len(item) > 5 and self.emit_relay is not None:
                self.emit_relay.wake(shard)
            self.tries.forget(item[0], item[1])
            if not committed and item[2] != "release":
                log.warning(
                    "job %s: not recorded: another worker took it over (this worker's lease "
                    "on it had run out)",
                    item[0],
                )

    async def _refused(self, shard: int, item: list[Any], exc: Exception) -> None:
        """Redis refused to record ``item``: end its job dead with a short error
        instead (if it refuses that too, the job's lease runs out and another worker
        takes it over)."""
        job_id, token, outcome = item[0], item[1], item[2]
        if outcome == "p":
            return  # a progress value Redis refused: the outcome follows alone
        reason = describe(exc)
        log.error("job %s: Redis refused to record its outcome (%s): %s", job_id, outcome, reason)
        if outcome != "release" and not item[3].startswith(_REFUSED):
            failure = Failure(
                "OutcomeRefused",
                f"Redis refused to record the outcome of its try ({outcome}): {reason}",
            )
            try:
                await self._record(shard, [[job_id, token, "dead", failure.encode(), 0]])
            except RedisUnavailable:
                raise
            except Exception as again:
                log.error("job %s: Redis refused that too: %s", job_id, describe(again))
            else:
                return
        self.tries.forget(job_id, token)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, bytes | str) else 8


@attrs.define(eq=False)
class EmitRelay:
    """Relays the records successful tries emitted from the shards' outboxes to their
    streams (Redis Cluster; see :mod:`~streamkit.jobs._emit`)."""

    queue: QueueLike
    backoff: Backoff = attrs.field(factory=Backoff)
    _wanted: list[trio.Event] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._wanted = [trio.Event() for _ in range(self.queue.shards)]

    def wake(self, shard: int) -> None:
        """A finish wrote emitted records to ``shard``'s outbox."""
        self._wanted[shard].set()

    async def relayer(self, shard: int) -> None:
        """Relay ``shard``'s outbox now, when woken and every few seconds, until
        cancelled."""
        keys = self.queue.shard_keys[shard]
        while True:
            self._wanted[shard] = trio.Event()
            await retry_unavailable(
                functools.partial(relay_emitted, self.queue.redis, keys),
                backoff=self.backoff,
                give_up_after=None,
                what="relaying the records jobs emitted",
                outage=health_of(self.queue.redis).outage,
            )
            with trio.move_on_after(EMIT_RELAY_EVERY):
                await self._wanted[shard].wait()


def emit_relay_for(queue: QueueLike) -> EmitRelay | None:
    """The relay of emitted records a worker of ``queue`` runs: on Redis Cluster only."""
    return EmitRelay(queue) if is_cluster(queue.redis) else None


@attrs.define(eq=False)
class Settler:
    """Settles the dependents of ended jobs that the scripts ending them left over
    (each script settles a bounded number), one bounded call after another."""

    queue: QueueLike
    backoff: Backoff = attrs.field(factory=Backoff)
    _wanted: list[trio.Event] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._wanted = [trio.Event() for _ in range(self.queue.shards)]

    def wake(self, shard: int) -> None:
        """A script reported dependents left to settle on ``shard``."""
        self._wanted[shard].set()

    async def settler(self, shard: int) -> None:
        """Settle ``shard``'s dependents whenever some are left, until cancelled."""
        while True:
            await self._wanted[shard].wait()
            self._wanted[shard] = trio.Event()
            await retry_unavailable(
                functools.partial(settle_all, self.queue, shard),
                backoff=self.backoff,
                give_up_after=None,
                what="settling the jobs that depend on ended ones",
                outage=health_of(self.queue.redis).outage,
            )


async def settle_all(queue: QueueLike, shard: int) -> None:
    """Settle every dependent of ended jobs on ``shard``, ``SETTLE_STEP`` per call, and
    deliver the ends to dependents on other shards and queues (settling there too)."""
    todo = [queue.shard_keys[shard]]
    while todo:
        keys = todo.pop()
        while await retry_idempotent(
            _SETTLE,
            queue.redis,
            keys.keys,
            (keys.base, SETTLE_STEP),
            what="settling the jobs that depend on ended ones",
        ):
            pass
        for target in await _deliver(queue.redis, keys):
            if target not in todo:
                todo.append(target)


async def _deliver(redis: Redis, keys: ShardKeys) -> list[ShardKeys]:
    """Deliver the messages of ``keys``' shard to the dependents on other shards (at
    least once: a delivery is idempotent), forgetting each once delivered. Returns
    the shards where the deliveries left work to settle."""
    outbox = f"{keys.base}:xout"
    busy: list[ShardKeys] = []
    while True:
        items = await retry_idempotent(
            redis.lrange, outbox, 0, _DELIVER_CHUNK - 1, what="reading job ends to deliver"
        )
        if not items:
            return busy
        by_target: dict[tuple[str, int], list[bytes]] = {}
        for item in items:
            queue, shard = orjson.loads(item)[:2]
            by_target.setdefault((queue, shard), []).append(item)
        for (queue, shard), group in by_target.items():
            target = ShardKeys(queue, shard)
            left = await retry_idempotent(
                _DELIVER,
                redis,
                target.keys,
                (target.base, *group),
                what="delivering job ends to their dependents",
            )
            if left and target not in busy:
                busy.append(target)
        await retry_idempotent(
            _DELIVERED, redis, keys.keys, (keys.base, *items), what="forgetting delivered ends"
        )


async def renew_leases(queue: QueueLike, consumer: str, tries: Tries) -> None:
    """Renew the leases of ``tries`` every ``min(lease_ttl / 3, 1 s)``, until cancelled."""
    period = min(queue.lease_ttl / 3, 1.0)
    start = trio.current_time()
    while True:
        await trio.sleep_until(next_tick(start, period, trio.current_time()))
        try:
            await renew(queue, consumer, tries)
        except RedisUnavailable as exc:
            log.debug("renewing job leases: %s", exc)
        except trio.TooSlowError:
            # Redis hung for a whole lease; the next renewal finds the jobs another
            # worker took over meanwhile, and cancels their tries here.
            log.warning("renewing job leases: no answer within %gs (lease_ttl)", queue.lease_ttl)


async def renew(queue: QueueLike, consumer: str, tries: Tries) -> None:
    """Renew the leases of ``tries`` once; cancel those taken over or aborted."""
    per_shard: dict[int, list[Any]] = {}
    for current in list(tries.running.values()):
        per_shard.setdefault(current.shard, []).extend((current.id, current.token))
    calls = [
        (shard, flat[i : i + 2 * _RENEW_CHUNK])
        for shard, flat in per_shard.items()
        for i in range(0, len(flat), 2 * _RENEW_CHUNK)
    ]
    for shard, pairs in calls:
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
                aborted.abort(label(reason))
                log.info("job %s: aborted (%s)", aborted.id, aborted.abort_reason)
