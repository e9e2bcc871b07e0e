"""The fetcher: one background task reading all owned partitions into bounded buffers.

Every read is a *fenced* Lua script: it checks that the partition's lock still holds
this executor's lease before it runs ``XREADGROUP``, in the same atomic step (the lock
and the stream share a Redis Cluster hash slot). A worker whose lease lapsed (a long GC
pause, SIGSTOP, a network partition) can therefore never take another event of the
partition, and acknowledgements are fenced the same way.

Each registered partition is served through a :class:`~streamkit.PartitionFeed`: the
fetcher puts batches in, the consumer takes them out, reports each one done (which
makes room to read ahead) and acknowledges what it processed. Each read runs in a task
of the loop's own, one at a time per partition, so that a partition is read again as
soon as its consumer made room: Redis reads the next batches while the consumers work
on theirs. The acknowledgements of
finished events ride along with the partition's next read when one is due (one round
trip for both), else go alone.

Consumer names inside the group are fixed per partition (``p<N>``), so a new owner
finds the previous owner's pending entries under its own consumer name and reads them
first, in order, simply by reading the group's history from id ``0``. Every read of
new entries first looks for entries delivered to its consumer after the last one the
reader saw: a read of its own whose reply was lost, or that Redis ran after it was
given up, leaves such entries, which are then read from the history, in order, before
anything new (never skipped, as they would be by reading on past them).

Key facts (Redis 7.0, checked by the tests):

* a history read (``XREADGROUP ... STREAMS key <id>``) increments the delivery counter
  of every entry it returns, exactly as a new read (``>``) sets it to 1; so
  :attr:`Event.delivery_count` counts deliveries to any owner, this one included;
* an entry deleted (``XDEL``, trimming) while pending comes back from a history read
  as ``[id, nil]``; the read script acknowledges it, as there is nothing to process.

Why one room (about 1,100 lines): the read loop, each partition's feed and the fenced
read and commit calls share the feeds' state (what is due to acknowledge and commit,
the commit lock, whether a partition is caught up); split, each half would reach into
the other's. The feed's protocol is the seam (:mod:`streamkit._feed`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import attrs
import trio

from ._backoff import Backoff
from ._commit import change_arguments
from ._defaults import DEFAULT_BATCH_SIZE, DEFAULT_PREFETCH
from ._errors import (
    BackendError,
    ConfigError,
    GroupExists,
    LockLost,
    NoSuchGroup,
    OutcomeUnknown,
    RedisUnavailable,
    ServerRefused,
    StreamkitError,
)
from ._feed import Batch, FeedEnded
from ._keys import permit_key
from ._lua import script
from ._meter import TIMING, PartitionMeter, ProcessorMeter
from ._nurseries import open_service_nursery
from ._redis import (
    NOT_LOADED,
    LuaScript,
    Redis,
    ScriptCall,
    by_slot,
    can_run_blocking_between,
    can_transact,
    health_of,
    hot_transaction,
    is_no_script,
    redis_errors,
    run_blocking,
    run_blocking_between,
)
from ._spec import HasSpec, ProcessorKeys, StreamSpec, processor_keys, spec_of
from ._validate import positive_finite_number, positive_int
from ._wire import text

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from ._commit import Changes
    from ._locks import HeldLease

__all__ = ["Fetcher", "FetcherStatistics", "open_fetcher"]

R = TypeVar("R")

log = logging.getLogger("streamkit.fetcher")

DEFAULT_IDLE_BLOCK = 1.0
#: A quiet fetcher's wait (nothing handed out nor due): what a partition costs Redis
#: while nothing happens is a wait and its fenced look every this many seconds (shared by
#: all of a worker's partitions); a dead connection is noticed within it plus
#: ``command_timeout``.
DEFAULT_QUIET_BLOCK = 10.0
DEFAULT_BUSY_POLL = 0.01
DEFAULT_COMMAND_TIMEOUT = 10.0
# Acknowledgements sent per script call.
ACK_CHUNK = 2000

_READ_SCRIPT = LuaScript(script("commit/read"), hot=True)
_ACK_SCRIPT = LuaScript(script("commit/ack"), hot=True)
_WOKEN_READ_SCRIPT = LuaScript(script("commit/woken_read"))
_PERMIT_SCRIPT = LuaScript(script("commit/permit"), hot=True)


@attrs.define(eq=False, repr=False)
class _Feed:
    """One registered partition: the fetcher's side of its :class:`PartitionFeed`."""

    fetcher: Fetcher[Any]
    partition: int
    key: str
    consumer: str
    held: HeldLease
    _send: trio.MemorySendChannel[Batch]
    _receive: trio.MemoryReceiveChannel[Batch]
    # The partition's counters (for streamkit.metrics), kept across registrations.
    meter: PartitionMeter
    # "0" or the last history id read while in history mode; ">" after.
    start: str = "0"
    # The stream's last id when a read found nothing new: XREAD blocks on it.
    last_id: str = "0-0"
    # The id of the last entry read: a read of new entries first reads any entry
    # delivered to the consumer after it, unseen (a lost reply; see lib/unseen.lua).
    last_seen: str = "0"
    # Made ready by an XREAD that saw new entries (not busy since).
    woken: bool = False
    idle: bool = False
    # The last read reached the end of the partition, and nothing failed or woke it
    # since: the partition is quiet, not merely unread (see PartitionFeed.caught_up).
    caught_up: bool = False
    active: bool = True
    # Batches handed out and not yet reported done (in the channel or being processed).
    batches_out: int = 0
    entries_out: int = 0
    failure: StreamkitError | None = None
    reads: int = 0
    entries_read: int = 0
    # Acknowledgements to send with the next read (or the next ack()), and the
    # changes to commit with them (never sent apart from them).
    acks_due: list[bytes] = attrs.field(factory=list)
    changes_due: list[Changes] = attrs.field(factory=list)
    # Held while a commit (changes) is in flight: commits land one at a time, in the
    # order they were handed over, whichever path (a read, ack()) carries them.
    commit_lock: trio.Lock = attrs.field(factory=trio.Lock)
    # Whether the consumer took the batch put last (when it was waiting for one).
    taken: bool = True

    @property
    def stream(self) -> StreamSpec[Any]:
        return self.fetcher.stream

    @property
    def keys(self) -> ProcessorKeys:
        return self.fetcher.keys

    def _ended(self) -> StreamkitError:
        return self.failure or FeedEnded(self.partition)

    def receive_nowait(self) -> Batch:
        if self.failure is not None:
            raise self.failure
        try:
            return self._receive.receive_nowait()
        except trio.EndOfChannel:
            raise self._ended() from None

    async def receive(self) -> Batch:
        if self.failure is not None:
            raise self.failure
        try:
            batch = await self._receive.receive()
        except trio.EndOfChannel:
            raise self._ended() from None
        self.taken = True
        return batch

    def done(self, batch: Batch) -> None:
        self.batches_out -= 1
        self.entries_out -= len(batch)
        if self.batches_out == self.fetcher.prefetch - 1:
            # The partition was full: the fetcher may read it again.
            self.fetcher._changed.set()

    def ack_later(self, ids: Sequence[bytes], changes: Changes | None = None) -> None:
        if self.active:
            self.acks_due.extend(ids)
            if changes:
                self.changes_due.append(changes)
            if self.fetcher._quiet:
                # A quiet wait's timeout is the long one: these go now, not then.
                self.fetcher._wake()

    async def ack(self, ids: Sequence[bytes], changes: Changes | None = None) -> None:
        if self.failure is not None:
            # Stopped: nothing more is acknowledged or committed. After a commit whose
            # outcome is unknown, what the consumer did since rests on its writes (its
            # table values are cached as committed): a later commit would store them
            # while its events stay pending, to be counted again, and an
            # acknowledgement of its events alone would lose their writes. The
            # partition starts over from what Redis holds.
            await trio.lowlevel.checkpoint()
            raise self.failure
        # With a commit in flight (the fetcher sending changes handed over earlier),
        # wait for it: it has landed (or failed) when this returns, as the consumer
        # relies on before it lets the partition go.
        if not (changes or self.changes_due or self.commit_lock.locked()):
            await self._ack(ids, [])
            return
        async with self.commit_lock:
            await self._ack(ids, [changes] if changes else [])

    async def _ack(self, ids: Sequence[bytes], changes: list[Changes]) -> None:
        if self.failure is not None:
            # Failed while this waited for the commit in flight (see ack).
            raise self.failure
        due, self.acks_due = self.acks_due, []
        due_changes, self.changes_due = self.changes_due, []
        due_changes.extend(changes)
        if not (due or ids or due_changes):
            await trio.lowlevel.checkpoint()
            return
        try:
            await self.fetcher._ack(self, [*due, *ids], due_changes)
        except BaseException:
            if not due_changes:
                self.acks_due[:0] = due
            raise

    def _put(self, batch: Batch) -> None:
        self._send.send_nowait(batch)
        self.batches_out += 1
        self.entries_out += len(batch)
        self.entries_read += len(batch)

    def _close(self) -> None:
        self.active = False
        self._send.close()

    def __repr__(self) -> str:
        state = "failed" if self.failure else "active" if self.active else "closed"
        return (
            f"<PartitionFeed {self.stream.name} partition {self.partition} {state}, "
            f"buffered {self.entries_out} in {self.batches_out} batches>"
        )


