"""The tries a job worker holds: each running try by job id, and the worker's free slots.

Claiming takes slots, a try's end gives its slot back; the renewer cancels tries that
were aborted or taken over; finishing forgets a try once its outcome is recorded.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import orjson
import trio
from trio_util import AsyncValue

from .._errors import ConfigError
from ._emit import MAX_EMITS, Emission, emission

if TYPE_CHECKING:
    from .._spec import HasSpec, StreamSpec
    from ._handle import Job
    from ._threads import Reserved

__all__ = ["Lane", "Reporter", "Tries", "Try"]


class Reporter(Protocol):
    """What a try reports its progress or streamed chunks to (the worker's writers,
    :mod:`~streamkit.jobs._progress` and :mod:`~streamkit.jobs._streaming`)."""

    def report(self, current: Try, value: Any) -> None: ...


@attrs.define(eq=False)
class Try:
    """One running try of a job.

    Attributes:
        id: the job's id.
        shard: the queue shard the job lives on.
        token: the claim's token (``consumer:try``): what fences its outcome.
        job: the declared job it runs, ``None`` for a name this worker does not know.
        try_number: which try of the job it is (1 for the first).
        lane: the lane its function runs in, once it runs.
        cancelled: why it was cancelled (aborted, taken over, stopped), if it was.
        abort_reason: set when the job was aborted while this try ran.
        taken_over: set when another worker took the job over.
        stopping: set when the worker stopping gracefully cancelled it (it goes back
            to the queue).
        finished: set once its outcome is decided (it may not be recorded yet).
        started: ``time.perf_counter()`` when it started, for its duration.
        emitted: the records it emitted, written if it succeeds.
        progress: the newest progress it reported (JSON), if any.
        progress_writer: what writes its progress (the worker's).
        chunks: the chunks it streamed not written yet (JSON), in order.
        chunks_written: how many it streamed were written.
        chunk_writer: what writes its chunks (the worker's).
        thread: the thread taken for it at its claim, for a plain ``def`` job.
    """

    id: str
    shard: int
    token: str
    job: Job[Any, Any] | None
    try_number: int = 0
    lane: Lane | None = None
    cancelled: str | None = None
    abort_reason: str | None = None
    taken_over: bool = False
    stopping: bool = False
    finished: bool = False
    started: float = attrs.field(factory=time.perf_counter)
    emitted: list[Emission] | None = None
    progress: bytes | None = None
    progress_writer: Reporter | None = None
    chunks: list[bytes] = attrs.field(factory=list)
    chunks_written: int = 0
    chunk_writer: Reporter | None = None
    thread: Reserved | None = None

    def emit(self, stream: StreamSpec[Any] | HasSpec[Any], record: Any) -> None:
        """Keep ``record`` for ``stream``, to be written with the try's success."""
        encoded = emission(stream, record)
        if self.emitted is None:
            self.emitted = []
        elif len(self.emitted) >= MAX_EMITS:
            raise ConfigError("emit", f"a try emits at most {MAX_EMITS:,} records")
        self.emitted.append(encoded)

    def take_over(self) -> None:
        """Another worker runs the job now: cancel this try, recording nothing."""
        self.taken_over = True
        self._cancel(f"job {self.id} taken over by another worker")

    def stop(self) -> None:
        """Its grace ran out at a graceful stop: cancel this try, which goes back to the
        queue without spending a try."""
        self.stopping = True
        self._cancel(f"job {self.id}: its grace period ran out at a stop")

    def abort(self, reason: str) -> None:
        """The job was aborted: cancel this try, which ends ``aborted``."""
        self.abort_reason = reason
        self._cancel(f"job aborted: {reason}")

    def _cancel(self, reason: str) -> None:
        # Before it runs, it is cancelled as it starts (Lane.begin); after, not at all.
        if self.cancelled is None:
            self.cancelled = reason
            if self.lane is not None:
                self.lane.cancel(self, reason)


@attrs.define(eq=False)
class Lane:
    """Where a try runner runs its tries, one at a time: a cancel scope they share until
    one of them is cancelled (aborted, taken over, stopped, timed out), after which
    the runner opens a new lane.

    A cancel scope of its own per try would be simpler, but entering and leaving one
    cost a sixth of a no-op job's CPU. A lane cancels its scope only for the try it
    runs at that moment: a cancellation that comes before the try starts takes effect
    as it starts, one that comes after it ended does nothing.

    Attributes:
        scope: the cancel scope, entered by the runner around its tries.
        current: the try running now, if any.
        interrupted: the try that was running when the scope was cancelled.
    """

    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    current: Try | None = None
    interrupted: Try | None = None

    def begin(self, current: Try, timeout: float | None) -> None:
        """``current`` starts, with at most ``timeout`` seconds to run."""
        self.current = current
        current.lane = self
        if timeout is not None:
            self.scope.deadline = trio.current_time() + timeout
        if current.cancelled is not None:
            self.scope.cancel(current.cancelled)

    def end(self) -> None:
        """The try running ended."""
        self.current = None
        if self.scope.deadline != math.inf:
            self.scope.deadline = math.inf

    def cancel(self, current: Try, reason: str) -> None:
        """Cancel ``current`` if it runs here now."""
        if self.current is current:
            self.scope.cancel(reason)


@attrs.define(eq=False)
class Tries:
    """The tries a worker holds: claimed and not over, at most ``concurrency``.

    Attributes:
        concurrency: jobs the worker runs at once.
        running: the tries started and not recorded yet, by job id.
        free: slots for jobs not taken: ``concurrency`` minus the jobs claimed and
            not over (a claimed job takes its slot before its try starts).
    """

    concurrency: int
    running: dict[str, Try] = attrs.field(factory=dict)
    free: AsyncValue[int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.free = AsyncValue(self.concurrency)

    @property
    def held(self) -> int:
        """Jobs claimed and not over."""
        return self.concurrency - int(self.free.value)

    def take_slots(self, jobs: int) -> None:
        """``jobs`` were claimed (at once: one change of :attr:`free` for them all);
        each holds a slot until its try ends."""
        if jobs:
            self.free.value -= jobs

    def give_slot(self) -> None:
        """A try ended: its slot is free again."""
        self.free.value += 1

    async def wait_free(self) -> None:
        """Wait until a slot is free."""
        if self.free.value <= 0:
            # Woken the moment after tries end: the slots of all that ended together
            # are free by then, and the claim goes out before their outcomes are
            # recorded (see Outbox.finisher), so Redis runs it first.
            await self.free.wait_value(lambda free: free > 0)

    async def wait_all_free(self) -> None:
        """Wait until every claimed job's try has ended."""
        await self.free.wait_value(self.concurrency)

    def start(self, current: Try) -> None:
        """Hold ``current``; a try of the same job still held here was taken over
        (unnoticed yet) and is cancelled: the job is this try's now."""
        stale = self.running.get(current.id)
        if stale is not None and not stale.finished:
            stale.take_over()
        self.running[current.id] = current

    def forget(self, job_id: str, token: str) -> None:
        """Drop the try of ``job_id`` with ``token`` (not a newer try of the same job
        that this worker claimed again meanwhile)."""
        current = self.running.get(job_id)
        if current is not None and current.token == token:
            del self.running[job_id]

    def on_shard(self, shard: int) -> list[Try]:
        """The tries of jobs on ``shard``."""
        return [t for t in self.running.values() if t.shard == shard]

    def tokens(self, shard: int) -> bytes:
        """The tries held on ``shard``, as JSON: job id -> token."""
        return orjson.dumps({t.id: t.token for t in self.on_shard(shard)})
