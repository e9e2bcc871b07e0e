"""Claimed jobs on their way from the claimers to the try runners, with as few task
switches as the jobs allow.

A claim's jobs arrive together. Handing each to a runner of its own costs a task switch
per job, most of a short job's cost. Instead, one idle runner is woken for the batch; a
runner that ends a try takes the next waiting job at once; and the moment a runner
starts a try while other jobs wait, the dispatcher is made runnable. It runs when the
running tasks let it, that is as soon as the try awaits anything, and wakes one idle
runner per job still waiting. Jobs that never await (no-op, CPU-bound ``async def``)
run back to back in one runner, at most :data:`STREAK` before it lets other tasks run;
jobs that await start on runners of their own a scheduling round later.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import attrs
import trio

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["STREAK", "Claimed", "Handoff", "Taker"]

#: A claimed job, as the claim script returns it, with its shard:
#: ``(shard, [id, name, args, tries, token, priority, enqueued_ms, headers])``.
Claimed = tuple[int, list[Any]]

#: Tries a runner starts back to back, without letting other tasks run, at most.
STREAK = 32


@attrs.define(eq=False)
class Handoff:
    """The claimed jobs no runner has taken yet, and the runners waiting for one."""

    _waiting: deque[Claimed] = attrs.field(init=False, factory=deque)
    _idle: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    _dispatcher: trio.lowlevel.ParkingLot = attrs.field(
        init=False, factory=trio.lowlevel.ParkingLot
    )

    def put(self, jobs: Iterable[Claimed]) -> None:
        """Hand over claimed jobs (one idle runner is woken for them)."""
        self._waiting.extend(jobs)
        if self._waiting:
            self._idle.unpark()

    def __len__(self) -> int:
        """Jobs no runner has taken yet."""
        return len(self._waiting)

    def take_nowait(self) -> Claimed | None:
        """The next waiting job, at once, or ``None``."""
        if not self._waiting:
            return None
        claimed = self._waiting.popleft()
        if self._waiting:
            # Runs once this runner lets other tasks run: its try awaits, or it ends.
            self._dispatcher.unpark()
        return claimed

    async def take(self) -> Claimed:
        """The next waiting job, waiting for one if there is none (a checkpoint)."""
        await trio.lowlevel.checkpoint()
        while not self._waiting:
            await self._idle.park()
        claimed = self.take_nowait()
        assert claimed is not None
        return claimed

    def taker(self) -> Taker:
        """What one runner takes its jobs through."""
        return Taker(self)

    async def dispatch(self) -> None:
        """Wake an idle runner for each job still waiting whenever a runner started a
        try with others waiting; until cancelled."""
        while True:
            await self._dispatcher.park()
            if self._waiting:
                self._idle.unpark(count=len(self._waiting))


@attrs.define(eq=False)
class Taker:
    """One runner's way to its next job: at once after a try, at most :data:`STREAK`
    times in a row, then through a checkpoint."""

    handoff: Handoff
    _streak: int = attrs.field(init=False, default=0)

    async def next(self) -> Claimed:
        """The next job for this runner.

        Cancellation:
            A cancellation (of the try's lane, or of the worker) is raised here before
            any job is taken: taking a waiting job at once is no checkpoint.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._streak < STREAK:
            claimed = self.handoff.take_nowait()
            if claimed is not None:
                self._streak += 1
                return claimed
        claimed = await self.handoff.take()
        self._streak = 1
        return claimed
