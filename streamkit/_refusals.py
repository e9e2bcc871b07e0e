"""Riding out Redis's passing refusals (out of memory, loading, a replica, ...).

A :class:`~streamkit.ServerRefused` command did not run and may succeed later: for the
steps a worker cannot do without (recording a stream's metadata, joining a membership
group), waiting is better than exiting, since nothing else would drain a full Redis.
Errors that say Redis cannot be reached are left to the caller's own retry policy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

import trio

from ._backoff import Backoff
from ._errors import ServerRefused

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["REFUSAL_BACKOFF", "REPORT_EVERY", "ride_out_refusals"]

T = TypeVar("T")

#: Delays between attempts while Redis refuses.
REFUSAL_BACKOFF = Backoff(initial=0.05, maximum=1.0)
#: Seconds between two warnings about the same refusal.
REPORT_EVERY = 30.0

log = logging.getLogger("streamkit.redis")


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
    finally succeeds.

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