@attrs.frozen
class FetcherStatistics:
    """A snapshot of a :class:`Fetcher`.

    Attributes:
        partitions: the registered partitions.
        buffered_batches: per partition, batches fetched and not yet fully processed.
        buffered_entries: per partition, entries in those batches.
        history: the partitions still reading pending entries of a previous owner.
        reads: fenced read scripts run so far.
        blocks: blocking ``XREAD`` waits so far.
        acknowledged: per partition served so far, entries acknowledged in Redis.
        fenced_out: fenced reads and acknowledgements refused because the lease was
            no longer this executor's.
    """

    partitions: tuple[int, ...]
    buffered_batches: dict[int, int]
    buffered_entries: dict[int, int]
    history: tuple[int, ...]
    reads: int
    blocks: int
    acknowledged: dict[int, int] = attrs.field(factory=dict)
    fenced_out: int = 0


@attrs.define(eq=False, repr=False)
class Fetcher(Generic[R]):
    """Reads the partitions this executor owns into bounded per-partition buffers.

    Get one from :func:`open_fetcher`; register each owned partition with
    :meth:`partition`, which serves the partition's :class:`~streamkit.PartitionFeed`.

    Attributes:
        redis: the client it reads with.
        stream: the stream's description.
        keys: the consuming processor's keys (its consumer group, lock names, ...).
    """

    redis: Redis
    stream: StreamSpec[R]
    keys: ProcessorKeys
    batch_size: int
    prefetch: int
    idle_block: float
    busy_poll: float
    command_timeout: float
    # Entries a partition keeps when acknowledging trims it (0: no trimming).
    trim_to: int
    quiet_block: float = DEFAULT_QUIET_BLOCK
    # Whether the blocking wait in progress is a quiet one (quiet_block long).
    _quiet: bool = attrs.field(default=False, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _feeds: dict[int, _Feed] = attrs.field(factory=dict, init=False)
    # The partitions served here since the fetcher opened (their groups existed).
    _served: set[int] = attrs.field(factory=set, init=False)
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    _block_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    # The partitions with a read in flight (one at a time per partition), whether a
    # look at the quiet ones is in flight, and what the reads and looks found.
    _reading: set[int] = attrs.field(factory=set, init=False)
    _looking: bool = attrs.field(default=False, init=False)
    _errors: list[RedisUnavailable] = attrs.field(factory=list, init=False)
    _succeeded: bool = attrs.field(default=False, init=False)
    _reads: int = attrs.field(default=0, init=False)
    _blocks: int = attrs.field(default=0, init=False)
    # Counters and latencies, read by streamkit.metrics.
    _meter: ProcessorMeter = attrs.field(factory=ProcessorMeter, init=False)
    # Whether reads of new entries go as plain commands in a transaction (see
    # _read_permitted): on a single server's hot path, until one is refused.
    _transact: bool = attrs.field(default=False, init=False)

    @property
    def group(self) -> str:
        """The consumer group."""
        return self.keys.group

    # -- registration --

    @contextlib.asynccontextmanager
    async def partition(self, partition: int, held: HeldLease) -> AsyncIterator[_Feed]:
        """Serve ``partition`` while the block runs; yield its feed.

        The consumer group is created if needed (from id ``0``, so a backlog sent
        before any worker ran is processed). Reading starts with the pending entries
        of the partition's previous owner, in order, then continues with new ones.
        Hand the feed to :func:`~streamkit.open_events` or
        :func:`~streamkit.run_processor`.

        Args:
            partition: the partition number.
            held: this executor's lease on the partition's lock,
                ``keys.lock_name(partition)`` (from :meth:`LockManager.hold`); every
                read and acknowledgement is fenced by it.

        Cancellation:
            Leaving the block (also by cancellation) stops serving the partition:
            what was read and not acknowledged stays pending, for the next owner.

        Error handling:
            :class:`ConfigError` if the partition is registered already, is not a
            partition of the stream, or ``held`` is a lease on another lock;
            :class:`LockLost` (raised by the feed) once a read or acknowledgement is
            refused because the lease is no longer ours; :class:`RedisUnavailable`
            if Redis cannot be reached.
        """
        if self._nursery is None:
            raise RuntimeError("use the fetcher inside `async with open_fetcher(...)`")
        if partition in self._feeds:
            raise ConfigError("partition", f"partition {partition} is registered already")
        if not 0 <= partition < self.stream.partition_count:
            raise ConfigError(
                "partition",
                f"{partition} is not a partition of {self.stream.name!r} "
                f"(0..{self.stream.partition_count - 1})",
            )
        expected = self.keys.lock_name(partition)
        if held.name != expected:
            raise ConfigError(
                "held",
                f"a lease on {held.name!r} cannot fence partition {partition}: "
                f"hold {expected!r} (keys.lock_name({partition}))",
            )
        key = self.stream.key(partition)
        if await self._create_group(key) and partition in self._served:
            # Served here before, so its group existed: it vanished meanwhile.
            level = health_of(self.redis).vanished.report(
                self.group, "group", partition=partition, detail=f"on {key}"
            )
            log.log(level, "consumer group %r on %s had vanished; recreated it", self.group, key)
        self._served.add(partition)
        send, receive = trio.open_memory_channel[Batch](self.prefetch)
        feed = _Feed(
            self,
            partition,
            key,
            f"p{partition}",
            held,
            send,
            receive,
            self._meter.partition(partition),
        )
        self._feeds[partition] = feed
        self._wake()
        log.debug("serving %s partition %d", self.stream.name, partition)
        try:
            yield feed
        finally:
            del self._feeds[partition]
            feed._close()
            self._wake()

    async def _create_group(self, key: str) -> bool:
        """Create the consumer group on ``key`` unless it exists; whether it was created."""
        try:
            with redis_errors(), trio.fail_after(self.command_timeout):
                # ENTRIESREAD 0: nothing read yet, so Redis knows the lag and the
                # read counter from the start (without it both are unknown until
                # the first read, and a status reading in between has no rate).
                await self.redis.xgroup_create(key, self.group, "0", mkstream=True, entriesread=0)
            log.debug("created consumer group %r on %s", self.group, key)
        except GroupExists:
            return False
        except ServerRefused:
            # A full Redis refuses XGROUP CREATE even for a group that exists; reading
            # is allowed, and consuming what is there is what frees memory.
            if not await self._group_exists(key):
                raise
            return False
        except trio.TooSlowError as exc:
            raise RedisUnavailable("redis", "creating the consumer group timed out") from exc
        return True

    async def _group_exists(self, key: str) -> bool:
        with redis_errors(), trio.fail_after(self.command_timeout):
            if not await self.redis.exists([key]):
                return False
            groups: Any = await self.redis.xinfo_groups(key)
        return any(text(g.get(b"name", g.get("name", b""))) == self.group for g in groups)

    # -- the background task --

    def _wake(self) -> None:
        self._changed.set()
        if self._block_scope is not None:
            self._block_scope.cancel()

    async def _run(self) -> None:
        delays = None
        # While some partition waits for room, idle ones are polled at this time (kept
        # across rounds, so that frequent wake-ups cannot postpone it forever).
        poll_at = math.inf
        health = health_of(self.redis)
        if can_run_blocking_between(self.redis):
            # The read behind a wait loads its script only once a wait ends; waits
            # cancelled again and again (partitions coming and going) would never. Not
            # loaded (Redis away, an ACL refusal), the usual reads take over.
            with (
                contextlib.suppress(StreamkitError),
                trio.move_on_after(self.command_timeout),
                redis_errors(),
            ):
                await _WOKEN_READ_SCRIPT.load(self.redis)
        if self._transact:
            # As the read behind the wait: a transaction's NOSCRIPT costs a usual read.
            with (
                contextlib.suppress(StreamkitError),
                trio.move_on_after(self.command_timeout),
                redis_errors(),
            ):
                await _PERMIT_SCRIPT.load(self.redis)
        # Each read runs as a task of its own: a partition is read again as soon as
        # its consumer made room, whatever the others' reads, so that Redis works on
        # the next batches while the consumers work on theirs.
        async with trio.open_nursery() as tasks:
            while True:
                # A fresh event each round: a wake after the checks below is not lost.
                self._changed = trio.Event()
                try:
                    if self._errors:
                        error = self._errors[0]
                        self._errors.clear()
                        raise error
                    if self._succeeded:
                        self._succeeded = False
                        delays = None
                    active = [f for f in self._feeds.values() if f.active]
                    has_room = [f for f in active if f.batches_out < self.prefetch]
                    ready = [f for f in has_room if not f.idle]
                    idle = [f for f in has_room if f.idle]
                    reading = self._reading
                    lone = len(ready) == 1 and not reading and not self._looking
                    if lone and (ready[0].woken or not idle):
                        # One partition to read, nothing in flight: read it here, at
                        # once (a task of its own would cost a trip through the
                        # scheduler, which the latency of a quiet stream shows).
                        reading.add(ready[0].partition)
                        await self._read_task(ready[0])
                    elif ready:
                        startable = [f for f in ready if f.partition not in reading]
                        for feed in startable:
                            reading.add(feed.partition)
                            tasks.start_soon(self._read_task, feed)
                        # While some partition is busy, the quiet ones are checked
                        # with one non-blocking XREAD, so they never starve;
                        # partitions just woken by an XREAD need no check.
                        if idle and not self._looking and any(not f.woken for f in ready):
                            self._looking = True
                            tasks.start_soon(self._look_task, idle)
                        await self._changed.wait()
                    elif reading or self._looking:
                        await self._changed.wait()
                    elif idle and len(has_room) == len(active) and self._commits_due(active):
                        # Commit before waiting (the wait carries acknowledgements
                        # only); the next round sees what changed meanwhile.
                        await self._send_due_acks(self._commits_due(active))
                    elif idle and len(has_room) == len(active):
                        # With nothing handed out nor due, no acknowledgement can come
                        # but by a wake-up (ack_later wakes a quiet wait): the wait
                        # renews itself seldom, for what an idle partition costs Redis.
                        self._quiet = all(
                            not (f.batches_out or f.acks_due or f.changes_due) for f in active
                        )
                        block = self.quiet_block if self._quiet else self.idle_block
                        try:
                            woken = await self._wait_for_entries(idle, block=block)
                        finally:
                            self._quiet = False
                        if not woken:
                            # Quiet for a while: acknowledge what the consumers
                            # finished rather than wait for a read to carry it.
                            await self._send_due_acks(active)
                    elif idle:
                        # Some partition waits for its consumer to make room: a
                        # blocking XREAD would need cancelling each time it does, so
                        # wait for room and poll the idle ones every busy_poll seconds.
                        if poll_at == math.inf:
                            poll_at = trio.current_time() + self.busy_poll
                        with trio.move_on_at(poll_at):
                            await self._changed.wait()
                        if trio.current_time() >= poll_at:
                            poll_at = math.inf
                            await self._wait_for_entries(idle, block=None)
                    else:
                        await self._changed.wait()
                except RedisUnavailable as exc:
                    for feed in self._feeds.values():
                        feed.caught_up = False
                    if delays is None:
                        delays = Backoff().delays()
                    delay = next(delays)
                    # The client's outage log says it once, for the whole process.
                    health.unavailable(exc, what=f"fetching {self.stream.name}")
                    log.debug("fetching failed: %s (retrying in %.2fs)", exc.reason, delay)
                    await trio.sleep(delay)

    async def _read_task(self, feed: _Feed) -> None:
        """Read ``feed`` once; what happened is for the loop of :meth:`_run` to see."""
        try:
            error = await self._read(feed)
        finally:
            self._reading.discard(feed.partition)
            self._changed.set()
        if error is None:
            self._succeeded = True
        else:
            self._errors.append(error)

    async def _look_task(self, idle: list[_Feed]) -> None:
        """Check whether the ``idle`` partitions have new entries (not blocking)."""
        try:
            await self._wait_for_entries(idle, block=None)
        except RedisUnavailable as exc:
            self._errors.append(exc)
        finally:
            self._looking = False
            self._changed.set()

    @staticmethod
    def _commits_due(feeds: list[_Feed]) -> list[_Feed]:
        """The ``feeds`` with changes to commit now (not in flight elsewhere)."""
        return [f for f in feeds if f.changes_due and not f.commit_lock.locked()]

    async def _send_due_acks(self, feeds: list[_Feed]) -> None:
        """Send the acknowledgements the ``feeds`` hold for a read that is not coming."""
        # (A feed whose commit is in flight elsewhere sends its own afterwards.)
        due = [
            f
            for f in feeds
            if (f.acks_due or f.changes_due) and not (f.changes_due and f.commit_lock.locked())
        ]
        if not due:
            return
        errors: list[RedisUnavailable] = []

        async def send(feed: _Feed) -> None:
            try:
                async with feed.commit_lock:
                    ids, feed.acks_due = feed.acks_due, []
                    changes, feed.changes_due = feed.changes_due, []
                    try:
                        await self._ack(feed, ids, changes)
                    except RedisUnavailable:
                        if not changes:
                            feed.acks_due[:0] = ids
                        raise
            except RedisUnavailable as exc:
                errors.append(exc)
            except LockLost:
                pass  # the feed failed: its consumer learns why from it

        async with trio.open_nursery() as nursery:
            for feed in due:
                nursery.start_soon(send, feed)
        if errors:
            raise errors[0]

    async def _read(self, feed: _Feed) -> RedisUnavailable | None:
        """Run one fenced read; return (not raise) Redis being unavailable."""
        held = feed.held
        if held.lost_reason is not None:
            self._fail(feed, LockLost(held.name, held.lost_reason))
            return None
        feed.caught_up = False
        changes = feed.changes_due
        change_keys: list[str] = []
        change_args: list[Any] = []
        if changes and feed.commit_lock.locked():
            # Another commit of this partition is in flight: read only; these
            # changes (and the acknowledgements behind them) follow it.
            changes = []
            acks: list[bytes] = []
        elif changes:
            feed.commit_lock.acquire_nowait()
            # The changes commit with the acknowledgements of the events behind them:
            # all of them in one call.
            acks, feed.acks_due, feed.changes_due = feed.acks_due, [], []
            change_keys, change_args = change_arguments(changes, 3)
        else:
            # (Not the feed's own list: changes handed over during the read wait.)
            changes = []
            acks = feed.acks_due[:ACK_CHUNK]
            del feed.acks_due[:ACK_CHUNK]
        try:
            return await self._read_carrying(feed, acks, changes, change_keys, change_args)
        finally:
            if changes:
                feed.commit_lock.release()

    async def _read_carrying(
        self,
        feed: _Feed,
        acks: list[bytes],
        changes: list[Changes],
        change_keys: list[str],
        change_args: list[Any],
    ) -> RedisUnavailable | None:
        """The fenced read of :meth:`_read`, committing ``changes`` and ``acks`` first."""
        held = feed.held
        began = time.perf_counter() if TIMING.on else 0.0
        reply: Any = None
        if not changes and feed.start == ">" and self._transact:
            try:
                reply, landed = await self._read_permitted(feed, acks)
            except RedisUnavailable as error:
                # (As below: the acknowledgements are due again, harmless if they
                # landed; entries delivered unseen are found by the next read.)
                feed.acks_due[:0] = acks
                return error
            if landed:
                if acks:
                    feed.meter.acknowledged += len(acks)
                acks = []
        try:
            if reply is None:
                reply = await self._call_fenced(
                    _READ_SCRIPT,
                    feed,
                    change_keys,
                    [
                        held.lease.value,
                        self.group,
                        feed.consumer,
                        self.batch_size,
                        f">{feed.last_seen}" if feed.start == ">" else feed.start,
                        self.trim_to,
                        len(acks),
                        *acks,
                        *change_args,
                    ],
                    "read",
                )
        except RedisUnavailable as error:
            if changes:
                # A commit that failed is never sent again (one whose outcome is
                # unknown would repeat its appends): the partition starts over from
                # what Redis holds, and the events behind it are delivered again.
                self._fail(feed, error)
                return None
            # (A lost reply may have delivered entries to us: the next read of new
            # entries finds them first, see lib/unseen.lua.)
            feed.acks_due[:0] = acks
            return error
        except NoSuchGroup:
            level = health_of(self.redis).vanished.report(
                self.group, "group", partition=feed.partition, detail=f"on {feed.key}"
            )
            log.log(level, "consumer group %r on %s vanished; recreating it", self.group, feed.key)
            try:
                await self._create_group(feed.key)
            except RedisUnavailable as unavailable:
                return unavailable
            except StreamkitError as error:
                self._fail(feed, error)
            return None
        except BackendError as exc:
            self._fail(feed, exc)
            return None
        self._reads += 1
        feed.reads += 1
        if began:
            self._meter.fetch_seconds.observe(time.perf_counter() - began)
        if reply == 0:
            self._fenced_out(feed, "read")
            return None
        if acks:
            feed.meter.acknowledged += len(acks)
        for change in changes:
            change.landed()
        if not feed.active:
            # Unregistered meanwhile: what was read stays pending for the next owner.
            return None
        if isinstance(reply, tuple):
            # The read as plain commands (see _read_permitted): new entries only.
            batch, last_id = reply
            ids, next_start = batch.ids, ">"
        else:
            ids, flat, widths, counts, next_start, last_id = reply
            batch = Batch.from_flat(ids, flat, widths, counts or None)
        feed.start = text(next_start)
        feed.woken = False
        if ids:
            feed._put(batch)
            feed.last_seen = text(ids[-1])
            if feed.start == ">" and len(ids) < self.batch_size:
                # Fewer than asked for: the read reached the end of the stream. Wait
                # for more in the blocking XREAD instead of reading it again now.
                feed.idle = True
                feed.last_id = feed.last_seen
        elif feed.start == ">":
            feed.idle = True
            feed.last_id = text(last_id)
        feed.caught_up = feed.idle
        return None

    async def _read_permitted(
        self, feed: _Feed, acks: list[bytes]
    ) -> tuple[tuple[Batch, bytes | str] | int | None, bool]:
        """The fenced read of new entries with the entries read by a plain
        ``XREADGROUP``, whose reply Redis writes itself (through Lua it converts every
        entry twice: about 1 us of Redis's time per event, most of a bare read's).

        One transaction: ``commit/permit`` checks the lease, acknowledges ``acks`` and
        creates the read's permit; the ``XREADGROUP`` names the permit beside the
        stream, so without it (the lease not ours, the script not loaded or refused)
        it fails before delivering anything; the permit is deleted behind it; and
        ``XREVRANGE`` gives the stream's last id, for the wait when nothing is new.

        Returns the reply, as the feed's read takes it: ``(batch, last id)``, ``0``
        (the lease is not ours), or ``None`` (read the usual way: entries were
        delivered unseen, or something failed, which the usual read reports); and
        whether ``acks`` landed.

        Error handling:
            :class:`RedisUnavailable` (:class:`~streamkit.OutcomeUnknown` included) as
            for the usual read.
        """
        held = feed.held
        key, lock = feed.key, held.lease.key
        permit = permit_key(lock)
        group, consumer = self.group, feed.consumer
        commands: list[tuple[Any, ...]] = [
            (
                b"EVALSHA",
                _PERMIT_SCRIPT.sha,
                3,
                key,
                lock,
                permit,
                held.lease.value,
                group,
                consumer,
                feed.last_seen,
                self.trim_to,
                len(acks),
                *acks,
            ),
            (
                b"XREADGROUP",
                b"GROUP",
                group,
                consumer,
                b"COUNT",
                self.batch_size,
                b"STREAMS",
                key,
                permit,
                b">",
                b">",
            ),
            (b"DEL", permit),
            (b"XREVRANGE", key, b"+", b"-", b"COUNT", 1),
        ]
        try:
            with redis_errors(), trio.fail_after(self.command_timeout):
                fence, read, _, last = await hot_transaction(self.redis, commands)
        except trio.TooSlowError as exc:
            raise OutcomeUnknown("redis", "a fenced read timed out") from exc
        except RedisUnavailable:
            raise
        except StreamkitError:
            # Refused as a whole (EXECABORT: nothing ran), or MULTI refused (an ACL
            # without it: the commands ran one by one, the read after its permit):
            # the usual reads from now on, which say what is wrong, if anything.
            self._transact = False
            return None, False
        if isinstance(fence, Exception):
            if is_no_script(fence):
                with contextlib.suppress(StreamkitError), redis_errors():
                    await _PERMIT_SCRIPT.load(self.redis, [key])
            return None, False
        if fence == -1:
            return 0, False
        if fence[1] != 1 or isinstance(read, Exception):
            # Entries delivered unseen (read from the history), or the read failed (a
            # vanished group, say): the usual read does and says what is needed.
            return None, True
        # RESP3 gives the streams read as a map, RESP2 as pairs; the permit has none.
        entries = (
            (next(iter(read.values())) if isinstance(read, dict) else read[0][1]) if read else []
        )
        batch = Batch([entry[0] for entry in entries], [entry[1] for entry in entries])
        if isinstance(last, Exception):
            last = []
        return (batch, last[0][0] if last else b"0-0"), True

    async def _wait_for_entries(self, idle: list[_Feed], *, block: float | None) -> bool:
        """Mark the ``idle`` partitions that have new entries as ready to read; return
        whether any had (or the wait was cut short by a change of partitions).

        With ``block``, wait in one ``XREAD BLOCK`` for up to ``block`` seconds until
        one has (cancelled when partitions are added or removed); else just look.
        """
        groups = by_slot(self.redis, [f.key for f in idle])
        if len(groups) > 1:
            # On a Redis Cluster one XREAD may name the streams of one slot only.
            return await self._wait_per_slot(idle, groups, block=block)
        if block is not None and can_run_blocking_between(self.redis):
            return await self._wait_and_read(idle, block)
        streams = {f.key: f.last_id for f in idle}
        by_key = {f.key.encode(): f for f in idle}
        with trio.CancelScope() as scope:
            try:
                if block is None:
                    with redis_errors(), trio.fail_after(self.command_timeout):
                        reply = await self.redis.xread(
                            cast("dict[str | bytes, str | bytes]", streams), count=1
                        )
                else:
                    self._blocks += 1
                    self._block_scope = scope
                    block_ms = max(1, round(block * 1000))
                    # On a connection of its own: cancelling it (on every partition
                    # change) discards that connection only, never one that other
                    # commands are on.
                    reply = await run_blocking(
                        self.redis,
                        lambda r: r.xread(
                            cast("dict[str | bytes, str | bytes]", streams),
                            count=1,
                            block=block_ms,
                        ),
                        within=block + self.command_timeout,
                        what="a blocking read",
                    )
            except trio.TooSlowError as exc:
                raise RedisUnavailable("redis", "reading the stream ends timed out") from exc
            finally:
                self._block_scope = None
        if scope.cancelled_caught:
            return True
        return self._woken_by(reply, by_key)

    async def _wait_and_read(self, idle: list[_Feed], block: float) -> bool:
        """:meth:`_wait_for_entries` with a block, on one server: the fenced reads of the
        idle partitions go right behind the ``XREAD BLOCK``, on its connection, so that
        Redis runs them the moment it returns. A quiet partition's new entries then
        cost no round trip more than the wait itself (a blocking command cannot run
        inside the fenced script). They acknowledge nothing, as they run when the wait
        ends, however long after they were sent (a worker frozen past its lease would
        acknowledge late): the acknowledgements due go in front of the wait instead,
        which Redis runs at once.

        Where the reads' outcome is unknown (the wait was cancelled, the connection
        lost), each of those partitions is read again at once. The reads may even run
        later than that, as Redis may run a discarded connection's commands after
        ones sent since on another: every read of new entries therefore first reads
        any entry delivered to its consumer after the last one it saw, in order.
        """
        behind = [f for f in idle if f.held.lost_reason is None]
        keys: list[str] = []
        args: list[bytes | str | int] = [self.group, self.batch_size]
        for feed in behind:
            keys += [feed.key, feed.held.lease.key]
            args += [feed.held.lease.value, feed.consumer, feed.last_seen, feed.last_id]
        # Acknowledgements due go in front (Redis runs them at once), each partition's
        # in a fenced call of its own; not those of changes to commit, which
        # :meth:`_run` sends on their own. They stay due until their reply says they
        # landed: a consumer acknowledging meanwhile (its last, as it lets the
        # partition go) sends them too, rather than miss ones whose call the wait's
        # cancellation cut short (acknowledging twice is harmless).
        acking: list[tuple[_Feed, list[bytes], list[bytes]]] = [
            (feed, feed.acks_due, feed.acks_due[:ACK_CHUNK])
            for feed in behind
            if feed.acks_due and not feed.changes_due
        ]
        before: list[ScriptCall] = [
            (
                _ACK_SCRIPT,
                [feed.key, feed.held.lease.key],
                [feed.held.lease.value, self.group, self.trim_to, len(ids), *ids],
            )
            for feed, _, ids in acking
        ]
        acked: list[Any] = []
        xread: list[bytes | str | int] = [
            b"XREAD",
            b"COUNT",
            1,
            b"BLOCK",
            max(1, round(block * 1000)),
            b"STREAMS",
            *(f.key for f in idle),
            *(f.last_id for f in idle),
        ]
        by_key = {f.key.encode(): f for f in idle}
        reply: Any = None
        replies: Any = None
        with trio.CancelScope() as scope:
            self._blocks += 1
            self._block_scope = scope
            try:
                reply, replies = await run_blocking_between(
                    self.redis,
                    xread,
                    before=before,
                    after=(_WOKEN_READ_SCRIPT, keys, args),
                    replies_before=acked,
                    within=block + self.command_timeout,
                    what="a blocking read",
                )
            except BaseException:
                self._read_unknown(behind)
                raise
            finally:
                self._block_scope = None
                self._acked_in_front(acking, acked)
        if scope.cancelled_caught:
            return True  # (its partitions are read again: see the except above)
        woken = self._woken_by(reply, by_key)
        if replies is NOT_LOADED:
            # Nothing ran: the woken partitions are read the usual way.
            return woken
        if not isinstance(replies, list):
            self._read_unknown(behind)
            return True
        if behind and not replies:
            return woken  # nothing new in any of them (the wait timed out)
        delivered = [f for f, one in zip(behind, replies, strict=True) if self._took_woken(f, one)]
        # The consumers first, sending the next wait after them: Trio runs the tasks
        # made runnable together in either order, so this task may go first once.
        waiting = delivered
        for _ in range(2):
            if not waiting:
                break
            await trio.lowlevel.checkpoint()
            waiting = [f for f in waiting if not f.taken]
        return woken or bool(delivered)

    def _acked_in_front(
        self, acking: list[tuple[_Feed, list[bytes], list[bytes]]], acked: list[Any]
    ) -> None:
        """Take the replies of the acknowledgements sent in front of a wait: those that
        landed are no longer due (unless the consumer took them meanwhile, to send them
        itself); the others stay due."""
        for i, (feed, due, ids) in enumerate(acking):
            answer = acked[i] if i < len(acked) else None
            if answer == -1:
                self._fenced_out(feed, "acknowledgement")
            elif isinstance(answer, int):
                feed.meter.acknowledged += answer
                if feed.acks_due is due and due[: len(ids)] == ids:
                    del due[: len(ids)]

    def _read_unknown(self, feeds: list[_Feed]) -> None:
        """The fenced reads of ``feeds`` behind a wait may or may not have run, or may
        run later: each is read again now, and a read of new entries first finds any
        delivered to it unseen (see ``lib/unseen.lua``)."""
        for feed in feeds:
            feed.idle = feed.caught_up = False

    def _took_woken(self, feed: _Feed, reply: Any) -> bool:
        """Take ``feed``'s reply of the reads behind a wait; return whether it delivered."""
        if reply == -1:
            # Nothing read: the usual read reports why the read failed, or finds the
            # entries delivered to this feed unseen.
            feed.idle = feed.caught_up = False
            return False
        self._reads += 1
        feed.reads += 1
        if reply == 0:
            self._fenced_out(feed, "read")
            return False
        ids, flat, widths = reply
        if not ids or not feed.active:
            # Nothing new; or unregistered meanwhile, and what was read stays pending
            # for the next owner.
            return False
        feed._put(Batch.from_flat(ids, flat, widths, None))
        feed.taken = False
        feed.last_seen = text(ids[-1])
        feed.woken = False
        feed.idle = len(ids) < self.batch_size
        if feed.idle:
            feed.last_id = feed.last_seen
        feed.caught_up = feed.idle
        return True

    @staticmethod
    def _woken_by(reply: Any, by_key: dict[bytes, _Feed]) -> bool:
        if not reply:
            return False
        if isinstance(reply, list):
            # RESP2: [[key, entries], ...]
            reply = [item[0] for item in reply]
        for key in reply:
            feed = by_key.get(key if isinstance(key, bytes) else key.encode())
            if feed is not None:
                feed.idle = False
                feed.woken = True
                feed.caught_up = False
        return True

    async def _wait_per_slot(
        self, idle: list[_Feed], groups: list[list[str]], *, block: float | None
    ) -> bool:
        """:meth:`_wait_for_entries` on a Redis Cluster: one ``XREAD`` per slot.

        Without ``block`` the looks run concurrently (multiplexed on the shared
        connections). With it, one blocking ``XREAD`` per slot runs on a dedicated
        connection each; the first that sees entries (or a change of partitions) ends
        the others, whose connections are discarded.
        """
        by_key = {f.key.encode(): f for f in idle}
        last_ids = {f.key: f.last_id for f in idle}
        woken = False
        errors: list[BaseException] = []

        async def look(keys: list[str], nursery: trio.Nursery) -> None:
            nonlocal woken
            streams = cast("dict[str | bytes, str | bytes]", {k: last_ids[k] for k in keys})
            try:
                if block is None:
                    with redis_errors(), trio.fail_after(self.command_timeout):
                        reply = await self.redis.xread(streams, count=1)
                else:
                    block_ms = max(1, round(block * 1000))
                    reply = await run_blocking(
                        self.redis,
                        lambda r: r.xread(streams, count=1, block=block_ms),
                        within=block + self.command_timeout,
                        what="a blocking read",
                    )
            except trio.TooSlowError:
                errors.append(RedisUnavailable("redis", "reading the stream ends timed out"))
                return
            except RedisUnavailable as exc:
                errors.append(exc)
                nursery.cancel_scope.cancel("a blocking read failed")
                return
            if self._woken_by(reply, by_key):
                woken = True
                if block is not None:
                    nursery.cancel_scope.cancel("a partition has new entries")

        with trio.CancelScope() as scope:
            if block is not None:
                self._blocks += 1
                self._block_scope = scope
            try:
                async with trio.open_nursery() as nursery:
                    for keys in groups:
                        nursery.start_soon(look, keys, nursery)
            finally:
                self._block_scope = None
        if scope.cancelled_caught:
            return True
        if errors and not woken:
            raise errors[0]
        return woken

    async def _call_fenced(
        self, script: LuaScript, feed: _Feed, change_keys: list[str], args: list[Any], what: str
    ) -> Any:
        """Run the fenced ``script`` (a read or an acknowledgement) for ``feed``.

        Its keys are the partition's stream, its lease, then ``change_keys``; ``args``
        are the script's whole argument list (the lease's value first).

        Error handling:
            :class:`~streamkit.OutcomeUnknown` when no reply came within
            ``command_timeout`` (the fenced ``what`` may have run); Redis errors
            translated (``redis_errors``).
        """
        try:
            with redis_errors(), trio.fail_after(self.command_timeout):
                return await script(
                    self.redis, keys=[feed.key, feed.held.lease.key, *change_keys], args=args
                )
        except trio.TooSlowError as exc:
            raise OutcomeUnknown("redis", f"a fenced {what} timed out") from exc

    def _fenced_out(self, feed: _Feed, what: str) -> LockLost:
        """A fenced ``what`` of ``feed`` was refused, the lease no longer ours: count it,
        fail the feed (if still registered), and return the error."""
        self._meter.fenced_out += 1
        error = LockLost(feed.held.name, f"a fenced {what} was refused: the lock is no longer ours")
        if feed.active:
            self._fail(feed, error)
        return error

    def _fail(self, feed: _Feed, error: StreamkitError, *, quiet: bool = False) -> None:
        if feed.failure is None:
            log.log(
                # A lost lease is said by the partition's owner (the rebalancer), which
                # gets it from the feed: not twice; a cancellation by whoever cancelled.
                logging.DEBUG if quiet or isinstance(error, LockLost) else logging.WARNING,
                "stopped fetching %s partition %d: %s",
                self.stream.name,
                feed.partition,
                error,
            )
            feed.failure = error
        # Wakes a consumer waiting for a batch: it raises the failure.
        feed._close()

    # -- acknowledgements (for the feeds) --

    async def _ack(
        self, feed: _Feed, ids: Sequence[bytes], changes: Sequence[Changes] = ()
    ) -> None:
        """Commit ``changes`` and acknowledge ``ids`` (fenced).

        Without changes, the ids go in chunks. With changes, everything goes in one
        call, and when that fails the feed fails too (a commit is never sent again)
        and the error is raised.
        """
        lease = feed.held.lease
        if changes:
            change_keys, change_args = change_arguments(changes, 3)
            chunks: list[Sequence[bytes]] = [ids]
        else:
            change_keys, change_args = [], []
            chunks = [ids[start : start + ACK_CHUNK] for start in range(0, len(ids), ACK_CHUNK)]
        for chunk in chunks:
            try:
                acked: Any = await self._call_fenced(
                    _ACK_SCRIPT,
                    feed,
                    change_keys,
                    [lease.value, self.group, self.trim_to, len(chunk), *chunk, *change_args],
                    "acknowledgement",
                )
            except RedisUnavailable as unavailable:
                if changes:
                    self._fail(feed, unavailable)
                raise
            except trio.Cancelled:
                if changes:
                    # Cancelled in flight (by the caller's own cancel scope, say): it
                    # may have landed or not, so, as for a lost connection, the
                    # partition starts over from what Redis holds.
                    self._fail(
                        feed,
                        OutcomeUnknown(
                            "redis", "a commit was cancelled in flight: it may have landed"
                        ),
                        quiet=True,
                    )
                raise
            if acked == -1:
                raise self._fenced_out(feed, "acknowledgement")
            feed.meter.acknowledged += int(acked)
            for change in changes:
                change.landed()

    # -- inspection --

    def statistics(self) -> FetcherStatistics:
        """Return a snapshot of the fetcher's buffers and activity."""
        feeds = self._feeds
        return FetcherStatistics(
            partitions=tuple(sorted(feeds)),
            buffered_batches={p: f.batches_out for p, f in feeds.items()},
            buffered_entries={p: f.entries_out for p, f in feeds.items()},
            history=tuple(sorted(p for p, f in feeds.items() if f.start != ">")),
            reads=self._reads,
            blocks=self._blocks,
            acknowledged={p: m.acknowledged for p, m in sorted(self._meter.partitions.items())},
            fenced_out=self._meter.fenced_out,
        )

    def __repr__(self) -> str:
        buffered = sum(f.entries_out for f in self._feeds.values())
        return (
            f"<Fetcher {self.stream.name} group={self.group!r} "
            f"partitions={sorted(self._feeds)} buffered={buffered} reads={self._reads}>"
        )


@contextlib.asynccontextmanager
async def open_fetcher(
    redis: Redis,
    stream: StreamSpec[R] | HasSpec[R],
    *,
    group: str | ProcessorKeys,
    batch_size: int = DEFAULT_BATCH_SIZE,
    prefetch: int = DEFAULT_PREFETCH,
    idle_block: float = DEFAULT_IDLE_BLOCK,
    busy_poll: float = DEFAULT_BUSY_POLL,
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
    trim_to: int | None = None,
    quiet_block: float = DEFAULT_QUIET_BLOCK,
) -> AsyncIterator[Fetcher[R]]:
    """Run a :class:`Fetcher` for ``stream``'s consumer group ``group``.

    One background task serves every registered partition: it runs one fenced read
    per partition whose buffer has room (concurrently, each partition read again as
    soon as it has room), and when none had anything new, waits in one blocking
    ``XREAD`` over all idle partitions (on a Redis Cluster, one per hash slot,
    concurrently).

    Args:
        redis: a client from :func:`streamkit.open_redis`.
        stream: the stream to read: a :class:`~streamkit.StreamSpec`, or a
            :class:`~streamkit.Stream` of an app.
        group: the consuming processor, ``stream.processor(name)``, or its consumer
            group's name (``app.stream.processor``).
        batch_size: entries per read.
        prefetch: batches buffered per partition, including the one being processed:
            at most ``prefetch * batch_size`` entries per partition are in memory,
            whatever the backlog.
        idle_block: seconds one blocking ``XREAD`` waits before it is renewed (and
            the acknowledgements the consumers queued meanwhile are sent).
        quiet_block: the same while nothing is handed out nor due to be acknowledged
            on any partition: what quiet partitions cost Redis is a look at each of
            them per wait, so an idle fleet waits longer (a queued acknowledgement
            ends such a wait at once).
        busy_poll: while some partition's buffer is full, idle partitions are polled
            this often instead of blocking.
        command_timeout: seconds after which a Redis command counts as failed.
        trim_to: trim each partition, when acknowledging, down to no fewer than this
            many entries, never past one a consumer group still needs (as the
            producer's appends do; consuming then frees memory even while Redis is
            too full to append). ``None``: acknowledging never trims.

    Error handling:
        :class:`ConfigError` for bad arguments (a group that is not a processor of
        the stream, a batch size below one, ...). Redis being unavailable does not end
        the fetcher: it retries with backoff, logging each failure.
    """
    positive_int.check("batch_size", batch_size)
    positive_int.check("prefetch", prefetch)
    positive_finite_number.check("idle_block", idle_block)
    positive_finite_number.check("quiet_block", quiet_block)
    positive_finite_number.check("busy_poll", busy_poll)
    positive_finite_number.check("command_timeout", command_timeout)
    positive_int.or_none().check("trim_to", trim_to)
    spec = spec_of(stream)
    fetcher = Fetcher(
        redis,
        spec,
        processor_keys(spec, group),
        batch_size,
        prefetch,
        idle_block,
        busy_poll,
        command_timeout,
        trim_to or 0,
        max(quiet_block, idle_block),
    )
    fetcher._transact = can_transact(redis)
    async with open_service_nursery(reason="fetcher closed") as nursery:
        fetcher._nursery = nursery
        nursery.start_soon(fetcher._run)
        try:
            yield fetcher
        finally:
            fetcher._nursery = None
