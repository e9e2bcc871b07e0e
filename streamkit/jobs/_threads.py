"""The threads of a worker's plain ``def`` jobs: one reserved for each such job as it
is claimed, so that a worker claims no more of them than it can start at once.

A claimed job is marked executing (its try counts, its timeout runs, a worker lost
with it spends that try). Were ``def`` jobs claimed beyond the worker's free threads,
the rest would wait for a thread here, executing, while other workers sat idle. So a
worker that serves ``def`` jobs claims at most as many jobs at a time as it has free
threads, each claim's threads taken before it is sent (the claim loops of several
shards share them), and hands each ``def`` job its thread: its try starts at once.
A thread abandoned by a try that timed out stays taken until its function returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from collections.abc import Iterable

    import trio

__all__ = ["Reserved", "Threads"]


@attrs.define(eq=False)
class Reserved:
    """A thread taken for one claimed job: what ``trio.to_thread.run_sync`` is given
    as its limiter (acquiring it takes nothing more; releasing it gives the thread
    back), or given back unused by :meth:`release_unused`."""

    limiter: trio.CapacityLimiter
    handed: bool = False
    released: bool = False

    async def acquire_on_behalf_of(self, _borrower: object) -> None:
        # Taken at the claim already: the thread starts now.
        self.handed = True

    def release_on_behalf_of(self, _borrower: object) -> None:
        self._release()

    def release_unused(self) -> None:
        """Give the thread back if no thread ran for it (the try ended before)."""
        if not self.handed:
            self._release()

    def _release(self) -> None:
        if not self.released:
            self.released = True
            self.limiter.release_on_behalf_of(self)


@attrs.define(eq=False)
class Threads:
    """A worker's threads for ``def`` jobs, and which job names run in them.

    Attributes:
        limiter: the threads (``threads`` of :meth:`JobQueue.serve`).
        names: the names of the worker's plain ``def`` jobs, as claims return them.
    """

    limiter: trio.CapacityLimiter
    names: frozenset[bytes]
    # By (job id, token) as claimed: the thread taken for it, until its runner takes it.
    _reserved: dict[tuple[bytes, bytes], Reserved] = attrs.field(init=False, factory=dict)

    @property
    def counted(self) -> bool:
        """Whether claims are bounded by the free threads (the worker runs ``def``
        jobs)."""
        return bool(self.names)

    async def wait_free(self) -> None:
        """Wait until a thread is free (at once if the worker runs no ``def`` job)."""
        if self.counted and self.limiter.available_tokens < 1:
            async with self.limiter:
                pass

    def take(self, want: int) -> list[Reserved]:
        """Take up to ``want`` free threads for a claim (all ``want`` if the worker runs
        no ``def`` job: nothing to take then)."""
        if not self.counted:
            return []
        taken = []
        for _ in range(min(want, int(self.limiter.available_tokens))):
            reserved = Reserved(self.limiter)
            self.limiter.acquire_on_behalf_of_nowait(reserved)
            taken.append(reserved)
        return taken

    def assign(self, taken: list[Reserved], claimed: Iterable[list[Any]]) -> None:
        """Give each ``def`` job of a claim's reply one of the threads ``taken`` for the
        claim; give the rest back."""
        spare = iter(taken)
        for job in claimed:
            name = job[1] if isinstance(job[1], bytes) else str(job[1]).encode()
            if name in self.names:
                self._reserved[_key(job)] = next(spare)
        for reserved in spare:
            reserved.release_unused()

    def reserved_for(self, claimed: list[Any]) -> Reserved | None:
        """The thread taken for a claimed job, handed to its runner (``None`` for an
        ``async def`` job)."""
        if not self._reserved:
            return None
        return self._reserved.pop(_key(claimed), None)


def _key(job: list[Any]) -> tuple[bytes, bytes]:
    return (
        job[0] if isinstance(job[0], bytes) else str(job[0]).encode(),
        job[4] if isinstance(job[4], bytes) else str(job[4]).encode(),
    )
