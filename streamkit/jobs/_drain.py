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
    """Stop claiming, and wait up to ``grace`` seconds (``None``: as long as it takes)
    for the running tries to end and their outcomes to be recorded.

    Returns:
        whether every running job ended within ``grace``.
    """
    if not claimer.stopped:
        log.debug("draining: taking no more jobs; %d running", tries.held)
    claimer.stop("draining the job worker")
    with trio.move_on_after(math.inf if grace is None else grace):
        await tries.wait_all_free()
        # Every try has ended; wait for their outcomes to be recorded (by the
        # finishers, or here).
        while tries.running:
            for shard in range(outbox.queue.shards):
                await outbox.flush(shard)
            if tries.running:
                await outbox.flushed.wait_transition()
        return True
    log.info("draining: %d jobs still running after %gs", tries.held, grace)
    return False


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
