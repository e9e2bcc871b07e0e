"""When a failed Redis call is tried again: one rule, pure, for the Trio layer and the clients.

The Trio layer (:mod:`streamkit._redis._retries`, the producer's idempotent append) and
the blocking and asyncio clients (:mod:`streamkit.clients`) wait and send in their own
ways, but decide by this one rule whether and when a call that failed goes again, so
that none of them ever sends a call again blindly:

* a call whose connection was lost with it in flight (:class:`~streamkit.OutcomeUnknown`)
  is sent again only if running it twice is harmless (``idempotent``: reads, scripts
  that check before they write, appends carrying their idempotency marker);
* a call that surely never reached Redis is sent again while the time allows;
* Redis refusing an append for memory (``OOM``) is said at once (``fail_fast_oom``):
  nothing was appended, and waiting seconds for memory would only keep the caller
  waiting.

The rule holds no clock and does no I/O: the caller gives it the time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ._backoff import Backoff
from ._errors import OutcomeUnknown, RedisUnavailable, ServerRefused

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["DEFAULT_RETRY_FOR", "RETRY_BACKOFF", "RetryRule"]

#: How long a call (and the producer's idempotent append) is retried, by default.
DEFAULT_RETRY_FOR = 5.0
#: Command-level retries start fast: a lost connection is usually replaced at once.
RETRY_BACKOFF = Backoff(initial=0.02, maximum=0.5)


@attrs.define(eq=False)
class RetryRule:
    """Decides, failure by failure, whether a call is tried again, and after how long.

    Make one per call (``started`` is when its first attempt began) and hand it each
    failure with :meth:`next_delay`.

    Attributes:
        what: what the call does, for the error raised on giving up after an unknown
            outcome (``"appending to __strm:{shop.orders.3}"``).
        idempotent: whether running the call twice is harmless.
        started: when the first attempt began, on the caller's clock.
        give_up_after: seconds after ``started`` beyond which no attempt starts.
        backoff: the delays between attempts.
        fail_fast_oom: raise Redis's out-of-memory refusal at once instead of retrying.
        unknown_is_final: on giving up, if any attempt's outcome was unknown, raise
            :class:`~streamkit.OutcomeUnknown` saying that it was retried without
            learning whether it was applied (else the last error).
    """

    what: str
    idempotent: bool
    started: float
    give_up_after: float = DEFAULT_RETRY_FOR
    backoff: Backoff = RETRY_BACKOFF
    fail_fast_oom: bool = False
    unknown_is_final: bool = False
    attempts: int = attrs.field(default=0, init=False)
    _delays: Iterator[float] | None = attrs.field(default=None, init=False, repr=False)
    _unknown: OutcomeUnknown | None = attrs.field(default=None, init=False, repr=False)

    def next_delay(self, error: RedisUnavailable, now: float) -> float:
        """The seconds to wait before trying again after ``error``, at time ``now``.

        Error handling:
            Raises ``error`` (or the :class:`~streamkit.OutcomeUnknown` described by
            ``unknown_is_final``) when the call is not to be tried again.
        """
        self.attempts += 1
        if isinstance(error, OutcomeUnknown):
            if not self.idempotent:
                raise error
            self._unknown = error
        if self.fail_fast_oom and isinstance(error, ServerRefused) and error.out_of_memory:
            # The script looks for its marker before it appends, and Redis refuses for
            # memory only at the append: no attempt was applied. Nothing appended.
            raise error
        if self._delays is None:
            self._delays = self.backoff.delays()
        delay = next(self._delays)
        if now + delay > self.started + self.give_up_after:
            if self.unknown_is_final and self._unknown is not None:
                raise OutcomeUnknown(
                    error.url,
                    f"{self.what}: {self._unknown.reason}; retried for "
                    f"{self.give_up_after:g}s without learning whether it was applied",
                ) from error
            raise error
        return delay
