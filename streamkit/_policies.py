"""Exception policies: what happens when processing an event fails.

:func:`run_processor` calls a processor ``fn(events)``; when it raises, the policy
decides what becomes of the events it was processing (the *in-flight* events: the
current event of :meth:`~streamkit.Events.records`, or the current batch of
:meth:`~streamkit.Events.take`), and then calls ``fn(events)`` again to continue.

=================  ==========================================================
action             what happens to the failing event(s)
=================  ==========================================================
``"halt"``         left pending; :class:`~streamkit.ProcessorHalted` is raised
``"retry"``        delivered again, first (order kept), after a backoff delay,
                   up to ``retries`` times; then ``on_exhausted``
``"dead_letter"``  written to the processor's dead-letter stream, then acked
``"ignore"``       acknowledged and logged
=================  ==========================================================

Two kinds of events skip the retries and never reach the processor: *undecodable*
events, which can never succeed, go to ``on_undecodable``, and *poison* events,
delivered more than ``max_deliveries`` times (say, after crash loops), go to
``on_poison``; both are dead-lettered by default. Nothing is ever dropped silently:
every decision is logged on ``streamkit.policies``, with the processor's traceback
when its exception ends a retry budget, halts, dead-letters or is ignored.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs
import trio

from ._backoff import Backoff
from ._defaults import DEFAULT_STATE_CACHE_SIZE
from ._errors import ConfigError, DecodeError, LateEvent, ProcessorHalted, RedisUnavailable
from ._events import DEFAULT_ACK_BATCH, open_events
from ._redis import Redis, as_unavailable, redis_errors
from ._validate import non_negative_int, one_of, positive_int

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Sequence

    import trio_util

    from ._events import Event, Events, Middleware
    from ._feed import PartitionFeed
    from ._meter import PartitionMeter
    from ._spec import HasSpec, StreamSpec
    from ._state import TableLike
    from .jobs import Job

__all__ = ["DEAD_LETTER_FIELDS", "ExceptionPolicy", "run_processor"]

R = TypeVar("R")

log = logging.getLogger("streamkit.policies")

Action = Literal["halt", "retry", "dead_letter", "ignore"]
ExhaustedAction = Literal["halt", "dead_letter", "ignore"]
DivertAction = Literal["dead_letter", "halt", "ignore"]

DEFAULT_MAX_DELIVERIES = 20
DEFAULT_RETRIES = 3
DEFAULT_RETRY_BACKOFF = Backoff(initial=0.1, maximum=5.0)
DEAD_LETTER_TIMEOUT = 10.0

#: The fields a dead letter adds to the original entry's fields. Their names contain
#: a dot, which no record field name can, so they never collide with the original.
DEAD_LETTER_FIELDS = (
    b"dl.reason",  # "error", "poison", "undecodable" or "retries exhausted"
    b"dl.error_type",  # the exception's qualified name ("" for poison events)
    b"dl.error",  # the exception's message, or why the event is poison
    b"dl.stream",  # the stream's name
    b"dl.partition",  # the partition number
    b"dl.entry_id",  # the original entry id
    b"dl.delivery_count",  # attempts: Redis deliveries plus the retries made in place
    b"dl.group",  # the consumer group (app.stream.processor)
    b"dl.time",  # Unix time in seconds, as a decimal string
)


def _is_backoff(_: object, __: attrs.Attribute[Backoff], value: object) -> None:
    if not isinstance(value, Backoff):
        raise ConfigError(
            "backoff", f"expected a Backoff (e.g. Backoff(initial=0.1)), got {value!r}"
        )


@attrs.frozen(kw_only=True)
class ExceptionPolicy:
    """What to do when a processor raises while processing events.

    Attributes:
        action: what happens when the processor raises: ``"halt"`` (the default:
            the partition stops at the event, the worker's other partitions go on),
            ``"retry"``, ``"dead_letter"`` or ``"ignore"``.
        retries: with ``"retry"``: how many times the failing events are delivered
            again before ``on_exhausted`` applies.
        backoff: with ``"retry"``: the delays before each retry.
        on_exhausted: ``"halt"``, ``"dead_letter"`` or ``"ignore"``: what happens
            after the retries.
        on_undecodable: ``"dead_letter"`` (the default), ``"halt"`` or
            ``"ignore"``: what happens to an event that cannot be decoded into the
            stream's record; it never reaches the processor (it could never
            succeed). Without a Redis client to write dead letters with (see
            :func:`run_processor`), the default halts instead.
        on_poison: ``"dead_letter"`` (the default), ``"halt"`` or ``"ignore"``:
            what happens to a poison event, one Redis delivered more than
            ``max_deliveries`` times (crash loops, takeovers); it never reaches the
            processor. Without a Redis client, the default halts instead.
        max_deliveries: the poison threshold. ``None``: no limit. Each takeover of
            a partition counts as a delivery of the entries its previous owner had
            fetched but not finished, so keep it well above the number of
            rebalances an event may live through.

    Example::

        ExceptionPolicy(action="retry", retries=5, on_exhausted="dead_letter",
                        max_deliveries=10)
    """

    action: Action = attrs.field(
        default="halt", validator=one_of("halt", "retry", "dead_letter", "ignore")
    )
    retries: int = attrs.field(default=DEFAULT_RETRIES, validator=non_negative_int)
    backoff: Backoff = attrs.field(default=DEFAULT_RETRY_BACKOFF, validator=_is_backoff)
    on_exhausted: ExhaustedAction = attrs.field(
        default="halt", validator=one_of("halt", "dead_letter", "ignore")
    )
    max_deliveries: int | None = attrs.field(
        default=DEFAULT_MAX_DELIVERIES, validator=positive_int.or_none()
    )
    on_undecodable: DivertAction = attrs.field(
        default="dead_letter", validator=one_of("dead_letter", "halt", "ignore")
    )
    on_poison: DivertAction = attrs.field(
        default="dead_letter", validator=one_of("dead_letter", "halt", "ignore")
    )

    @property
    def final_action(self) -> ExhaustedAction:
        """The action for events whose processing failed and is not retried (any
        more): ``on_exhausted`` with ``"retry"``, else the action itself."""
        return self.on_exhausted if self.action == "retry" else self.action

    def diverted_action(self, reason: str) -> DivertAction:
        """The action for events that never reach the processor: ``reason`` is
        ``"undecodable"`` or ``"poison"``."""
        return self.on_undecodable if reason == "undecodable" else self.on_poison


def _error_text(error: BaseException | None) -> tuple[str, str]:
    if error is None:
        return "", ""
    kind = type(error)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    return name, str(error)


def dead_letter_fields(
    event: Event[Any],
    *,
    group: str,
    reason: str,
    error: BaseException | None,
    detail: str = "",
    retried: int = 0,
) -> dict[bytes, bytes]:
    """The fields of ``event``'s dead letter: its own, plus :data:`DEAD_LETTER_FIELDS`.

    ``retried``: the attempts made in place (retries) on top of Redis's deliveries.
    """
    error_type, message = _error_text(error)
    fields = dict(event.fields)
    fields.update(
        {
            b"dl.reason": reason.encode(),
            b"dl.error_type": error_type.encode(),
            b"dl.error": (message or detail).encode("utf-8", "replace"),
            b"dl.stream": event.stream.encode(),
            b"dl.partition": str(event.partition).encode(),
            b"dl.entry_id": event.entry_id.encode(),
            b"dl.delivery_count": str(event.delivery_count + retried).encode(),
            b"dl.group": group.encode(),
            b"dl.time": f"{time.time():.6f}".encode(),
        }
    )
    return fields


@attrs.define(eq=False)
class _Handler:
    """Applies a policy to one partition's failures; keeps the retry count."""

    policy: ExceptionPolicy
    stream: str
    partition: int
    group: str
    redis: Redis | None
    dead_letter_key: str
    # The partition's counters, when the feed has them (see streamkit.metrics).
    meter: PartitionMeter | None = None
    _failing: tuple[bytes, ...] | None = attrs.field(default=None, init=False)
    _attempts: int = attrs.field(default=0, init=False)
    _delays: Iterator[float] | None = attrs.field(default=None, init=False)

    def _where(self, events: Sequence[Event[Any]]) -> str:
        ids = ", ".join(e.entry_id for e in events[:3]) + (", ..." if len(events) > 3 else "")
        return f"{self.stream} partition {self.partition} [{ids}]"

    async def divert(self, event: Event[Any], error: BaseException | None, reason: str) -> None:
        """An event that must not reach the processor: poison or undecodable."""
        detail = ""
        if reason == "poison":
            detail = (
                f"delivered {event.delivery_count} times, more than "
                f"max_deliveries={self.policy.max_deliveries}"
            )
        await self._apply(self._diverted_action(reason), [event], error, reason, detail)

    def _diverted_action(self, reason: str) -> ExhaustedAction:
        action = self.policy.diverted_action(reason)
        if action == "dead_letter" and self.redis is None:
            # run_processor without a Redis client (a composer's canned feed, say):
            # nowhere to write the dead letter, and dropping it is never an option.
            return "halt"
        return action

    async def handle(self, events: Events[Any], error: Exception) -> None:
        """The processor raised ``error``: apply the policy, or raise ProcessorHalted."""
        failing = events.in_flight
        policy = self.policy
        # Whatever happens to the failed events next, what processing them wrote
        # (table writes, emitted records) is forgotten.
        events.discard(error)
        if not failing:
            await self._not_tied_to_events(error)
            return
        if self.meter is not None:
            self.meter.failed += len(failing)
        if isinstance(error, DecodeError):
            # Raised by a lazy ``event.record`` in the processor: as undecodable.
            await self._apply(self._diverted_action("undecodable"), failing, error, "undecodable")
        elif isinstance(error, LateEvent):
            # A windowed table's late="dead_letter": the event goes to the dead letters.
            action: ExhaustedAction = "dead_letter" if self.redis is not None else "halt"
            await self._apply(action, failing, error, "late")
        elif policy.action == "retry":
            key = tuple(e._id for e in failing)
            if key != self._failing:
                self._failing = key
                self._attempts = 0
                self._delays = policy.backoff.delays()
            if self._attempts < policy.retries:
                self._attempts += 1
                assert self._delays is not None
                delay = next(self._delays)
                log.warning(
                    "processing %s failed (%s: %s); retry %d of %d in %.2fs",
                    self._where(failing),
                    type(error).__name__,
                    error,
                    self._attempts,
                    policy.retries,
                    delay,
                )
                await trio.sleep(delay)
                events.rewind()
                return
            await self._apply(
                policy.on_exhausted, failing, error, "retries exhausted", retried=self._attempts
            )
        else:
            await self._apply(policy.action, failing, error, "error")
        # Dead-lettered or ignored: the processor has moved past them, and the next
        # failure starts a retry budget of its own.
        self._failing = None
        events.commit()
        await events.flush()

    async def _not_tied_to_events(self, error: Exception) -> None:
        # Raised before the first event or after the last: nothing to dead-letter or
        # skip, so retry the processor with backoff, then halt.
        policy = self.policy
        if self._failing != ():
            self._failing = ()
            self._attempts = 0
            self._delays = policy.backoff.delays()
        if policy.action != "halt" and self._attempts < max(policy.retries, 1):
            self._attempts += 1
            assert self._delays is not None
            delay = next(self._delays)
            log.warning(
                "processor of %s partition %d failed outside any event (%s: %s); "
                "calling it again in %.2fs",
                self.stream,
                self.partition,
                type(error).__name__,
                error,
                delay,
            )
            await trio.sleep(delay)
            return
        log.error(
            "processor of %s partition %d failed outside any event; halting the partition",
            self.stream,
            self.partition,
            exc_info=_user_traceback(error),
        )
        raise ProcessorHalted(
            f"{type(error).__name__}: {error}", stream=self.stream, partition=self.partition
        ) from error

    async def _apply(
        self,
        action: ExhaustedAction,
        failing: Sequence[Event[Any]],
        error: BaseException | None,
        reason: str,
        detail: str = "",
        *,
        retried: int = 0,
    ) -> None:
        what = f"{type(error).__name__}: {error}" if error is not None else detail
        # The processor's own traceback (file and line), once, with the decision;
        # a DecodeError's text says all there is to say.
        trace = _user_traceback(error)
        if action == "halt":
            log.error(
                "halting the partition on %s (%s): %s", self._where(failing), reason, what,
                exc_info=trace,
            )  # fmt: skip
            halted = ProcessorHalted(
                f"{reason}: {what}",
                stream=self.stream,
                partition=self.partition,
                entry_ids=tuple(e.entry_id for e in failing),
            )
            raise halted from error
        if action == "dead_letter":
            await self._dead_letter(failing, error, reason, detail, retried)
            if self.meter is not None:
                counts = self.meter.dead_lettered
                counts[reason] = counts.get(reason, 0) + len(failing)
            log.warning(
                "dead-lettered %s (%s): %s", self._where(failing), reason, what, exc_info=trace
            )
        else:
            log.warning("ignoring %s (%s): %s", self._where(failing), reason, what, exc_info=trace)

    async def _dead_letter(
        self,
        failing: Sequence[Event[Any]],
        error: BaseException | None,
        reason: str,
        detail: str,
        retried: int,
    ) -> None:
        redis = self.redis
        assert redis is not None  # checked by run_processor
        try:
            with redis_errors(), trio.fail_after(DEAD_LETTER_TIMEOUT):
                async with redis.pipeline(transaction=False) as pipe:
                    for event in failing:
                        pipe.xadd(
                            self.dead_letter_key,
                            dead_letter_fields(
                                event,
                                group=self.group,
                                reason=reason,
                                error=error,
                                detail=detail,
                                retried=retried,
                            ),
                        )
        except trio.TooSlowError as exc:
            raise RedisUnavailable("redis", "writing a dead letter timed out") from exc


