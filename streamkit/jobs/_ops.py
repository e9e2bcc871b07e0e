"""Enqueueing as operations (:mod:`streamkit._ops`): one sequence for the Trio queue and clients.

A plan (:mod:`._plan`, :mod:`._workflow`) says what to send; these operations send
it: the links to jobs on other shards first (idempotent: retried), then the enqueue
script calls, a batch at a time, each sent again only while it surely never reached
Redis. The Trio queue runs them through :func:`streamkit._redis.run_op` (a batch's
calls at once on its hot connections), the blocking and asyncio clients through
their drivers (a batch a pipeline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _lua
from .._errors import RedisUnavailable, StreamkitError
from .._ops import NOW, Call, CallBatch, Sleep, retried
from .._retrying import RetryRule
from ._plan import link_answers

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .._ops import Op
    from ._layout import ShardKeys
    from ._plan import EnqueuePlan
    from ._workflow import WorkflowPlan

__all__ = ["CALLS_PER_BATCH", "send_links", "send_plan", "send_workflow"]

#: Enqueue script calls sent together (each up to the plan's jobs per call): the
#: server runs one while the next arrive. Four, as the Trio queue kept in flight: a
#: batch of eight made the Trio side's later calls dearer (more hot connections to
#: serve), and a pipeline of eight saves the clients little (a call is milliseconds
#: of script time, a round trip a tenth of one).
CALLS_PER_BATCH = 4

ENQUEUE = _lua.script("jobs/enqueue")
LINK = _lua.script("jobs/link")


def send_plan(plan: EnqueuePlan, queue: str) -> Op[list[tuple[str, int, bool]]]:
    """Send ``plan``'s calls on ``queue`` (its full name): its links if it has remote
    dependencies, then its enqueue calls, :data:`CALLS_PER_BATCH` at a time; return
    per call the job that runs for it, ``(id, shard, added)``: the plan's own, but for
    a debounced or throttled job the one its key's script call said, and not added for
    a duplicate of a job id
    (:meth:`EnqueuePlan.effective <streamkit.jobs._plan.EnqueuePlan.effective>`; the
    replies of other plans are not kept).

    An enqueue is not idempotent (without ``job_id``): a call is sent again only while
    it surely never reached Redis.

    Error handling:
        :class:`~streamkit.OutcomeUnknown` at once when a call's connection was lost
        with it in flight (its jobs may have been enqueued; the batch's other calls
        ran); :class:`~streamkit.RedisUnavailable` once Redis stayed unreachable for
        the retry time; the first other error of a batch at once.
    """
    linked = (yield from send_links(plan.link_calls(queue))) if plan.remote else None
    calls = [Call.run(ENQUEUE, keys.keys, args) for keys, args in plan.script_calls(queue, linked)]
    what = f"enqueueing jobs on {queue}"
    # The replies, by call, where they say which job runs (debounce, throttle).
    kept: dict[int, Any] | None = {} if plan.coalesced or plan.deduped else None
    # A debounced plan's calls one at a time: calls sent together may run in any order,
    # and the last of a key's enqueues must be the one whose arguments stay.
    per_batch = 1 if plan.coalesced else CALLS_PER_BATCH
    for start in range(0, len(calls), per_batch):
        todo = calls[start : start + per_batch]
        numbers = list(range(start, start + len(todo)))
        started = yield NOW
        # Made on the batch's first failure only: the common path makes none.
        rule: RetryRule | None = None
        while todo:
            replies: list[Any]
            if len(todo) == 1:
                try:
                    replies = [(yield todo[0])]
                except StreamkitError as exc:
                    replies = [exc]
            else:
                replies = yield CallBatch(tuple(todo))
            again: list[Call] = []
            again_numbers: list[int] = []
            delay = 0.0
            now: float | None = None
            for number, call, reply in zip(numbers, todo, replies, strict=True):
                if isinstance(reply, RedisUnavailable):
                    if now is None:
                        now = yield NOW
                    if rule is None:
                        rule = RetryRule(what, idempotent=False, started=started)
                    # OutcomeUnknown: raised at once (it may have been enqueued).
                    delay = max(delay, rule.next_delay(reply, now))
                    again.append(call)
                    again_numbers.append(number)
                elif isinstance(reply, StreamkitError):
                    raise reply
                elif kept is not None:
                    kept[number] = reply
            todo, numbers = again, again_numbers
            if todo:
                yield Sleep(delay)
    if kept is None:
        return [(job_id, shard, True) for job_id, shard in plan.placed]
    return plan.effective([kept[n] for n in range(len(calls))])


def send_workflow(plan: WorkflowPlan) -> Op[None]:
    """Send a workflow's calls, stage by stage: its links (idempotent, retried), then
    its enqueues, one after the other (each sent again only while it surely never
    reached Redis)."""
    for stage in plan.stages:
        linked = yield from send_links(plan.link_calls(stage))
        for keys, args in plan.enqueue_calls(stage, linked):
            yield from retried(
                Call.run(ENQUEUE, keys.keys, args),
                what=f"enqueueing a workflow on {keys.queue}",
                idempotent=False,
            )


def send_links(
    calls: Iterable[tuple[ShardKeys, tuple[Any, ...]]],
) -> Op[dict[tuple[str, str], Any]]:
    """Send the link script's calls (idempotent: retried); its answer per (dependency
    id, dependent id)."""
    linked: dict[tuple[str, str], Any] = {}
    for keys, args in calls:
        replies = yield from retried(
            Call.run(LINK, keys.keys, args), what="linking jobs to the jobs they depend on"
        )
        linked.update(link_answers(args, replies))
    return linked
