"""The fetcher: one background task reading all owned partitions into bounded buffers.

Every read is a *fenced* Lua script: it checks that the partition's lock still holds
this executor's lease before it runs ``XREADGROUP``, in the same atomic step (the lock
and the stream share a Redis Cluster hash slot). A worker whose lease lapsed (a long GC
pause, SIGSTOP, a network partition) can therefore never take another event of the
partition, and acknowledgements are fenced the same way (see :mod:`streamkit._events`).

Consumer names inside the group are fixed per partition (``p<N>``), so a new owner
finds the previous owner's pending entries under its own consumer name and reads them
first, in order, simply by reading the group's history from id ``0``.

Key facts (Redis 7.0, checked by the tests):

* a history read (``XREADGROUP ... STREAMS key <id>``) increments the delivery counter
  of every entry it returns, exactly as a new read (``>``) sets it to 1; so
  :attr:`Event.delivery_count` counts deliveries to any owner, this one included;
* an entry deleted (``XDEL``, trimming) while pending comes back from a history read
  as ``[id, nil]``; the read script acknowledges it, as there is nothing to process.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import attrs
import trio
from coredis.commands.script import Script

from ._backoff import Backoff
from ._errors import (
    BackendError,
    ConfigError,
    GroupExists,
    LockLost,
    NoSuchGroup,
    RedisUnavailable,
    StreamkitError,
)
from ._events import Event, Events, Middleware
from ._groups import meaningful_leaf, pick_exception
from ._redis import Redis, redis_errors, run_blocking

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    import trio_util

    from ._locks import HeldLease
    from ._streams import Stream

__all__ = ["Fetcher", "FetcherStatistics", "open_fetcher"]

R = TypeVar("R")

log = logging.getLogger("streamkit.fetcher")

DEFAULT_BATCH_SIZE = 500
DEFAULT_PREFETCH = 2
DEFAULT_IDLE_BLOCK = 1.0
DEFAULT_BUSY_POLL = 0.05
DEFAULT_COMMAND_TIMEOUT = 10.0
# Leaving a partition flushes its acknowledgements for at most this long.
ACK_FLUSH_TIMEOUT = 2.0
# Acknowledgements sent per script call.
ACK_CHUNK = 2000

# KEYS: stream, lock. ARGV: lease value, group, consumer, count, start id.
# Returns 0 if the lease is not ours (nothing read); else
# {entries, delivery counts (history only), next start id, last stream id (if idle)}.
_READ_SCRIPT: Script[bytes] = Script(
    script="""
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
local key, group, consumer, count = KEYS[1], ARGV[2], ARGV[3], ARGV[4]

local function read(id)
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
                           'STREAMS', key, id)
  if reply then return reply[1][2] end
  return {}
end

