"""Exponential backoff: a pure schedule of delays, and a retry loop built on it."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, TypeVar

import attrs
import trio

from ._errors import RedisUnavailable, ServerRefused
from ._validate import fraction, positive_number

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from ._outage import OutageLog

__all__ = ["Backoff", "jitter_draw", "retry_unavailable"]

T = TypeVar("T")

DEFAULT_INITIAL = 0.05
DEFAULT_MAXIMUM = 2.0
DEFAULT_FACTOR = 2.0
DEFAULT_JITTER = 0.2

# streamkit's own generator: its jitter never advances (or depends on) the state of the
# global ``random`` module, which belongs to the application (seeded for reproducible
# runs, or checked by hypothesis while a worker runs in another thread).
jitter_draw = random.Random().random


@attrs.frozen(kw_only=True)
class Backoff:
    """Exponentially growing delays between retries, capped at ``maximum``.

    ``jitter`` spreads each delay uniformly over ``[d * (1 - jitter), d]`` so that many
    clients that failed together do not retry in lockstep. ``jitter=0`` gives exact,
    testable delays.
    """

    initial: float = attrs.field(default=DEFAULT_INITIAL, validator=positive_number)
    maximum: float = attrs.field(default=DEFAULT_MAXIMUM, validator=positive_number)
    factor: float = attrs.field(default=DEFAULT_FACTOR, validator=positive_number)
    jitter: float = attrs.field(default=DEFAULT_JITTER, validator=fraction)

    def delays(self) -> Iterator[float]:
        """Yield the delay before each successive retry, forever."""
        delay = self.initial
        while True:
            yield delay * (1 - self.jitter * jitter_draw())
            delay = min(delay * self.factor, self.maximum)


async def retry_unavailable(
    fn: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    give_up_after: float | None,
    what: str,
    outage: OutageLog,
) -> T:
    """Call ``fn`` until it does not raise :class:`RedisUnavailable`.

    Failures go to ``outage``, the log of the client's outages: one warning at the
    first (the reason, when it retries and for how long), a summary every 30
    seconds, further attempts at debug level, and one line when it succeeds after
    failures: an operator sees why nothing happens yet without a line per attempt.

    Error handling:
        Once ``give_up_after`` seconds have passed since the first attempt (never, if
        ``None``), a :class:`RedisUnavailable` with the last reason and how many
        attempts were made over how long.
    """
    started = trio.current_time()
    deadline = None if give_up_after is None else started + give_up_after
    for attempt, delay in enumerate(backoff.delays(), start=1):
        sent = trio.current_time()
        try:
            result = await fn()
        except RedisUnavailable as exc:
            now = trio.current_time()
            if deadline is not None and now >= deadline:
                if attempt == 1:
                    raise
                raise RedisUnavailable(
                    exc.url,
                    f"{exc.reason} (gave up after {attempt} attempts in {now - started:.1f}s)",
                ) from exc
            if deadline is not None:
                # The last attempt is made at the deadline, not a backoff step before
                # it: giving up takes the time the user configured.
                delay = min(delay, deadline - now)
            limit = "" if give_up_after is None else f" for up to {give_up_after:g}s"
            outage.failed(
                exc.reason,
                what=f"{what}, attempt {attempt}",
                refused=isinstance(exc, ServerRefused),
                retrying=f" in {delay:.2f}s and on{limit}",
            )
            await trio.sleep(delay)
        else:
            outage.answered(sent)
            return result
    raise AssertionError("unreachable")  # pragma: no cover
