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
``__jobs:{Q.S}:db:NAME:KEY``          a debounce key's waiting job (expires)
``__jobs:{Q.S}:th:NAME:KEY``          a throttle key's kept job (expires)
``__jobs:{Q.S}:out:ID``               the chunks job ID streamed, then its outcome
``__jobs:{Q.S}:obox``                 records successes emitted, to relay (Cluster)
``__jobs:{Q.S}:ctl``                  the paused job names (``*``: the whole queue)
``__jobs:{Q.S}:rl:*``, ``:rn:*``,     rate windows and their counts, concurrency
``:cc:*``, ``:park:*``, ``:wake``,    slots, held jobs and their wake-ups (see
``:lims``                             ``_scripts``)
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


#: The parts of a shard's fixed keys, in the order every script takes them (KEYS[1]
#: to KEYS[7]): the ready streams of priority high, normal and low, then the rest.
_FIXED = ("q0", "q1", "q2", "sched", "dead", "done", "counts")


@attrs.frozen
class ShardKeys:
    """The keys of one shard of a job queue.

    Attributes:
        queue: the queue's name.
        shard: the shard's number.
        base: the prefix of all its keys.
        keys: its fixed keys, as the scripts take them.
        schedule: the delayed jobs and retries, scored by due time.
        dead: the dead-letter stream.
        done: the completions of awaited jobs.
        counts: the jobs per status and name.
    """

    queue: str = attrs.field(validator=_queue_name)
    shard: int
    base: str = attrs.field(init=False)
    keys: tuple[str, ...] = attrs.field(init=False)
    # The named fixed keys (after the three ready streams), set with ``keys``.
    schedule: str = attrs.field(init=False, repr=False, eq=False)
    dead: str = attrs.field(init=False, repr=False, eq=False)
    done: str = attrs.field(init=False, repr=False, eq=False)
    counts: str = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        base = f"__jobs:{{{self.queue}.{self.shard}}}"
        keys = tuple(f"{base}:{part}" for part in _FIXED)
        named = zip(("schedule", "dead", "done", "counts"), keys[3:], strict=True)
        for name, value in (("base", base), ("keys", keys), *named):
            object.__setattr__(self, name, value)  # frozen: set once, here

    def ready(self, priority: int) -> str:
        """The ready stream of ``priority`` (0 high, 1 normal, 2 low)."""
        return self.keys[priority]

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

    def output(self, job_id: str) -> str:
        """The stream of the chunks job ``job_id`` streamed, ended by its outcome."""
        return f"{self.base}:out:{job_id}"