if ARGV[5] ~= '>' then
  local raw = read(ARGV[5])
  if #raw > 0 then
    local live, gone = {}, {}
    for _, entry in ipairs(raw) do
      if entry[2] then live[#live + 1] = entry else gone[#gone + 1] = entry[1] end
    end
    -- Deleted while pending: nothing left to process.
    if #gone > 0 then redis.call('XACK', key, group, unpack(gone)) end
    local counts = {}
    if #live > 0 then
      local by_id = {}
      local pending = redis.call('XPENDING', key, group, live[1][1], live[#live][1],
                                 #live, consumer)
      for _, p in ipairs(pending) do by_id[p[1]] = p[4] end
      for i, entry in ipairs(live) do counts[i] = by_id[entry[1]] or 1 end
    end
    return {live, counts, raw[#raw][1], ''}
  end
end

local entries = read('>')
if #entries > 0 then return {entries, {}, '>', ''} end
local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
local last_id = '0-0'
if last[1] then last_id = last[1][1] end
return {entries, {}, '>', last_id}
"""
)

# KEYS: stream, lock. ARGV: lease value, group, ids... Returns -1 if the lease is not
# ours (nothing acknowledged), else the number of entries acknowledged.
_ACK_SCRIPT: Script[bytes] = Script(
    script="""
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
return redis.call('XACK', KEYS[1], ARGV[2], unpack(ARGV, 3))
"""
)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@attrs.define(eq=False, repr=False)
class _PartitionState:
    """What the fetcher knows about one registered partition."""

    partition: int
    key: str
    consumer: str
    held: HeldLease
    send: trio.MemorySendChannel[list[Event[Any]]]
    receive: trio.MemoryReceiveChannel[list[Event[Any]]]
    # "0" or the last history id read while in history mode; ">" after.
    start: str = "0"
    # The stream's last id when a read found nothing new: XREAD blocks on it.
    last_id: str = "0-0"
    idle: bool = False
    active: bool = True
    # Batches handed out and not yet consumed (in the channel or being processed).
    batches_out: int = 0
    entries_out: int = 0
    failure: StreamkitError | None = None
    reads: int = 0
    entries_read: int = 0


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
    """

    partitions: tuple[int, ...]
    buffered_batches: dict[int, int]
    buffered_entries: dict[int, int]
    history: tuple[int, ...]
    reads: int
    blocks: int


@attrs.define(eq=False, repr=False)
class Fetcher(Generic[R]):
    """Reads the partitions this executor owns into bounded per-partition buffers.

    Get one from :func:`open_fetcher`; register each owned partition with
    :meth:`partition`, which hands out the partition's :class:`~streamkit.Events`.
    """

    redis: Redis
    stream: Stream[R]
    group: str
    batch_size: int
    prefetch: int
    idle_block: float
    busy_poll: float
    command_timeout: float
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _states: dict[int, _PartitionState] = attrs.field(factory=dict, init=False)
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    _block_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _reads: int = attrs.field(default=0, init=False)
    _blocks: int = attrs.field(default=0, init=False)

    # -- registration --

    @contextlib.asynccontextmanager
    async def partition(
        self,
        partition: int,
        held: HeldLease,
        *,
        draining: trio_util.AsyncBool | None = None,
        middleware: Sequence[Middleware] = (),
        ack_batch: int | None = None,
    ) -> AsyncIterator[Events[R]]:
        """Serve ``partition`` while the block runs; yield its :class:`Events`.

        The consumer group is created if needed (from id ``0``, so a backlog sent
        before any worker ran is processed). Reading starts with the pending entries
        of the partition's previous owner, in order, then continues with new ones.

        Args:
            partition: the partition number.
            held: this executor's lease on the partition (from
                :meth:`LockManager.hold` on the partition's lock); every read and
                acknowledgement is fenced by it.
            draining: when it turns true, the event iterators stop after the current
                event or batch (acknowledged), so the processor can return.
            middleware: wrappers of the raw event iterator, applied in order (the
                first is closest to Redis, the last closest to the processor).
            ack_batch: flush acknowledgements when this many accumulate (the batch
                size by default); they are also flushed before waiting for events
                and when the block is left.

        Cancellation:
            Leaving the block (also by cancellation) stops serving the partition
            and flushes the acknowledgements of events the processor moved past,
            shielded, for at most :data:`ACK_FLUSH_TIMEOUT` seconds. Events it had
            not moved past stay pending, for the next owner.

        Error handling:
            :class:`ConfigError` if the partition is registered already;
            :class:`LockLost` (raised by the iterators) once a read or
            acknowledgement is refused because the lease is no longer ours;
            :class:`RedisUnavailable` if Redis cannot be reached.
        """
        if self._nursery is None:
            raise RuntimeError("use the fetcher inside `async with open_fetcher(...)`")
        if partition in self._states:
            raise ConfigError("partition", f"partition {partition} is registered already")
        if not 0 <= partition < self.stream.partition_count:
            raise ConfigError(
                "partition",
                f"{partition} is not a partition of {self.stream.name!r} "
                f"(0..{self.stream.partition_count - 1})",
            )
        key = self.stream.key(partition)
        await self._create_group(key)
        send, receive = trio.open_memory_channel[list[Event[Any]]](self.prefetch)
        state = _PartitionState(
            partition=partition,
            key=key,
            consumer=f"p{partition}",
            held=held,
            send=send,
            receive=receive,
        )
        events: Events[R] = Events(
            self,
            state,
            middleware=tuple(middleware),
            ack_batch=ack_batch or self.batch_size,
        )
        watcher = trio.CancelScope()
        events._drain_source = draining
        if draining is not None:
            self._nursery.start_soon(self._watch_draining, draining, events, watcher)
        self._states[partition] = state
        self._wake()
        log.debug("serving %s partition %d", self.stream.name, partition)
        body_ok = False
        try:
            yield events
            body_ok = True
        finally:
            state.active = False
            del self._states[partition]
            send.close()
            watcher.cancel()
            self._wake()
            await self._leave(events, state, body_ok)

    async def _leave(self, events: Events[R], state: _PartitionState, body_ok: bool) -> None:
        with trio.move_on_after(ACK_FLUSH_TIMEOUT) as scope:
            scope.shield = True
            try:
                await events._finish(commit=body_ok)
            except StreamkitError as exc:
                if body_ok:
                    raise
                log.warning(
                    "flushing acknowledgements of %s partition %d failed: %s",
                    self.stream.name,
                    state.partition,
                    exc,
                )
        if scope.cancelled_caught:
            log.warning(
                "flushing acknowledgements of %s partition %d timed out; "
                "the events stay pending and are redelivered",
                self.stream.name,
                state.partition,
            )

    @staticmethod
    async def _watch_draining(
        draining: trio_util.AsyncBool, events: Events[Any], scope: trio.CancelScope
    ) -> None:
        with scope:
            await draining.wait_value(True)
            events._drain()

    async def _create_group(self, key: str) -> None:
        try:
            with redis_errors(), trio.fail_after(self.command_timeout):
                await self.redis.xgroup_create(key, self.group, "0", mkstream=True)
            log.info("created consumer group %r on %s", self.group, key)
        except GroupExists:
            pass
        except trio.TooSlowError as exc:
            raise RedisUnavailable("redis", "creating the consumer group timed out") from exc

    # -- the background task --

    def _wake(self) -> None:
        self._changed.set()
        if self._block_scope is not None:
            self._block_scope.cancel()

    def _room_freed(self, state: _PartitionState) -> None:
        # Called by Events when a batch is used up; wakes us if the partition was full.
        if state.batches_out == self.prefetch - 1:
            self._changed.set()

    async def _run(self) -> None:
        delays = None
        while True:
            # A fresh event each round: a wake after the checks below is not lost.
            self._changed = trio.Event()
            active = [s for s in self._states.values() if s.active]
            has_room = [s for s in active if s.batches_out < self.prefetch]
            ready = [s for s in has_room if not s.idle]
            try:
                if ready:
                    await self._read_all(ready)
                    delays = None
                    continue
                idle = [s for s in has_room if s.idle]
                stalled = len(has_room) < len(active)
                if idle and not stalled:
                    await self._block(idle)
                elif idle:
                    # Some partition waits for its consumer to make room: XREAD would
                    # need cancelling each time it does, so poll the idle ones instead.
                    with trio.move_on_after(self.busy_poll) as poll:
                        await self._changed.wait()
                    if poll.cancelled_caught:
                        for state in idle:
                            state.idle = False
                else:
                    await self._changed.wait()
                delays = None
            except RedisUnavailable as exc:
                if delays is None:
                    delays = Backoff().delays()
                delay = next(delays)
                log.warning("fetching failed: %s (retrying in %.2fs)", exc.reason, delay)
                await trio.sleep(delay)

    async def _read_all(self, states: list[_PartitionState]) -> None:
        if len(states) == 1:
            error = await self._read(states[0])
        else:
            errors: list[RedisUnavailable] = []

            async def read(state: _PartitionState) -> None:
                error = await self._read(state)
                if error is not None:
                    errors.append(error)

            async with trio.open_nursery() as nursery:
                for state in states:
                    nursery.start_soon(read, state)
            error = errors[0] if errors else None
        if error is not None:
            raise error

    async def _read(self, state: _PartitionState) -> RedisUnavailable | None:
        """Run one fenced read; return (not raise) Redis being unavailable."""
        held = state.held
        if held.lost_reason is not None:
            self._fail(state, LockLost(held.name, held.lost_reason))
            return None
        lease = held.lease
        try:
            with redis_errors(), trio.fail_after(self.command_timeout):
                reply: Any = await _READ_SCRIPT(
                    keys=[state.key, lease.key],
                    args=[lease.value, self.group, state.consumer, self.batch_size, state.start],
                    client=self.redis,
                )
        except trio.TooSlowError:
            return RedisUnavailable("redis", "a fenced read timed out")
        except RedisUnavailable as exc:
            return exc
        except NoSuchGroup:
            log.warning("consumer group %r on %s vanished; recreating it", self.group, state.key)
            try:
                await self._create_group(state.key)
            except RedisUnavailable as unavailable:
                return unavailable
            except StreamkitError as error:
                self._fail(state, error)
            return None
        except BackendError as exc:
            self._fail(state, exc)
            return None
        self._reads += 1
        state.reads += 1
        if not state.active:
            # Unregistered meanwhile: what was read stays pending for the next owner.
            return None
        if reply == 0:
            self._fail(
                state,
                LockLost(held.name, "a fenced read was refused: the lock is no longer ours"),
            )
            return None
        entries, counts, next_start, last_id = reply
        state.start = _text(next_start)
        if entries:
            batch = self._events_of(state.partition, entries, counts)
            if batch:
                state.send.send_nowait(batch)
                state.batches_out += 1
                state.entries_out += len(batch)
                state.entries_read += len(batch)
        elif state.start == ">":
            state.idle = True
            state.last_id = _text(last_id)
        return None

    def _events_of(self, partition: int, entries: list[Any], counts: list[int]) -> list[Event[R]]:
        codec = self.stream.codec
        name = self.stream.name
        if counts:
            return [
                Event(partition, _text(e[0]), _pairs(e[1]), c, codec, name)
                for e, c in zip(entries, counts, strict=True)
            ]
        return [Event(partition, _text(e[0]), _pairs(e[1]), 1, codec, name) for e in entries]

    async def _block(self, idle: list[_PartitionState]) -> None:
        """Wait in one ``XREAD BLOCK`` until an idle partition has new entries."""
        streams = {s.key: s.last_id for s in idle}
        by_key = {s.key.encode(): s for s in idle}
        block_ms = max(1, round(self.idle_block * 1000))
        self._blocks += 1
        with trio.CancelScope() as scope:
            self._block_scope = scope
            try:
                # On a connection of its own: cancelling it (on every partition change)
                # discards that connection only, never one other commands are on.
                reply = await run_blocking(
                    self.redis,
                    lambda r: r.xread(
                        cast("dict[str | bytes, str | bytes]", streams), count=1, block=block_ms
                    ),
                    within=self.idle_block + self.command_timeout,
                    what="a blocking read",
                )
            finally:
                self._block_scope = None
        if scope.cancelled_caught or not reply:
            return
        for key in reply:
            state = by_key.get(key if isinstance(key, bytes) else key.encode())
            if state is not None:
                state.idle = False

    def _fail(self, state: _PartitionState, error: StreamkitError) -> None:
        if state.failure is None:
            log.warning(
                "stopped fetching %s partition %d: %s", self.stream.name, state.partition, error
            )
            state.failure = error
        state.active = False
        # Wakes a consumer waiting for a batch: it raises the failure.
        state.send.close()

    # -- acknowledgements (called by Events) --

    async def _ack(self, state: _PartitionState, ids: list[str]) -> None:
        lease = state.held.lease
        for start in range(0, len(ids), ACK_CHUNK):
            chunk = ids[start : start + ACK_CHUNK]
            try:
                with redis_errors(), trio.fail_after(self.command_timeout):
                    acked: Any = await _ACK_SCRIPT(
                        keys=[state.key, lease.key],
                        args=[lease.value, self.group, *chunk],
                        client=self.redis,
                    )
            except trio.TooSlowError as exc:
                raise RedisUnavailable("redis", "a fenced acknowledgement timed out") from exc
            if acked == -1:
                error = LockLost(
                    state.held.name,
                    "a fenced acknowledgement was refused: the lock is no longer ours",
                )
                self._fail(state, error)
                raise error

    # -- inspection --

    def statistics(self) -> FetcherStatistics:
        """Return a snapshot of the fetcher's buffers and activity."""
        states = self._states
        return FetcherStatistics(
            partitions=tuple(sorted(states)),
            buffered_batches={p: s.batches_out for p, s in states.items()},
            buffered_entries={p: s.entries_out for p, s in states.items()},
            history=tuple(sorted(p for p, s in states.items() if s.start != ">")),
            reads=self._reads,
            blocks=self._blocks,
        )

    def __repr__(self) -> str:
        buffered = sum(s.entries_out for s in self._states.values())
        return (
            f"<Fetcher {self.stream.name} group={self.group!r} "
            f"partitions={sorted(self._states)} buffered={buffered} reads={self._reads}>"
        )


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    it = iter(flat)
    return dict(zip(it, it, strict=True))


@contextlib.asynccontextmanager
async def open_fetcher(
    redis: Redis,
    stream: Stream[R],
    *,
    group: str,
    batch_size: int = DEFAULT_BATCH_SIZE,
    prefetch: int = DEFAULT_PREFETCH,
    idle_block: float = DEFAULT_IDLE_BLOCK,
    busy_poll: float = DEFAULT_BUSY_POLL,
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
) -> AsyncIterator[Fetcher[R]]:
    """Run a :class:`Fetcher` for ``stream``'s consumer group ``group``.

    One background task serves every registered partition: it runs one fenced read
    per partition whose buffer has room (concurrently), and when none had anything
    new, waits in one blocking ``XREAD`` over all idle partitions.

    Args:
        redis: a client from :func:`streamkit.open_redis`.
        stream: the stream to read.
        group: the consumer group, ``_keys.processor_group(app, stream, processor)``.
        batch_size: entries per read.
        prefetch: batches buffered per partition, including the one being processed:
            at most ``prefetch * batch_size`` entries per partition are in memory,
            whatever the backlog.
        idle_block: seconds one blocking ``XREAD`` waits before it is renewed.
        busy_poll: while some partition's buffer is full, idle partitions are polled
            this often instead of blocking.
        command_timeout: seconds after which a Redis command counts as failed.

    Error handling:
        :class:`ConfigError` for bad arguments. Redis being unavailable does not end
        the fetcher: it retries with backoff, logging each failure.
    """
    if batch_size < 1:
        raise ConfigError("batch_size", f"must be a positive integer, got {batch_size!r}")
    if prefetch < 1:
        raise ConfigError("prefetch", f"must be a positive integer, got {prefetch!r}")
    for name, value in (
        ("idle_block", idle_block),
        ("busy_poll", busy_poll),
        ("command_timeout", command_timeout),
    ):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(name, f"must be a positive number of seconds, got {value!r}")
    fetcher = Fetcher(
        redis,
        stream,
        group,
        batch_size,
        prefetch,
        idle_block,
        busy_poll,
        command_timeout,
    )
    body_exc: BaseException | None = None
    task_exc: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            fetcher._nursery = nursery
            nursery.start_soon(fetcher._run)
            try:
                yield fetcher
            except BaseException as exc:
                # Re-raised below as itself, not wrapped in the nursery's group.
                body_exc = exc
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group_exc:
        task_exc = meaningful_leaf(group_exc)
    finally:
        fetcher._nursery = None
    to_raise = pick_exception(body_exc, task_exc)
    if to_raise is not None:
        raise to_raise
