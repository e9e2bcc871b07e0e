"""How far each side of a stream-stream join has come: its partition's watermark.

A join's two sides reach it through their forwarders, each at its own pace: one may be
down (its worker killed, its partitions not yet moved), restarting or slow while the
other goes on. If the newest event of either side moved the watermark, the events of
the side behind would find their windows closed when they came (late, or unmatched),
and the result would depend on the fault. So the watermark of a join's partition is
the newest event time *both* sides have reached, the lesser of each side's newest: a
side behind holds the windows open until its events come.

A join that follows the idle rule (``idle=True``, event times that keep up with the
clock) does not let a side that is quiet rather than behind hold them for ever. When a
side holds back a buffer that the other side's newest event would close (asked at most
every :data:`CHECK_INTERVAL` seconds), or when the partition is idle and a buffer is due
by the idle rule, Redis is asked whether that side's forwarder has processed every
entry of its partition (``streams/caught_up``). If it has, the join writes a
*heartbeat* of that side to its inner stream, with its commit: "this side has reached
time T", T being the other side's newest event time (or, idle, the watermark the idle
rule gives, but never beyond the server's clock when the side was found caught up).
The heartbeat is read back in order like the events, and moves the side on as an event
of that time would, matching nothing. Every event the side had forwarded before the
question is before the heartbeat in the inner stream, so nothing of it is overtaken;
and since what moves the watermark is all in the inner stream, a replay of the join
computes the same watermarks, and the same results, as the first run.

Without the idle rule (``idle=False``: times of their own, a backfill say), nothing but
a side's events moves it on, so the results depend on the events alone, not on when
each side's producer sent them: a quiet side holds the other's windows open until its
events come, and once it has for ``warn_after`` the join's worker says so.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import trio

from ._lua import script
from ._redis import LuaScript, redis_errors

if TYPE_CHECKING:
    from ._redis import Redis

__all__ = ["CHECK_INTERVAL", "HEARTBEAT", "Sides", "Source", "heartbeat", "read_heartbeat"]

log = logging.getLogger("streamkit.state")

#: Seconds between two questions to Redis of a partition a side holds back.
CHECK_INTERVAL = 0.5

#: The field of a heartbeat entry of a join's inner stream; its value is the side and
#: the time (ms): ``L 1767225600000``.
HEARTBEAT = b"W"

_CAUGHT_UP = LuaScript(script("streams/caught_up"))

#: A stream partition's key and the group that reads it.
Source = tuple[str, str]

_SIDES = (b"L", b"R")


def heartbeat(side: int, at: int) -> bytes:
    """The value of a heartbeat of ``side`` (0: left, 1: right) at time ``at`` (ms)."""
    return b"%s %d" % (_SIDES[side], at)


def read_heartbeat(value: bytes) -> tuple[int, int]:
    """The side (0, 1) and time (ms) of a heartbeat's value (``ValueError`` if it is
    not one)."""
    side, _, at = value.partition(b" ")
    if side not in _SIDES or not at.isdigit():
        raise ValueError(f"not a join heartbeat: {value[:40]!r}")
    return _SIDES.index(side), int(at)


class Sides:
    """What one partition of a join knows of its two sides (see the module docs).

    Args:
        left, right: each side's partition and its forwarder's group.
        redis: the client.
        partition: the join's partition (for what a warning says).
        warn_after: seconds a side may hold the partition back, not caught up and not
            moving on, before a warning says so (and, once it comes, that it did).

    Attributes:
        seen: the newest time (ms) of each side (left, right), of its events and
            heartbeats processed here.
        next_check: the Trio time before which Redis is not asked again.
    """

    __slots__ = (
        "_done",
        "_partition",
        "_redis",
        "_sources",
        "_stalled",
        "_warn_after",
        "_written",
        "next_check",
        "seen",
    )

    def __init__(
        self,
        left: Source,
        right: Source,
        redis: Redis,
        *,
        partition: int = 0,
        warn_after: float = 30.0,
    ) -> None:
        self._sources = (left, right)
        self._partition = partition
        self._redis = redis
        self._warn_after = warn_after
        # Per side found behind: (since when, at what time it stood, warned yet).
        self._stalled: list[tuple[float, float, bool] | None] = [None, None]
        self.seen = [-math.inf, -math.inf]
        self.next_check = -math.inf
        # What promote() last kept: discard() goes back to it.
        self._done = (-math.inf, -math.inf)
        # What the state hash holds (see stored()).
        self._written = self._done

    def limit(self) -> float:
        """The newest time both sides have reached."""
        return min(self.seen)

    def promote(self) -> None:
        """The events in flight were processed."""
        self._done = (self.seen[0], self.seen[1])

    def discard(self) -> None:
        """The events in flight failed: what they showed of the sides is forgotten."""
        self.seen[0], self.seen[1] = self._done

    def load(self, raw: bytes | str | None) -> None:
        """Start from what :meth:`stored` gave, as the state hash holds it."""
        if raw is None:
            return
        text = raw.decode() if isinstance(raw, bytes) else raw
        left, right = (-math.inf if n == "-" else int(n) for n in text.split())
        self.seen[0], self.seen[1] = left, right
        self._done = self._written = (left, right)

    def stored(self) -> str | None:
        """How far each side has come (done), as the state hash keeps it for the next
        worker of the partition (``"1767225600000 -"``: the left side's time, the right
        side's none yet); ``None`` if the hash has that already."""
        if self._done == self._written:
            return None
        self._written = self._done
        return " ".join("-" if n == -math.inf else str(int(n)) for n in self._done)

    def due(self) -> bool:
        """Whether Redis may be asked again."""
        return trio.current_time() >= self.next_check

    def warned(self) -> bool:
        """Whether a side holding the partition back has been said."""
        return any(stalled is not None and stalled[2] for stalled in self._stalled)

    async def caught_up(self, below: float, *, moves: bool = True) -> list[tuple[int, int]]:
        """Of the sides that have not reached ``below``, those whose forwarder has
        processed every entry of its partition, each with the server's clock (ms) when
        it had. With ``moves`` false (no heartbeat will move them on), a side found so
        is only watched, said once it has held the partition for ``warn_after``.

        Error handling:
            :class:`~streamkit.RedisUnavailable` and the like, as any state read.
        """
        self.next_check = trio.current_time() + CHECK_INTERVAL
        found: list[tuple[int, int]] = []
        with redis_errors():
            for side in (0, 1):
                if self.seen[side] >= below:
                    continue  # not holding it back
                key, group = self._sources[side]
                reply: Any = await _CAUGHT_UP(self._redis, keys=[key], args=[group])
                if int(reply[0]) and moves:
                    found.append((side, int(reply[1])))
                    self._moving(side)
                else:
                    self._held(side, quiet=bool(int(reply[0])))
        return found

    async def idle_heartbeats(self, target: int) -> list[bytes]:
        """The heartbeats that move an idle partition's sides on to ``target`` (the
        idle rule's watermark): one for each side behind it, if every side behind it
        has nothing left to forward (one alone moves nothing), each at most the
        server's clock then (the side may get an event of now yet); none if Redis was
        asked too recently."""
        if self.limit() >= target or not self.due():
            return []
        found = await self.caught_up(target)
        if len(found) < sum(1 for seen in self.seen if seen < target):
            return []
        return [heartbeat(side, min(target, now)) for side, now in found]

    def _held(self, side: int, *, quiet: bool) -> None:
        """``side`` holds the partition back: its forwarder has entries it has not
        processed, or (``quiet``) none, with no heartbeat to move it on. If it has not
        moved on for ``warn_after``, say so once."""
        now, seen = trio.current_time(), self.seen[side]
        stalled = self._stalled[side]
        if stalled is None or stalled[1] != seen:
            self._moving(side)
            self._stalled[side] = (now, seen, False)
        elif not stalled[2] and now - stalled[0] >= self._warn_after:
            self._stalled[side] = (stalled[0], seen, True)
            if quiet:
                log.warning(
                    "%s holds the join's windows open: it has had no event for %.0fs, and "
                    "without the idle rule (idle=False) only its events move it on; the "
                    "other side's events stay buffered until they come",
                    self._where(side),
                    now - stalled[0],
                )
                return
            log.warning(
                "%s holds the join's windows open: its forwarder %s has forwarded nothing "
                "for %.0fs while it has events to; the results wait for them, and the "
                "other side's events stay buffered (is a worker running %s?)",
                self._where(side),
                self._forwarder(side),
                now - stalled[0],
                self._forwarder(side),
            )

    def _forwarder(self, side: int) -> str:
        return self._sources[side][1].rpartition(".")[2]

    def _where(self, side: int) -> str:
        """``join pay, partition 3: the payments side``, from the forwarder's group
        (``app.stream.processor``)."""
        _, stream, forwarder = self._sources[side][1].split(".", 2)
        join = forwarder.rpartition("__")[0]
        return f"join {join}, partition {self._partition}: the {stream} side"

    def _moving(self, side: int) -> None:
        """``side`` caught up, or moved on."""
        stalled = self._stalled[side]
        self._stalled[side] = None
        if stalled is not None and stalled[2]:
            log.info("%s moves on again: the windows it held close as they come", self._where(side))
