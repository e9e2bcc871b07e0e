"""A job worker's graceful stop: drain (claim no more, wait for the running tries and
their outcomes), then put back what still runs, without spending a try."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import trio

from ._claim import hand_back

if TYPE_CHECKING:
    from ._claim import Claimer
    from ._finish import Outbox
    from ._handle import QueueLike
    from ._tries import Tries

__all__ = ["drain", "put_back"]

log = logging.getLogger("streamkit.jobs")


async def drain(claimer: Claimer, tries: Tries, outbox: Outbox, grace: float | None) -> bool:
    """Stop claiming, and wait for the running tries to end and their outcomes to be
    recorded: each up to its job's own ``grace`` if it declares one, else up to
    ``grace`` seconds (``None``: as long as it takes). A try whose grace runs out is
    cancelled and put back on the queue without spending a try.

    The outcomes are recorded by the shards' finishers (one writer per shard), which
    ride out an outage: the wait for them ends with the last grace too, so a drain
    during an outage takes no longer than with Redis up. What is left unrecorded
    then is for :func:`put_back`.

    Returns:
        whether every running job ended within its grace and had its outcome
        recorded.
    """
    if not claimer.stopped:
        log.debug("draining: taking no more jobs; %d running", tries.held)
    claimer.stop("draining the job worker")
    began = trio.current_time()
    default = math.inf if grace is None else grace
    # The wait for the outcomes ends with the latest grace of a try seen running.
    last_deadline = began + default
    stopped = 0
    while True:
        now = trio.current_time()
        next_deadline = math.inf
        for current in list(tries.running.values()):
            if current.finished or current.stopping:
                continue
            own = current.job.options.grace if current.job is not None else None
            deadline = began + (default if own is None else own)
            last_deadline = max(last_deadline, deadline)
            if deadline <= now:
                current.stop()
                stopped += 1
            else:
                next_deadline = min(next_deadline, deadline)
        with trio.move_on_at(next_deadline):
            await tries.wait_all_free()
            break
    if stopped:
        # Cancelled here; put back by put_back, which says so if Redis cannot be
        # reached then (their outcomes are not recorded, and they run again later).
        log.info(
            "draining: %d job(s) still running when their grace ran out cancelled, to go "
            "back on the queue without spending a try",
            stopped,
        )
    # Every try has ended; wait for the finishers to record their outcomes.
    with trio.move_on_at(last_deadline):
        while tries.running:
            await outbox.flushed.wait_transition()
    return not stopped and not tries.running


async def put_back(queue: QueueLike, consumer: str, tries: Tries, outbox: Outbox) -> None:
    """Record the ended tries, put the running ones back, and hand back the jobs
    claimed and not started (a graceful stop)."""
    for shard in range(queue.shards):
        await outbox.flush(shard)
    for current in list(tries.running.values()):
        if not current.finished:
            outbox.put(current, "release", b"", 0)
    for shard in range(queue.shards):
        await outbox.flush(shard)
    # Jobs claimed and not started (left in the try runners' channel when the stop
    # came) are held in this worker's name too: hand them back, or they would wait
    # for their leases and then count as lost.
    for shard in range(queue.shards):
        await hand_back(queue, consumer, shard, [t.id for t in tries.on_shard(shard)])
