"""Where a job queue keeps its data in Redis (pure).

A queue is split into ``shards``, like a stream into partitions. Every key of shard
``S`` of queue ``Q`` carries the hash tag ``{Q.S}``, so all of a shard's keys live in
one Redis Cluster slot and each script stays single-slot; the shards of a busy queue
spread over the cluster's masters.

====================================  ================================================
key                                   what it holds
====================================  ================================================
``__jobs:{Q.S}:q0`` / ``q1`` / ``q2``  the ready jobs of priority high / normal / low
                                      (Redis streams, consumer group ``workers``; an
                                      entry is pending while its job runs)
``__jobs:{Q.S}:sched``                delayed jobs and retries, scored by due time (ms)
``__jobs:{Q.S}:dead``                 the dead-letter queue (a Redis stream of ids)
``__jobs:{Q.S}:done``                 completions of awaited jobs (for result waiters)
``__jobs:{Q.S}:counts``               jobs per ``status|name`` (a hash)
``__jobs:{Q.S}:job:ID``               job ID: arguments, status, tries, result ...
``__jobs:{Q.S}:deps:ID``              the jobs waiting for job ID (a set)
``__jobs:{Q.S}:settle``               ended jobs with dependents left to settle (a list)
``__jobs:{Q.S}:settling:N``           one ended job's dependents left to settle (its
                                      ``deps:ID`` renamed; ``:settling`` numbers them)
``__jobs:{Q.S}:once:ID``              job ID's dedupe marker (expires)
``__jobs:{Q.S}:ctl``                  the paused job names (``*``: the whole queue)
``__jobs:{Q.S}:rl:*``, ``:cc:*``,     rate windows, concurrency slots, held jobs and
``:park:*``, ``:wake``, ``:lims``     their wake-ups (see ``_scripts``)
``__jobs:{Q.0}:crontab``              the runtime schedules (shard 0; ``:crontab:v``
                                      its version)
====================================  ================================================
"""

from __future__ import annotations

import attrs

from .._keys import validate_name
from .._partitioner import partition_for

__all__ = ["DEFAULT_QUEUE", "ShardKeys", "routed_queue", "shard_for"]

#: The name of an app's own job queue among its queues (the one named after the app).
DEFAULT_QUEUE = "default"


def shard_for(job_id: str, shards: int) -> int:
    """The shard of a job id: stable across processes and machines."""
    return 0 if shards == 1 else partition_for(job_id, shards)


def routed_queue(app: str, queue: str | None) -> str:
    """The name of an app's job queue ``queue``: the app's name for its default queue,
    ``APP.QUEUE`` for a named one (its keys carry the app's name, so the app's ACL
    patterns cover them)."""
    if queue is None or queue == DEFAULT_QUEUE:
        return app
    return f"{app}.{queue}"


def _queue_name(_i: object, _a: object, value: str) -> None:
    # an app's named queue is APP.QUEUE: each part a name
    for part in value.split(".", 1):
        validate_name("queue name", part)


@attrs.frozen
class ShardKeys:
    """The keys of one shard of a job queue.

    Attributes:
        queue: the queue's name.
        shard: the shard's number.
    """

    queue: str = attrs.field(validator=_queue_name)
    shard: int
    base: str = attrs.field(init=False)
    keys: tuple[str, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        base = f"__jobs:{{{self.queue}.{self.shard}}}"
        object.__setattr__(self, "base", base)
        object.__setattr__(
            self,
            "keys",
            tuple(
                f"{base}:{part}" for part in ("q0", "q1", "q2", "sched", "dead", "done", "counts")
            ),
        )

    def ready(self, priority: int) -> str:
        """The ready stream of ``priority`` (0 high, 1 normal, 2 low)."""
        return self.keys[priority]

    @property
    def schedule(self) -> str:
        return self.keys[3]

    @property
    def dead(self) -> str:
        return self.keys[4]

    @property
    def done(self) -> str:
        return self.keys[5]

    @property
    def counts(self) -> str:
        return self.keys[6]

    @property
    def control(self) -> str:
        """The paused job names (a hash; ``*`` for the whole queue)."""
        return f"{self.base}:ctl"

    @property
    def schedules(self) -> str:
        """The runtime schedules (a hash: name -> JSON), on shard 0."""
        return f"{self.base}:crontab"

    @property
    def schedules_version(self) -> str:
        """Bumped by each change of the runtime schedules, on shard 0."""
        return f"{self.base}:crontab:v"

    def job(self, job_id: str) -> str:
        """The hash of job ``job_id``."""
        return f"{self.base}:job:{job_id}"
