"""Enqueueing on the Trio side: the enqueue operations run by the Trio driver.

The plan (checking, encoding, placing and cutting into bounded calls) is
:mod:`streamkit.jobs._plan`; what is sent and when it is sent again is the operations
of :mod:`streamkit.jobs._ops`, shared with the blocking and asyncio clients; this
module only runs them on the queue's client (:func:`streamkit._redis.run_op`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._redis import run_op
from . import _ops

if TYPE_CHECKING:
    from .._redis import Redis
    from ._handle import QueueLike
    from ._plan import EnqueuePlan
    from ._workflow import WorkflowPlan

__all__ = ["send_plan", "send_workflow"]


async def send_plan(queue: QueueLike, plan: EnqueuePlan) -> list[tuple[str, int, bool]]:
    """Send ``plan``'s enqueue script calls, a batch at a time; per call, the job that
    runs for it, ``(id, shard, added)``.

    Error handling:
        As :func:`streamkit.jobs._ops.send_plan`: nothing is sent again blindly.
    """
    return await run_op(queue.redis, _ops.send_plan(plan, queue.name))


async def send_workflow(redis: Redis, plan: WorkflowPlan) -> None:
    """Send ``plan``'s calls, stage by stage: its links (idempotent, retried), then its
    enqueues, one after the other.

    Error handling:
        As :func:`streamkit.jobs._ops.send_workflow`: nothing is sent again blindly.
    """
    await run_op(redis, _ops.send_workflow(plan))
