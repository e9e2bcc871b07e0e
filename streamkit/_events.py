"""Events: what a processor receives for one partition.

An :class:`Events` object hands out a partition's events in order, through
:meth:`Events.records`, :meth:`Events.take` or :meth:`Events.raw`, and acknowledges
each one only after the processor has moved past it (at-least-once). It takes its
batches from a :class:`~streamkit.PartitionFeed` and gives acknowledgements back to it;
it knows nothing else of Redis or of the fetcher.

It is the public face of four parts, one module each:

* :mod:`~streamkit._events_ledger`: the bookkeeping (buffered, in flight, replayed,
  done), pure;
* :mod:`~streamkit._events_delivery`: the machinery (the feed, the lease check,
  poison and undecodable events, draining, the commit of what is done);
* :mod:`~streamkit._events_iterators`: ``records()``, ``raw()``, ``take()``;
* :mod:`~streamkit._events_middleware`: the middleware pump.

Delivery bookkeeping, in brief:

* an event handed to the processor is *in flight*;
* when the processor asks for the next event (or batch), or returns normally, the
  in-flight events are *done*: their ids are committed (acknowledged) in batches of
  ``ack_batch`` and before every wait for new events (the feed sends them with the
  partition's next read), and when the block is left;
* a policy runner may instead *rewind* them (they are handed out again, first, in
  order) or let them stay pending by leaving the processor with an exception;
* an event that must not reach the processor (poison, undecodable) is given to the
  ``divert`` hook and then *skipped*: acknowledged without being processed.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from ._defaults import DEFAULT_STATE_CACHE_SIZE
from ._errors import ConfigError, LateEvent, LockLost, RedisUnavailable, StreamkitError
from ._event import DivertHook, Event, Middleware
from ._events_delivery import DEFAULT_ACK_BATCH, Delivery
from ._events_iterators import Batches, Entries, EntrySpan, OneByOne, Traced
from ._events_middleware import MiddlewarePump
from ._nurseries import open_service_nursery
from ._state import PartitionState
from .jobs._model import JobCall

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Generator, Mapping, Sequence
    from datetime import datetime

    import trio_util

    from ._feed import PartitionFeed
    from ._redis import Redis
    from ._spec import HasSpec, ProcessorKeys, StreamSpec
    from ._state import TableLike
    from .jobs import Job, JobHandle, Priority
    from .jobs._model import JobRef, When

__all__ = ["DEFAULT_ACK_BATCH", "DivertHook", "Event", "Events", "Middleware", "open_events"]

R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("streamkit.events")

#: Leaving a partition flushes its acknowledgements for at most this long (shielded).
ACK_FLUSH_TIMEOUT = 2.0


class Events(Generic[R]):
    """The events of one partition, as handed to a processor.

    Get one from :func:`open_events` (or, with an exception policy, from
    :func:`~streamkit.run_processor`, which opens it for you). Iterate it with
    :meth:`records`, :meth:`take` or :meth:`raw`; one iterator at a time, from one task.

    Acknowledgement:
        An event is acknowledged once the processor has moved past it: when it asks
        any iterator for the next event, or returns normally. An event whose
        processing raised or was cancelled stays pending and is delivered again
        (to this processor after a retry, or to the partition's next owner).

    Policy runners (such as :func:`~streamkit.run_processor`) steer the bookkeeping
    with :attr:`in_flight`, :meth:`commit`, :meth:`rewind`, :meth:`skip` and
    :meth:`flush`.

    Attributes:
        partition: the partition number.
        stream: the stream's description.
        keys: the processor's keys (consumer group, dead-letter stream, lock names).
    """

    def __init__(self, delivery: Delivery[R]) -> None:
        self.partition: int = delivery.feed.partition
        self.stream: StreamSpec[R] = delivery.feed.stream
        self.keys: ProcessorKeys = delivery.feed.keys
        self._delivery = delivery

    # -- public iterators --

    def records(self) -> AsyncIterator[R]:
        """Iterate over the partition's records, decoded, in order.

        Stops (after acknowledging the last record) when the partition is being
        drained away. An undecodable entry raises :class:`DecodeError` (under
        :func:`~streamkit.run_processor`, it goes through the exception policy instead).
        """
        return self._traced(OneByOne(self._delivery, decode=True), batch=False)

    def raw(self) -> AsyncIterator[Event[R]]:
        """Iterate over the partition's :class:`Event` objects, in order.

        Records are decoded only when ``event.record`` is read.
        """
        return self._traced(OneByOne(self._delivery, decode=False), batch=False)

    def take(self, n: int, *, within: float | None = None) -> AsyncIterator[list[R]]:
        """Iterate over batches of up to ``n`` records, in order.

        A batch is yielded as soon as it is full, or, with ``within``, once
        ``within`` seconds have passed since its first event arrived (a partial
        batch). Batches are never empty. The whole batch is acknowledged when the
        processor asks for the next one.
        """
        return self._traced(Batches(self._delivery, n, within, decode=True), batch=True)

    def take_raw(self, n: int, *, within: float | None = None) -> AsyncIterator[list[Event[R]]]:
        """As :meth:`take`, yielding lists of :class:`Event` objects."""
        return self._traced(Batches(self._delivery, n, within, decode=False), batch=True)

    def _entries(self, n: int, *, decode: bool = False) -> AsyncIterator[EntrySpan]:
        """Batches of up to ``n`` entries as stored (ids, flat field lists, and with
        ``decode`` their records), no event objects: for streamkit's own processors (a
        join's). See :class:`Entries`."""
        entries: AsyncIterator[EntrySpan] = Entries(self._delivery, n, decode=decode)  # type: ignore[assignment]
        return self._traced(entries, batch=True)

    def _decode_entry(self, flat: list[bytes], entry_id: bytes) -> R:
        """The record of an entry (from :meth:`_entries`), as :attr:`Event.record`
        decodes it."""
        record: R = self._delivery.decode(flat, entry_id)
        return record

    def _traced(self, iterator: AsyncIterator[T], *, batch: bool) -> AsyncIterator[T]:
        # With a tracer provider set, each record (or batch) is handled in a span
        # (see docs/observability.md, "Traces"); without one, the iterator as it is.
        spans = self._delivery.spans
        return iterator if spans is None else Traced(iterator, spans, batch=batch)

    @property
    def group(self) -> str:
        """The consumer group."""
        return self.keys.group

    @property
    def draining(self) -> bool:
        """Whether the partition is being moved away (the iterators will stop)."""
        return self._delivery.is_draining()

    @property
    def failure(self) -> BaseException | None:
        """The failure of the machinery (lease lost, feed ended, Redis gone) that
        stopped the iterators, if any. Such errors are never the events' fault: a
        policy runner lets them propagate."""
        return self._delivery.failure

    @property
    def state(self) -> PartitionState | None:
        """The partition's state (tables and outputs), if the processor keeps any."""
        return self._delivery.state

    @property
    def acknowledged(self) -> int:
        """Events acknowledged (handed over to be committed) so far."""
        return self._delivery.acknowledged

    # -- state --

    def emit(self, stream: StreamSpec[Any] | HasSpec[Any], record: Any) -> None:
        """Emit ``record`` to the output ``stream``, exactly once.

        The record is appended by the commit that acknowledges the events being
        processed, in the order emitted, or not at all: a redelivered event emits
        again only what its first processing did not commit.

        Error handling:
            :class:`~streamkit.ConfigError` if ``stream`` is not one of the
            processor's outputs; :class:`~streamkit.EncodeError` if ``record`` does
            not fit the stream.
        """
        state = self._delivery.state
        if state is None:
            raise ConfigError(
                "outputs",
                "this processor has no outputs: name them in @app.processor(..., "
                "outputs=[...]) or open_events(..., outputs=[...])",
            )
        state.emit(stream, record)

    def enqueue(
        self,
        job: Job[Any, Any],
        *args: Any,
        job_id: str | None = None,
        delay: When | None = None,
        at: datetime | None = None,
        priority: Priority | None = None,
        expires: When | datetime | None = None,
        after: Sequence[JobRef | str] = (),
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> JobHandle[Any]:
        """Enqueue ``job`` with these arguments, exactly once per event.

        The job is written by the commit that acknowledges the events being
        processed, or not at all (as :meth:`emit`'s records): a redelivered event
        enqueues again only what its first processing did not commit. The commit
        appends it to the partition's outbox, and the partition's relay runs it on the
        job's shard, once, whatever fails (see :doc:`jobs`). The options are those of
        :meth:`Job.enqueue <streamkit.jobs.Job.enqueue>`.

        Returns:
            the job's handle, at once; the job exists once its commit landed and the
            relay ran (usually within a millisecond of the commit).

        Error handling:
            :class:`~streamkit.ConfigError` if ``job`` is not one of the processor's
            jobs (``jobs=[...]``) or depends (``after=``) on jobs of another shard;
            as :meth:`Job.enqueue <streamkit.jobs.Job.enqueue>` for the arguments and
            options, before anything is committed.
        """
        state = self._delivery.state
        if state is None:
            raise ConfigError(
                "jobs",
                "this processor enqueues no jobs: name them in @app.processor(..., "
                "jobs=[...]) or open_events(..., jobs=[...])",
            )
        call = JobCall(
            args=args,
            kwargs=kwargs,
            job_id=job_id,
            delay=delay,
            at=at,
            priority=priority,
            expires=expires,
            after=after,
            headers=headers,
        )
        return state.enqueue(job, call)

    # -- the policy runner's API --

    @property
    def in_flight(self) -> tuple[Event[R], ...]:
        """The events handed to the processor that it has not moved past yet."""
        return tuple(self._delivery.ledger.inflight)

    def commit(self) -> Awaitable[None]:
        """Count the in-flight events as processed; awaited, also commit now.

        ``events.commit()`` counts them (and their table writes and emitted records)
        as done: they are committed with the next acknowledgement, as after moving
        past them. ``await events.commit()`` also commits everything done at once, in
        one fenced call, and returns once it landed.

        Error handling:
            Awaited, as :meth:`flush`.
        """
        self._delivery.ledger.move_past()
        return _CommitNow(self._delivery)

    def discard(self, error: BaseException | None = None) -> None:
        """The processing of the in-flight events failed: forget the table writes and
        emitted records it made (a policy runner calls this before it retries,
        dead-letters or skips them). With tracing on (see :doc:`observability`), their
        span ends here, recording ``error``, the processor's, if given. A
        :class:`~streamkit.LateEvent` (dead-lettered, whatever the policy) still counts
        as its windowed table's late event."""
        spans = self._delivery.spans
        if spans is not None:
            spans.end(error)
        late = error.table if isinstance(error, LateEvent) else None
        self._delivery.ledger.discard(late=late)

    def rewind(self) -> None:
        """Hand the in-flight events out again, first and in order (a retry in place)."""
        self._delivery.ledger.rewind()

    def skip(self, event: Event[R]) -> None:
        """Count ``event``, which never reached the processor, as done (acknowledged
        at the next flush)."""
        self._delivery.ledger.skip(event)

    async def flush(self) -> None:
        """Acknowledge the events counted as done so far (fenced by the lease).

        Error handling:
            :class:`~streamkit.LockLost` or :class:`~streamkit.RedisUnavailable`
            from the feed; the ids are kept for a later attempt (they are pending in
            Redis either way) and the error is recorded as :attr:`failure`.
        """
        await self._delivery.commit_now()

    def __repr__(self) -> str:
        delivery = self._delivery
        ledger = delivery.ledger
        return (
            f"<Events {self.stream.name} partition {self.partition} "
            f"in flight {ledger.inflight_count()}, unacknowledged {ledger.done_count()}, "
            f"acknowledged {delivery.acknowledged}{', draining' if delivery.draining else ''}>"
        )


class _CommitNow:
    """What :meth:`Events.commit` returns: awaiting it commits at once."""

    __slots__ = ("_delivery",)

    def __init__(self, delivery: Delivery[Any]) -> None:
        self._delivery = delivery

    def __await__(self) -> Generator[Any, None, None]:
        return self._delivery.commit_now().__await__()


@contextlib.asynccontextmanager
async def open_events(
    feed: PartitionFeed,
    *,
    draining: trio_util.AsyncBool | None = None,
    middleware: Sequence[Middleware] = (),
    ack_batch: int = DEFAULT_ACK_BATCH,
    max_deliveries: int | None = None,
    divert: DivertHook | None = None,
    tables: Sequence[TableLike] = (),
    outputs: Sequence[StreamSpec[Any] | HasSpec[Any]] = (),
    jobs: Sequence[Job[Any, Any]] = (),
    redis: Redis | None = None,
    state_cache_size: int = DEFAULT_STATE_CACHE_SIZE,
    state_replicas: int = 0,
) -> AsyncIterator[Events[Any]]:
    """Hand out ``feed``'s events to a processor while the block runs.

    Args:
        feed: the partition's feed (from :meth:`Fetcher.partition`).
        draining: when it turns true, the event iterators stop after the current
            event or batch (acknowledged), so the processor can return.
        middleware: wrappers of the raw event iterator, applied in order (the first
            is closest to Redis, the last closest to the processor).
        ack_batch: flush acknowledgements when this many accumulate; they are also
            flushed before waiting for events and when the block is left.
        max_deliveries: events delivered more often than this are *poison*: they
            go to ``divert`` instead of the processor (``None``: no limit; a limit
            needs a ``divert`` hook).
        divert: the hook for poison and undecodable events (see
            :data:`~streamkit.lowlevel.DivertHook`); without one an undecodable record raises
            :class:`~streamkit.DecodeError` from the iterator.
        tables: the tables the processor writes (see :class:`~streamkit.Table`):
            inside the block, their ``get``, ``set`` and ``delete`` work on this
            partition, and the writes are committed with the acknowledgements.
        outputs: the streams the processor may :meth:`~Events.emit` records to,
            committed the same way.
        jobs: the jobs the processor may :meth:`~Events.enqueue`, committed the same
            way (and relayed to their queues).
        redis: the client tables read with; needed with ``tables``, ``outputs`` or
            ``jobs``.
        state_cache_size: values cached per table, at most.
        state_replicas: on Redis Cluster, replicas the relay of emitted records waits
            for at each step (see :doc:`state`).

    Cancellation:
        Leaving the block stops the middleware and the draining watcher (both run in
        this task's nursery), then acknowledges what the processor moved past,
        shielded, for at most :data:`ACK_FLUSH_TIMEOUT` seconds. When the block ends
        normally the in-flight events count as processed; after an exception or a
        cancellation they stay pending, for the next delivery.

    Error handling:
        :class:`~streamkit.LockLost` (from the iterators) once the lease is gone;
        an acknowledgement failing on the way out is logged when the block raised,
        else raised.
    """
    state = None
    if tables or outputs or jobs:
        if redis is None:
            raise ConfigError("redis", "tables, outputs and jobs need the Redis client (redis=...)")
        state = PartitionState(
            redis,
            feed.stream,
            feed.keys,
            feed.partition,
            tables=tables,
            outputs=outputs,
            jobs=jobs,
            cache_size=state_cache_size,
            replicas=state_replicas,
        )
        await state.open()
    delivery: Delivery[Any] = Delivery(
        feed,
        draining=draining,
        ack_batch=ack_batch,
        max_deliveries=max_deliveries,
        divert=divert,
        middleware=middleware,
        state=state,
    )
    events: Events[Any] = Events(delivery)
    ended_normally = False
    token = state.activate() if state is not None else None
    try:
        async with open_service_nursery(reason="events closed") as nursery:
            delivery.set_pump_factory(lambda: MiddlewarePump(delivery, nursery))
            if draining is not None:
                nursery.start_soon(_watch_draining, draining, delivery)
            relay = state.start_relay(feed.held) if state is not None else None
            if relay is not None:
                nursery.start_soon(relay.run)
            yield events
        ended_normally = True
    finally:
        if token is not None:
            PartitionState.deactivate(token)
        if delivery.spans is not None:
            delivery.spans.end()
        delivery.set_pump_factory(None)
        delivery.stop_pump()
        await _leave(delivery, commit=ended_normally)


async def _watch_draining(draining: trio_util.AsyncBool, delivery: Delivery[Any]) -> None:
    await draining.wait_value(True)
    delivery.drain()


async def _leave(delivery: Delivery[Any], *, commit: bool) -> None:
    if commit:
        delivery.ledger.move_past()
    delivery.finish_batch()
    feed = delivery.feed
    if feed.held.lost_reason is not None:
        return
    with trio.move_on_after(ACK_FLUSH_TIMEOUT) as scope:
        scope.shield = True
        try:
            await delivery.commit_now()
            relay = delivery.state.relay if delivery.state is not None else None
            if relay is not None:
                # What the last commits emitted, on its way before the partition goes.
                await relay.relay_all()
        except StreamkitError as exc:
            if commit:
                raise
            # Redis unreachable: the client's outage log (its pools saw the
            # connection go) says it once for every partition; a lost lease, whoever
            # runs the partition (the rebalancer) says.
            log.log(
                logging.DEBUG if isinstance(exc, RedisUnavailable | LockLost) else logging.WARNING,
                "acknowledging events of %s partition %d failed: %s",
                feed.stream.name,
                feed.partition,
                exc,
            )
    if scope.cancelled_caught:
        log.warning(
            "acknowledging events of %s partition %d timed out; "
            "they stay pending and are delivered again",
            feed.stream.name,
            feed.partition,
        )
