"""When a Redis operation is tried again, on the Trio side: the retry rules applied.

Whether a failed call goes again is decided by :class:`streamkit._retrying.RetryRule`,
the one rule the blocking and asyncio clients follow too; this module waits and sends.
The client never sends a command again by itself (a command whose connection was lost
may have run). The caller says what running it twice would do:

* :func:`retry_idempotent`: harmless (reads, acknowledgements, scripts that check
  before they write); retried while Redis is unavailable, even when it may have run.
* :func:`call_once`: not harmless (``INCR``, ``XADD``, ...); retried only while it
  surely never reached Redis.
* :func:`ride_out_refusals`: a step a worker cannot do without (recording a stream's
  metadata, joining a membership group); tried again for as long as Redis refuses it
  for a passing reason (:class:`~streamkit.ServerRefused`: out of memory, loading, a
  replica, ...), since nothing else would drain a full Redis.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .._backoff import Backoff
from .._errors import RedisUnavailable, ServerRefused
from .._outage import SUMMARY_EVERY
from .._retrying import DEFAULT_RETRY_FOR, RETRY_BACKOFF, RetryRule
from ._translate import redis_errors

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "DEFAULT_RETRY_FOR",
    "REFUSAL_BACKOFF",
    "REPORT_EVERY",
    "RETRY_BACKOFF",
    "call_once",
    "retry_idempotent",
    "ride_out_refusals",
]

T = TypeVar("T")

#: Delays between attempts while Redis refuses.
REFUSAL_BACKOFF = Backoff(initial=0.05, maximum=1.0)
#: Seconds between two warnings about the same refusal: an outage's summary interval.
REPORT_EVERY = SUMMARY_EVERY

log = logging.getLogger("streamkit.redis")


async def retry_idempotent(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    what: str,
    give_up_after: float = DEFAULT_RETRY_FOR,
    backoff: Backoff = RETRY_BACKOFF,
) -> T:
    """Await ``fn(*args)``, retrying while Redis is unavailable; for idempotent operations.

    Use it only where running the operation twice is harmless: reads, acknowledgements,
    scripts that check before they write. It is retried also when the connection was
    lost with it in flight (it may have run already).

    Error handling:
        Errors are translated as by :func:`redis_errors`. The last
        :class:`RedisUnavailable` is re-raised once ``give_up_after`` seconds passed;
        other errors are raised at once.
    """
    return await _retry_loop(
        fn, args, idempotent=True, what=what, give_up_after=give_up_after, backoff=backoff
    )


async def call_once(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    what: str,
    give_up_after: float = DEFAULT_RETRY_FOR,
    backoff: Backoff = RETRY_BACKOFF,
) -> T:
    """Await ``fn(*args)`` for an operation that must not run twice (INCR, XADD, ...).

    It is retried only while it surely never reached Redis (no connection could be
    opened, or Redis refused it while loading its data).

    Error handling:
        :class:`OutcomeUnknown`, at once, when the connection was lost with the
        operation in flight: it may or may not have run, and is not sent again. The
        last :class:`RedisUnavailable` once ``give_up_after`` seconds passed. Other
        errors as by :func:`redis_errors`.
    """
    return await _retry_loop(
        fn, args, idempotent=False, what=what, give_up_after=give_up_after, backoff=backoff
    )


async def _retry_loop(
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    *,
    idempotent: bool,
    what: str,
    give_up_after: float,
    backoff: Backoff,
) -> T:
    # Whether to try again is the rule shared with the blocking and asyncio clients.
    rule = RetryRule(
        what,
        idempotent=idempotent,
        started=trio.current_time(),
        give_up_after=give_up_after,
        backoff=backoff,
    )
    while True:
        try:
            with redis_errors():
                return await fn(*args)
        except RedisUnavailable as exc:
            delay = rule.next_delay(exc, trio.current_time())
            log.debug(
                "%s: %s (attempt %d, retrying in %.2fs)", what, exc.reason, rule.attempts, delay
            )
        await trio.sleep(delay)


async def ride_out_refusals(
    fn: Callable[[], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff = REFUSAL_BACKOFF,
    report_every: float = REPORT_EVERY,
) -> T:
    """Await ``fn()``, trying again for as long as Redis refuses it (:class:`ServerRefused`).

    Logs one warning when Redis first refuses (what, why and what to do), a reminder
    every ``report_every`` seconds while it keeps refusing, and one line when ``fn``
    finally succeeds. Errors that say Redis cannot be reached are left to the caller's
    own retry policy.

    Error handling:
        Every error other than :class:`ServerRefused` propagates at once.
    """
    delays = backoff.delays()
    first: float | None = None
    reported = 0.0
    refusals = 0
    while True:
        try:
            result = await fn()
        except ServerRefused as exc:
            now = trio.current_time()
            refusals += 1
            if first is None:
                first = reported = now
                log.warning("%s: %s; waiting, and trying again until it is accepted", what, exc)
            elif now - reported >= report_every:
                reported = now
                log.warning(
                    "%s: still refused after %.0fs (%d attempts): %s",
                    what, now - first, refusals, exc.reason,
                )  # fmt: skip
            await trio.sleep(next(delays))
            continue
        if first is not None:
            log.warning(
                "%s: accepted after %.1fs of refusals (%d attempts)",
                what, trio.current_time() - first, refusals,
            )  # fmt: skip
        return result
