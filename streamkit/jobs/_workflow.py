"""Workflows, pure: chains, groups, chords and failure callbacks, compiled into the
enqueue script's calls, for every client.

A workflow is a graph of jobs whose edges are dependencies (``after=``) that also
carry results: a chain's next step gets the previous result as its first argument, a
chord's callback the list of its header's results, a failure callback the failure of
the workflow, and a group's result is the list of its members' results (a gather node
that the scripts end themselves). :func:`plan_workflow` places each job on a queue
shard, and cuts the graph into stages: a stage's jobs are enqueued in order, in one
call per shard (a job may depend on an earlier one of its call); a dependency on
another shard or queue is linked first, on the dependency's shard, in the stage after
the one that enqueued it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs
import orjson

from .._errors import ConfigError
from ._arguments import FED
from ._batches import chunks
from ._layout import ShardKeys, shard_for
from ._limits import limit_key_of, limit_shard
from ._model import PRIORITIES, JobCall
from ._plan import (
    ENQUEUE_CHUNK,
    OPTION_KEYS,
    JobLike,
    _headers,
    _ms,
    add_call_times,
    answer,
    encode_arguments,
)
from ._trace import inject_trace

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from ._plan import Placement

__all__ = [
    "GATHER",
    "Chain",
    "Chord",
    "Group",
    "Node",
    "Step",
    "WorkflowPlan",
    "chain",
    "chord",
    "compile_workflow",
    "group",
    "plan_workflow",
]

#: The job name of a group's gather node (in counts; no worker runs it).
GATHER = "(group)"

_O = OPTION_KEYS


@attrs.frozen
class Step:
    """One call of a job in a workflow: what :meth:`Job.step
    <streamkit.jobs.Job.step>` returns.

    In a chain (but the first step) and as a chord's callback, the job gets one more
    positional argument first: the previous step's result, or the list of the
    header's results.

    Attributes:
        job: the declared job.
        call: its arguments and options (``after=`` is the workflow's to set).
        on_error: its workflow's failure callback, if any (see :meth:`on_failure`).
    """

    job: JobLike
    call: JobCall
    on_error: Step | None = None

    def on_failure(self, callback: Step) -> Step:
        """This step, with ``callback`` run if it fails (see :meth:`Chain.on_failure`)."""
        return attrs.evolve(self, on_error=callback)


@attrs.frozen
class Group:
    """Jobs run in parallel; the group's result is the list of their results, in
    order. Made by :func:`group`."""

    steps: tuple[Step, ...]
    on_error: Step | None = None

    def on_failure(self, callback: Step) -> Group:
        """This group, with ``callback`` run if a member fails."""
        return attrs.evolve(self, on_error=callback)


@attrs.frozen
class Chord:
    """A group whose results, in order, go to a callback: the chord's result is the
    callback's. Made by :func:`chord`."""

    header: tuple[Step, ...]
    callback: Step
    on_error: Step | None = None

    def on_failure(self, callback: Step) -> Chord:
        """This chord, with ``callback`` run if a member or the callback fails."""
        return attrs.evolve(self, on_error=callback)


@attrs.frozen
class Chain:
    """Steps run one after the other, each given the previous one's result; the
    chain's result is the last one's. Made by :func:`chain`."""

    items: tuple[Step | Group | Chord, ...]
    on_error: Step | None = None

    def on_failure(self, callback: Step) -> Chain:
        """This chain, with ``callback`` run if it fails: the callback gets, as its
        first argument, the failure of the workflow's last job (a dict: ``id``,
        ``name``, ``status`` and ``error``, whose message names the job that failed
        first and why), and it runs once, whichever job failed."""
        return attrs.evolve(self, on_error=callback)


Workflow = Step | Group | Chord | Chain


def _steps(items: Sequence[Any], what: str) -> tuple[Step, ...]:
    if not items:
        raise ConfigError(what, "needs at least one step")
    for item in items:
        if not isinstance(item, Step):
            raise ConfigError(what, f"takes steps (job.step(...)), got {item!r}")
        if item.call.after:
            raise ConfigError(what, "a step's dependencies are its workflow's: leave after= out")
    return tuple(items)


def chain(*items: Step | Group | Chord) -> Chain:
    """Run ``items`` one after the other, each given the previous one's result as its
    first argument (a group or a chord after a step: each member gets it).

    Error handling:
        :class:`~streamkit.ConfigError` for an empty chain or an item that is not a
        step, a group or a chord.
    """
    if not items:
        raise ConfigError("chain", "needs at least one step")
    for item in items:
        if isinstance(item, Step):
            _steps([item], "chain")
        elif not isinstance(item, Group | Chord):
            raise ConfigError("chain", f"takes steps, groups and chords, got {item!r}")
    return Chain(tuple(items))


def group(*steps: Step) -> Group:
    """Run ``steps`` in parallel; the result is the list of their results, in order."""
    return Group(_steps(steps, "group"))


def chord(header: Sequence[Step] | Group, callback: Step) -> Chord:
    """Run the ``header`` steps in parallel, then ``callback`` with the list of their
    results, in order, as its first argument."""
    steps = header.steps if isinstance(header, Group) else tuple(header)
    return Chord(_steps(steps, "chord"), _steps([callback], "chord")[0])


# ---------------------------------------------------------------------------- compiling


@attrs.frozen
class Node:
    """One job of a compiled workflow.

    Attributes:
        job: the declared job, ``None`` for a group's gather node.
        call: its call.
        deps: the nodes it depends on, in order (indexes).
        feed: how their ends feed it: ``"c"`` (the one result first), ``"n"`` (the
            list of results first), ``"f"`` (the failure first), ``"g"`` (a gather
            node), or ``None``.
    """

    job: JobLike | None
    call: JobCall
    deps: tuple[int, ...] = ()
    feed: str | None = None


def compile_workflow(workflow: Workflow) -> tuple[list[Node], int]:
    """The workflow's nodes (dependencies before dependents) and its final node."""
    nodes: list[Node] = []

    def add(node: Node) -> int:
        nodes.append(node)
        return len(nodes) - 1

    def step(item: Step, source: int | None) -> int:
        if source is None:
            return add(Node(item.job, item.call))
        return add(Node(item.job, item.call, (source,), "c"))

    def build(item: Step | Group | Chord | Chain, source: int | None) -> int:
        if isinstance(item, Step):
            final = step(item, source)
        elif isinstance(item, Group):
            members = tuple(step(s, source) for s in item.steps)
            final = add(Node(None, JobCall(), members, "g"))
        elif isinstance(item, Chord):
            members = tuple(step(s, source) for s in item.header)
            final = add(Node(item.callback.job, item.callback.call, members, "n"))
        else:
            final = source  # type: ignore[assignment]  # a chain has one item at least
            for part in item.items:
                final = build(part, final)
        if item.on_error is not None:
            add(Node(item.on_error.job, item.on_error.call, (final,), "f"))
        return final

    return nodes, build(workflow, None)


# ---------------------------------------------------------------------------- planning


@attrs.frozen
class Placed:
    """Where one node of a workflow lives: its queue, id and shard."""

    queue: str
    id: str
    shard: int


@attrs.define
class Stage:
    """The calls of one stage: links first, then enqueues.

    Attributes:
        links: per dependency shard ``(queue, shard)``, pairs (dependency id, the
            dependent as JSON ``[queue, shard, id]``) for the link script.
        jobs: per ``(queue, shard)``, the nodes it enqueues, in order.
    """

    links: dict[tuple[str, int], list[tuple[str, bytes]]] = attrs.field(factory=dict)
    jobs: dict[tuple[str, int], list[int]] = attrs.field(factory=dict)


@attrs.frozen
class WorkflowPlan:
    """A workflow checked, placed and cut into stages (see the module).

    Attributes:
        nodes: its jobs, dependencies first.
        placed: where each node lives.
        final: the node whose result is the workflow's.
        stages: the stages, in order.
        encoded: per node, its arguments (JSON) and options (a dict the links'
            answers complete).
    """

    nodes: list[Node]
    placed: list[Placed]
    final: int
    stages: list[Stage]
    encoded: list[tuple[bytes, dict[str, Any]]]

    def link_calls(self, stage: Stage) -> Iterator[tuple[ShardKeys, tuple[Any, ...]]]:
        """The link script's calls of ``stage``: per call, the shard's keys and its
        arguments (at most ``ENQUEUE_CHUNK`` links a call)."""
        for (queue, shard), pairs in stage.links.items():
            keys = ShardKeys(queue, shard)
            for i in range(0, len(pairs), ENQUEUE_CHUNK):
                flat = [value for pair in pairs[i : i + ENQUEUE_CHUNK] for value in pair]
                yield keys, (keys.base, *flat)

    def enqueue_calls(
        self, stage: Stage, linked: Mapping[tuple[str, str], Any]
    ) -> Iterator[tuple[ShardKeys, tuple[Any, ...]]]:
        """The enqueue script's calls of ``stage``, in order (send them one after the
        other): ``linked`` has the link script's answer for each (dependency id,
        dependent id) the stage linked."""
        for (queue, shard), indexes in stage.jobs.items():
            keys = ShardKeys(queue, shard)
            fields: list[Any] = []
            sizes: list[int] = []
            costs: list[int] = []
            for index in indexes:
                args, opts = self.encoded[index]
                remote = {
                    self.placed[dep].id: answer(
                        linked[(self.placed[dep].id, self.placed[index].id)]
                    )
                    for dep in self.nodes[index].deps
                    if (self.placed[dep].queue, self.placed[dep].shard) != (queue, shard)
                }
                if remote:
                    opts = {**opts, "x": remote}
                encoded = orjson.dumps(opts)
                fields.extend((self.placed[index].id, args, encoded))
                sizes.append(len(args) + len(encoded))
                costs.append(1 + len(self.nodes[index].deps))
            first = self.nodes[indexes[0]]
            defaults = _defaults(first)
            for part in chunks(sizes, max_cost=ENQUEUE_CHUNK, costs=costs):
                yield keys, (keys.base, *defaults, *fields[3 * part.start : 3 * part.stop])


def _defaults(node: Node) -> tuple[Any, ...]:
    """A call's batch defaults (every workflow job carries its own options)."""
    return (GATHER if node.job is None else node.job.name, 1, 0, 1, 86400, 86400, 0, "")


def _options(
    node: Node, deps: list[str], all_deps: list[str], key: str | None, headers: bytes | None
) -> dict[str, Any]:
    """A workflow job's options for the enqueue script, complete (see jobs/enqueue.lua)."""
    call = node.call
    opts: dict[str, Any] = {}
    if node.job is None:
        opts.update({_O["name"]: GATHER, _O["max_tries"]: 1, _O["result_ttl_s"]: 86400})
        opts[_O["priority"]] = 1
    else:
        options = node.job.options
        opts[_O["name"]] = node.job.name
        opts[_O["max_tries"]] = options.retries + 1
        opts[_O["result_ttl_s"]] = math.ceil(options.result_ttl)
        opts[_O["priority"]] = PRIORITIES[call.priority or options.priority]
        if options.limits:
            opts[_O["limits"]] = options.limits
        if options.expires is not None and call.expires is None:
            opts[_O["expires_ms"]] = -_ms(options.expires, "expires")
    add_call_times(opts, call)
    if call.job_id is not None and node.job is not None:
        opts[_O["dedupe_window_s"]] = node.job.options.dedupe_window
    if deps:
        opts[_O["after"]] = deps
    if node.feed is not None:
        opts[_O["feed"]] = node.feed
        opts[_O["order"]] = all_deps
    if key is not None:
        opts[_O["limit_key"]] = key
    if headers is not None:
        opts[_O["headers"]] = headers.decode()
    return opts


def plan_workflow(
    workflow: Workflow,
    *,
    queue_of: Callable[[JobLike], str],
    placement: Placement,
) -> WorkflowPlan:
    """Check, place and cut ``workflow`` into the calls that enqueue it.

    Args:
        workflow: a step, a chain, a group or a chord.
        queue_of: the name of the queue each job is routed to.
        placement: the queues' shards and limit on arguments.

    Jobs without an id of their own, and without limits binding them to a shard, go
    on one shard per queue (so that a workflow on one queue is one call per stage);
    a gather node goes with its first member.

    Error handling:
        As :func:`~streamkit.jobs._plan.plan_enqueue`, for every job, before anything
        is sent. A step that is fed (a chain's later step, a callback) is checked with
        a placeholder for its first argument.
    """
    shards, new_id, max_bytes = placement.shards, placement.new_id, placement.max_bytes
    nodes, final = compile_workflow(workflow)
    trace = inject_trace()
    placed: list[Placed] = []
    home: dict[str, int] = {}
    encoded: list[tuple[bytes, dict[str, Any]]] = []
    keys: list[str | None] = []
    for node in nodes:
        key = None
        if node.job is None:
            first = placed[node.deps[0]]
            queue = first.queue
            job_id = _draw(new_id, shards, first.shard)
            args = b"[[],{}]"
        else:
            job = node.job
            call = node.call
            fed = () if node.feed is None else (None,)
            # The result fed in is not known yet: its parameter is not checked.
            job.check_arguments((*(FED for _ in fed), *call.args), call.kwargs)
            options = job.options
            if options.coalesced is not None:
                raise ConfigError(
                    options.coalesced,
                    f"job {job.name} is {options.coalesced}d: a workflow's steps run once "
                    f"each, so it cannot be one; enqueue it on its own",
                )
            if options.limit_key is not None:
                key = limit_key_of(
                    job.name, options.limit_key, job.bind_arguments, (*fed, *call.args), call.kwargs
                )
            queue = queue_of(job)
            bound = limit_shard(job.name, key, options.limited_by_name, shards)
            if call.job_id is not None:
                job_id = call.job_id
                if bound is not None and shard_for(job_id, shards) != bound:
                    raise ConfigError(
                        "job_id",
                        f"job id {job_id!r} maps to shard {shard_for(job_id, shards)} but the "
                        f"limits of job {job.name} live on shard {bound}: leave job_id out",
                    )
            else:
                job_id = _draw(new_id, shards, bound if bound is not None else home.get(queue))
            args = encode_arguments(job.name, call.args, call.kwargs, max_bytes)
        shard = shard_for(job_id, shards)
        home.setdefault(queue, shard)
        placed.append(Placed(queue, job_id, shard))
        keys.append(key)
        encoded.append((args, {}))
    stage_of: list[int] = []
    stages: list[Stage] = []
    for index, node in enumerate(nodes):
        where = (placed[index].queue, placed[index].shard)
        stage = 0
        for dep in node.deps:
            remote = (placed[dep].queue, placed[dep].shard) != where
            stage = max(stage, stage_of[dep] + (1 if remote else 0))
        stage_of.append(stage)
        while len(stages) <= stage:
            stages.append(Stage())
        stages[stage].jobs.setdefault(where, []).append(index)
        local = [placed[d].id for d in node.deps if (placed[d].queue, placed[d].shard) == where]
        for dep in node.deps:
            if (placed[dep].queue, placed[dep].shard) != where:
                member = orjson.dumps([where[0], where[1], placed[index].id])
                stages[stage].links.setdefault((placed[dep].queue, placed[dep].shard), []).append(
                    (placed[dep].id, member)
                )
        headers = None if node.job is None else _headers(node.call.headers, trace)
        opts = _options(node, local, [placed[d].id for d in node.deps], keys[index], headers)
        encoded[index] = (encoded[index][0], opts)
    return WorkflowPlan(nodes, placed, final, stages, encoded)


def _draw(new_id: Callable[[], str], shards: int, shard: int | None) -> str:
    """A new job id on ``shard`` (any shard if ``None``)."""
    job_id = new_id()
    if shard is None or shards == 1:
        return job_id
    while shard_for(job_id, shards) != shard:
        job_id = new_id()
    return job_id