def _user_traceback(error: BaseException | None) -> BaseException | None:
    """The exception whose traceback to log: the processor's, not a decoding error
    (its message names the entry and the field) nor a missing one."""
    if error is None or isinstance(error, DecodeError):
        return None
    return error


def _is_internal(error: BaseException, internal: BaseException | None) -> bool:
    if internal is None:
        return False
    if error is internal:
        return True
    if isinstance(error, BaseExceptionGroup):
        return any(_is_internal(e, internal) for e in error.exceptions)
    return False


async def run_processor(
    fn: Callable[[Events[R]], Awaitable[object]],
    feed: PartitionFeed,
    policy: ExceptionPolicy | None = None,
    *,
    redis: Redis | None = None,
    draining: trio_util.AsyncBool | None = None,
    middleware: Sequence[Middleware] = (),
    ack_batch: int = DEFAULT_ACK_BATCH,
    dead_letter_key: str | None = None,
    tables: Sequence[TableLike] = (),
    outputs: Sequence[StreamSpec[Any] | HasSpec[Any]] = (),
    jobs: Sequence[Job[Any, Any]] = (),
    state_cache_size: int = DEFAULT_STATE_CACHE_SIZE,
    state_replicas: int = 0,
) -> None:
    """Run ``await fn(events)`` over ``feed``'s events under ``policy``, until it returns.

    Opens the partition's :class:`~streamkit.Events` (see
    :func:`~streamkit.open_events`) with the policy's poison limit and its hook for
    events that must not reach ``fn``. When ``fn`` raises an exception, the policy
    decides what becomes of the events it was processing (see the module docs),
    then ``fn(events)`` is called again to continue with the next event (or the same
    one, when retrying).

    Args:
        fn: the processor.
        feed: the partition's feed (from :meth:`Fetcher.partition`).
        policy: the exception policy (halting by default).
        redis: the client dead letters are written with; needed when the policy
            dead-letters.
        draining: when it turns true, the iterators stop so that ``fn`` can return.
        middleware: wrappers of the raw event iterator (see :func:`open_events`).
        ack_batch: acknowledgements flushed together.
        dead_letter_key: the dead-letter stream; the processor's own,
            ``feed.keys.dead_letter_key``, by default.
        tables: the tables ``fn`` writes, committed with the acknowledgements (see
            :func:`~streamkit.open_events`); needs ``redis``.
        outputs: the streams ``fn`` emits records to, committed the same way.
        jobs: the jobs ``fn`` enqueues with :meth:`Events.enqueue
            <streamkit.Events.enqueue>`, committed the same way.
        state_cache_size: values cached per table (see :func:`~streamkit.open_events`).
        state_replicas: replicas the relay of emitted records waits for (Redis Cluster).

    Error handling:
        :class:`~streamkit.ConfigError` up front when the policy's ``action`` (or
        ``on_exhausted`` with ``"retry"``) dead-letters and no ``redis`` is given;
        without ``redis``, undecodable and poison events the policy would
        dead-letter halt instead. :class:`~streamkit.ProcessorHalted` (the processor's
        exception chained) when the policy halts. Failures of the machinery itself (a
        lost lease, Redis unreachable while fetching or acknowledging) and
        cancellation are never handled by the policy: they propagate as they are. So
        does Redis being unreachable for the processor's own commands (a coredis
        connection error is raised as :class:`~streamkit.RedisUnavailable`): the
        events stay pending.
    """
    policy = policy or ExceptionPolicy()
    if redis is None and "dead_letter" in (policy.action, policy.final_action):
        # (on_undecodable / on_poison dead-lettering without a client halts instead.)
        raise ConfigError(
            "redis", "the exception policy dead-letters: pass the Redis client (redis=...)"
        )
    handler = _Handler(
        policy,
        feed.stream.name,
        feed.partition,
        feed.keys.group,
        redis,
        dead_letter_key or feed.keys.dead_letter_key,
        feed.meter,
    )
    async with open_events(
        feed,
        draining=draining,
        middleware=middleware,
        ack_batch=ack_batch,
        max_deliveries=policy.max_deliveries,
        divert=handler.divert,
        tables=tables,
        outputs=outputs,
        jobs=jobs,
        redis=redis,
        state_cache_size=state_cache_size,
        state_replicas=state_replicas,
    ) as events:
        while True:
            try:
                await fn(events)
                return
            except ProcessorHalted:
                raise
            except Exception as error:
                if _is_internal(error, events.failure):
                    raise
                unavailable = as_unavailable(error)
                if unavailable is not None:
                    # Redis going away (a restart, a failover) is not the events'
                    # fault: no policy applies. They stay pending; the partition is
                    # restarted once Redis is back (see the rebalancer).
                    raise unavailable from error
                await handler.handle(events, error)
