"""Enqueueing on the Trio side: a plan's script calls, sent a few at a time.

The plan (checking, encoding, placing and cutting into bounded calls) is
:mod:`streamkit.jobs._plan`, shared with the blocking and asyncio clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from .._lua import script
from .._redis import LuaScript, call_once, retry_idempotent
from ._plan import link_answers

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .._redis import Redis
    from ._handle import QueueLike
    from ._layout import ShardKeys
    from ._plan import EnqueuePlan
    from ._workflow import WorkflowPlan

__all__ = ["send_plan", "send_workflow"]

#: Enqueue script calls in flight at once: the server runs one while the next arrives.
CALLS_IN_FLIGHT = 4

_ENQUEUE = LuaScript(script("jobs/enqueue"), hot=True)
_LINK = LuaScript(script("jobs/link"))


async def send_plan(queue: QueueLike, plan: EnqueuePlan) -> None:
    """Send ``plan``'s enqueue script calls, a few at a time.

    Error handling:
        As :func:`~streamkit.lowlevel.call_once`: nothing is sent again blindly.
    """
    linked = await send_links(queue.redis, plan.link_calls(queue.name)) if plan.remote else None
    calls = list(plan.script_calls(queue.name, linked))

    async def send(keys: ShardKeys, args: tuple[Any, ...]) -> None:
        await call_once(
            _ENQUEUE, queue.redis, keys.keys, args, what=f"enqueueing jobs on {queue.name}"
        )

    if len(calls) == 1:
        await send(*calls[0])
        return
    limiter = trio.CapacityLimiter(CALLS_IN_FLIGHT)

    async def limited(keys: ShardKeys, args: tuple[Any, ...]) -> None:
        async with limiter:
            await send(keys, args)

    async with trio.open_nursery() as nursery:
        for keys, args in calls:
            nursery.start_soon(limited, keys, args)


async def send_workflow(redis: Redis, plan: WorkflowPlan) -> None:
    """Send ``plan``'s calls, stage by stage: its links (idempotent, retried), then its
    enqueues, one after the other.

    Error handling:
        As :func:`~streamkit.lowlevel.call_once` for the enqueues: nothing is sent again blindly.
    """
    for stage in plan.stages:
        linked = await send_links(redis, plan.link_calls(stage))
        for keys, args in plan.enqueue_calls(stage, linked):
            await call_once(_ENQUEUE, redis, keys.keys, args, what="enqueueing a workflow")


async def send_links(
    redis: Redis, calls: Iterable[tuple[ShardKeys, tuple[Any, ...]]]
) -> dict[tuple[str, str], Any]:
    """Send the link script's calls (idempotent: retried); its answer per (dependency
    id, dependent id)."""
    linked: dict[tuple[str, str], Any] = {}
    for keys, args in calls:
        replies = await retry_idempotent(
            _LINK, redis, keys.keys, args, what="linking jobs to the jobs they depend on"
        )
        linked.update(link_answers(args, replies))
    return linked
