"""Jobs enqueued in a partition's commit: a job call as an outbox entry, and back (pure).

A processor's ``events.enqueue(job, ...)`` is committed with the acknowledgement of
the event behind it, like an emitted record: the commit appends the job's enqueue
script call to the partition's outbox (in the partition's slot), and the outbox relay
(:mod:`streamkit._state_relay`), under the partition's lease, runs it on the job's
shard. Each relayed job carries its source's marker key (``__rely:{Q.S}:SOURCE``, in
the shard's slot) and its outbox entry id: the enqueue script adds it only if the
entry is after the marker's, so a relay repeated after a crash, a lost reply or a
takeover adds nothing twice. So a job exists once per event, however often the event
is delivered.

The call is planned here by :func:`~streamkit.jobs._plan.plan_enqueue`, as every
client plans one: the same checks, ids, shards and JSON.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from .._errors import ConfigError
from .._keys import relay_key
from ._model import JobCall
from ._plan import ENQUEUE_CHUNK, OPTION_KEYS, JobIds, Placement, plan_enqueue

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._handle import Job, QueueLike

__all__ = ["JOB_FIELD", "CommittedJobs", "relay_calls"]

#: The outbox field of a job entry: JSON ``[shard keys, enqueue script arguments]``.
JOB_FIELD = b"__job"

#: Where the enqueue script's arguments of one job start, after the shard's key base
#: and the per-call defaults.
_JOB_AT = 9

_RELAYED = OPTION_KEYS["relayed"]


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


class CommittedJobs:
    """Plans the jobs one partition's processor enqueues in its commits.

    Attributes:
        jobs: the jobs it may enqueue, by identity.
    """

    def __init__(self, jobs: Sequence[Job[Any, Any]]) -> None:
        """Error handling:
        :class:`~streamkit.ConfigError` for a debounced or throttled job: a commit
        enqueues a job once per event, and hands out the new job's handle at once.
        """
        for job in jobs:
            what = job.options.coalesced
            if what is not None:
                raise ConfigError(
                    what,
                    f"job {job.name} is {what}d: a commit enqueues its job once per event, "
                    f"not once per key; enqueue it outside the commit (job.enqueue), or "
                    f"declare it without {what}=",
                )
        self.jobs = {id(job): job for job in jobs}
        self._placements: dict[str, Placement] = {}
        self._keys: dict[str, list[str]] = {}

    def entry(
        self, job: Job[Any, Any], call: JobCall
    ) -> tuple[QueueLike, str, int, list[bytes | str | int | float]]:
        """Plan ``call`` of ``job``: its queue, id, shard and outbox entry's fields.

        Error handling:
            :class:`~streamkit.ConfigError` for a job the processor does not declare,
            or dependencies (``after=``) on another shard or queue; as
            :meth:`Job.enqueue <streamkit.jobs.Job.enqueue>` for the call.
        """
        if self.jobs.get(id(job)) is not job:
            raise ConfigError(
                "jobs",
                f"{job!r} is not a job of this processor: name it in "
                f"@app.processor(..., jobs=[...]) or open_events(..., jobs=[...])",
            )
        queue = job.queue
        placement = self._placements.get(queue.name)
        if placement is None:
            placement = Placement(queue.shards, JobIds(), queue.max_bytes)
            self._placements[queue.name] = placement
        plain = call == JobCall(args=call.args)  # arguments only: the planner's fast path
        plan = plan_enqueue(job, [call.args if plain else call], placement, queue=queue.name)
        if plan.remote:
            raise ConfigError(
                "after",
                f"job {job.name}: a job enqueued in a commit may depend (after=) only on "
                f"jobs of its own shard of its queue; give it a job_id on their shard, or "
                f"use one shard",
            )
        ((job_id, shard),) = plan.placed
        # The enqueue script's call, as plan.script_calls would make it for this one job
        # (without building the shard's keys again for every event).
        keys = queue.shard_keys[shard]
        job_id, arguments, options = plan.per_shard[shard]
        shard_keys = self._keys.get(keys.base)
        if shard_keys is None:
            shard_keys = self._keys[keys.base] = list(keys.keys)
        script_args = [keys.base, *plan.defaults, job_id, _text(arguments), _text(options)]
        payload = orjson.dumps([shard_keys, script_args])
        return queue, job_id, shard, [JOB_FIELD, payload]


def relay_calls(
    entries: Sequence[tuple[bytes, bytes]], source: str
) -> list[tuple[list[str], list[Any]]]:
    """The enqueue script's calls relaying job entries ``(outbox id, payload)`` of
    ``source``, in outbox order per shard: one call per run of jobs sharing a shard and
    its defaults (each job marked with its source's marker and its entry id)."""
    calls: list[tuple[list[str], list[Any]]] = []
    # Per shard (its first key), the call being filled: its defaults, and the call.
    open_calls: dict[str, tuple[list[Any], list[Any]]] = {}
    for entry_id, payload in entries:
        keys, args = orjson.loads(payload)
        head, (job_id, arguments, options) = args[:_JOB_AT], args[_JOB_AT:]
        opts = orjson.loads(options) if options else {}
        opts[_RELAYED] = [relay_key(args[0], source), _text(entry_id)]
        current = open_calls.get(keys[0])
        if current is None or current[0] != head or len(current[1]) >= _JOB_AT + 3 * ENQUEUE_CHUNK:
            call: list[Any] = list(head)
            calls.append((keys, call))
            open_calls[keys[0]] = (head, call)
        else:
            call = current[1]
        call.extend((job_id, arguments, orjson.dumps(opts)))
    return calls
