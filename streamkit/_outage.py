"""An outage in the log: said once, summed up at a steady interval, its end in one line.

Every part of a worker that talks to Redis (each partition's lease, the fetcher, the
membership heartbeat, the job worker, the connection pools) notices an outage on its
own, many times a second. :class:`OutageLog` turns all of that into what an operator
reads: one warning when Redis is lost, a summary every :data:`SUMMARY_EVERY` seconds
while it stays lost (how long, the last reason, what waits), and one line when it is
back, saying how long it was gone. Each failure it absorbs is logged at debug level.

One :class:`OutageLog` speaks for a whole client (see ``streamkit._redis._health``):
its parts report to it (:meth:`OutageLog.failed`, :meth:`OutageLog.answered`) rather
than log an unreachable Redis themselves. It absorbs only "Redis cannot be reached"
(or refuses commands for a passing reason): every other error is logged by the part
that met it, as before, so a real error is never buried in an outage.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING

import attrs
import trio

from ._logs import without_context

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["SUMMARY_EVERY", "OutageLog", "duration"]

#: Seconds between two summaries of an outage that goes on (and between two
#: reminders of a refusal, see ``ride_out_refusals``).
SUMMARY_EVERY = 30.0

log = logging.getLogger("streamkit.redis")


def duration(seconds: float) -> str:
    """``seconds`` for a log line: ``0.02s``, ``4.5s``, ``31s``, ``2 min 05s``."""
    if seconds < 1:
        return f"{seconds:.2f}s"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d}s"


@attrs.define(eq=False)
class _Outage:
    started: float
    reason: str
    refused: bool
    announced: bool
    next_summary: float
    failures: int = 1


@attrs.define(eq=False)
class OutageLog:
    """The log of one Redis's outages, for everything that uses it.

    Attributes:
        subject: what is unreachable, as the log names it (``Redis at redis://...``).
        summary_every: seconds between two summaries of an outage that goes on.
        announce_gap: an outage that starts less than this many seconds after the
            last one was announced is announced by its first summary only (if it
            lasts that long), and counted in the next announcement: a flapping
            network does not flood the log.
    """

    subject: str
    summary_every: float = SUMMARY_EVERY
    announce_gap: float = 0.0
    _outage: _Outage | None = attrs.field(init=False, default=None)
    _announced_at: float = attrs.field(init=False, default=-math.inf)
    _unannounced: int = attrs.field(init=False, default=0)
    _waiting: list[Callable[[], tuple[int, str] | None]] = attrs.field(init=False, factory=list)

    @property
    def down(self) -> bool:
        """Whether an outage is under way (a failure, and no answer since)."""
        return self._outage is not None

    @property
    def started(self) -> float | None:
        """When the outage under way began (``trio.current_time()``), or ``None``."""
        return None if self._outage is None else self._outage.started

    def failed(
        self, reason: str, *, what: str = "", refused: bool = False, retrying: str = ""
    ) -> None:
        """A Redis command (or connection) failed because Redis cannot be reached.

        The first failure of an outage is logged as a warning (with ``retrying``
        appended to its "retrying", ``" in 0.05s"`` say); the next ones at debug
        level (with ``what`` was being done), except the first after each
        :attr:`summary_every` seconds of the outage: that one logs the summary.

        Args:
            reason: why, in words (a :class:`~streamkit.RedisUnavailable`'s ``reason``).
            what: what was being done, for the debug line.
            refused: Redis answered, refusing the command for a passing reason (out of
                memory, loading, ...), rather than not answering.
            retrying: appended to the first warning's "retrying".
        """
        now = trio.current_time()
        outage = self._outage
        state = "refusing commands" if refused else "unreachable"
        if outage is None:
            announce = now - self._announced_at >= self.announce_gap
            self._outage = _Outage(
                started=now,
                reason=reason,
                refused=refused,
                announced=announce,
                next_summary=now + self.summary_every,
            )
            if not announce:
                log.debug("%s %s: %s (%s)", self.subject, state, reason, what or "a command")
                return
            more = (
                f" ({self._unannounced} brief outage(s) since the last report)"
                if self._unannounced
                else ""
            )
            self._announced_at = now
            self._unannounced = 0
            with without_context():
                log.warning(
                    "%s %s: %s%s; retrying%s, with a summary every %s",
                    self.subject, state, reason, more, retrying, duration(self.summary_every),
                )  # fmt: skip
            return
        outage.failures += 1
        outage.reason = reason
        outage.refused = refused
        if now < outage.next_summary:
            log.debug("%s %s: %s (%s)", self.subject, state, reason, what or "a command")
            return
        # Due at started + k * summary_every: a steady interval, however the
        # failures that carry the summaries fall.
        periods = math.floor((now - outage.started) / self.summary_every) + 1
        outage.next_summary = outage.started + periods * self.summary_every
        outage.announced = True
        self._announced_at = now
        with without_context():
            log.warning(
                "%s %s for %s (%s)%s; retrying",
                self.subject, state, duration(now - outage.started), reason, self._what_waits(),
            )  # fmt: skip

    def answered(self, since: float | None = None) -> None:
        """Redis answered a command sent at ``since`` (``trio.current_time()``; ``None``:
        whenever): the outage, if one is under way and began before the command was
        sent, is over. Its end is logged in one line if its start was."""
        outage = self._outage
        if outage is None or (since is not None and since < outage.started):
            return
        self._outage = None
        lasted = duration(trio.current_time() - outage.started)
        if outage.announced:
            with without_context():
                log.warning("%s back after %s", self.subject, lasted)
        else:
            # Too brief to be said: counted in the next announcement.
            self._unannounced += 1
            log.debug(
                "%s back after %s (%d failed attempts)", self.subject, lasted, outage.failures
            )

    @contextlib.contextmanager
    def waiting(self, describe: Callable[[], tuple[int, str] | None]) -> Iterator[None]:
        """While the block runs, summaries name what ``describe()`` says waits: a
        count and a noun, ``(8, "partition")`` for "8 partitions waiting" (counts of
        the same noun are added up), or ``None``."""
        self._waiting.append(describe)
        try:
            yield
        finally:
            self._waiting.remove(describe)

    def _what_waits(self) -> str:
        counts: dict[str, int] = {}
        for describe in self._waiting:
            described = describe()
            if described is not None and described[0] > 0:
                count, noun = described
                counts[noun] = counts.get(noun, 0) + count
        if not counts:
            return ""
        waiting = ", ".join(f"{n} {noun}{'s' if n != 1 else ''}" for noun, n in counts.items())
        return f"; {waiting} waiting"
