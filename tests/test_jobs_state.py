"""The job queue as a state machine: random enqueues, aborts, worker starts and graceful
stops, pauses and resumes against in-process workers on one queue, then every job ends
as its script says; jobs with limits (concurrency per name and per key, a rate) never
run past them.

Hypothesis drives the steps from a worker thread; each step runs in the test's Trio
loop (``trio.from_thread.run``), where the workers keep running between steps.
Shrinking is off to keep the run within its time budget: a failure prints the
unshrunk steps.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING, Any

import attrs
import trio
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from streamkit import Backoff
from streamkit.jobs import JobCall, JobFailed, JobQueue, JobStatus, RateLimit, open_job_queue
from tests.jobs_serving import ServingWorker, assert_drained, start_worker

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from streamkit import Redis
    from streamkit.jobs import JobHandle

#: Tries per job: a script failing this many times ends dead.
MAX_TRIES = 3
MAX_WORKERS = 3
#: Seconds for any one step, and for the teardown's drain.
STEP_TIMEOUT = 10.0
DRAIN_TIMEOUT = 30.0
#: The limits of the limited job: running at once per name and per account, and
#: started per window.
LIMITED_CONCURRENCY = 2
LIMITED_RATE = RateLimit(4, per=0.2)


class Scripted(Exception):
    """A failure a job's script asked for."""


@attrs.define
class Model:
    """What the test knows of one job: its script and what was done to it."""

    handle: JobHandle[Any]
    key: str
    fails: int
    after: list[str]
    aborted: JobStatus | None = None
    limited: bool = False


@attrs.define(eq=False)
class World:
    """The Trio side: the server, the running example's queue and its workers."""

    redis: Redis
    nursery: trio.Nursery
    trio_token: trio.lowlevel.TrioToken
    started: Counter[str] = attrs.field(factory=Counter)
    failures: Counter[str] = attrs.field(factory=Counter)
    successes: Counter[str] = attrs.field(factory=Counter)
    examples: itertools.count[int] = attrs.field(factory=itertools.count)
    keys: itertools.count[int] = attrs.field(factory=itertools.count)
    #: Limited jobs running now, and the most that ever ran at once: per account and
    #: ("*") in all.
    running: Counter[str] = attrs.field(factory=Counter)
    most: Counter[str] = attrs.field(factory=Counter)

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run ``fn(*args)`` in the Trio loop, from the Hypothesis thread."""

        async def bounded() -> Any:
            with trio.fail_after(STEP_TIMEOUT):
                return await fn(*args)

        return trio.from_thread.run(bounded, trio_token=self.trio_token)

    async def scripted(self, key: str, fails: int, duration: float) -> str:
        self.started[key] += 1
        if duration:
            await trio.sleep(duration)
        if self.failures[key] < fails:
            self.failures[key] += 1
            raise Scripted(f"{key} fails")
        self.successes[key] += 1
        return key

    async def limited(self, key: str, fails: int, duration: float, account: str) -> str:
        for k in (account, "*"):
            self.running[k] += 1
            self.most[k] = max(self.most[k], self.running[k])
        try:
            return await self.scripted(key, fails, duration)
        finally:
            for k in (account, "*"):
                self.running[k] -= 1

    async def open_example(self) -> Example:
        example: Example = await self.nursery.start(self._hold, f"sm{next(self.examples)}")
        return example

    async def _hold(self, name: str, *, task_status: trio.TaskStatus[Example]) -> None:
        example: Example | None = None
        try:
            with trio.CancelScope() as scope:
                async with (
                    open_job_queue(self.redis, name, lease_ttl=1.0) as queue,
                    trio.open_nursery() as workers,
                ):
                    queue.job(
                        name="scripted",
                        retries=MAX_TRIES - 1,
                        backoff=Backoff(initial=0.01, jitter=0),
                    )(self.scripted)
                    queue.job(
                        name="limited",
                        retries=MAX_TRIES - 1,
                        backoff=Backoff(initial=0.01, jitter=0),
                        concurrency=LIMITED_CONCURRENCY,
                        rate_limit=LIMITED_RATE,
                        limit_key="account",
                        key_concurrency=1,
                    )(self.limited)
                    example = Example(queue, workers, scope)
                    task_status.started(example)
                    await trio.sleep_forever()
        finally:
            if example is not None:
                example.closed.set()


@attrs.define(eq=False)
class Example:
    """One example's queue, the nursery its workers run in, and how to end it."""

    queue: JobQueue
    workers: trio.Nursery
    scope: trio.CancelScope
    closed: trio.Event = attrs.field(factory=trio.Event)

    async def close(self) -> None:
        """Stop its workers and close its queue."""
        self.scope.cancel("example over")
        await self.closed.wait()


#: Jobs to enqueue in one ``enqueue_many``: (failing tries before one succeeds, seconds
#: each try runs, priority, job id).
CALLS = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 1, 2, MAX_TRIES]),
        st.sampled_from([0.0, 0.0, 0.05, 0.2]),
        st.sampled_from([None, "high", "normal", "low"]),
        st.sampled_from([None, None, None, "dup-a", "dup-b"]),
    ),
    min_size=1,
    max_size=3,
)


#: Limited jobs to enqueue in one ``enqueue_many``: (failing tries, seconds each try
#: runs, account).
LIMITED_CALLS = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 1, MAX_TRIES]),
        st.sampled_from([0.0, 0.05, 0.1]),
        st.sampled_from(["a", "b", "c"]),
    ),
    min_size=1,
    max_size=4,
)


class JobsMachine(RuleBasedStateMachine):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.example: Example = world.run(world.open_example)
        self.queue: JobQueue = self.example.queue
        self.workers: list[ServingWorker] = []
        self.jobs: dict[str, Model] = {}
        self.final: dict[str, JobStatus] = {}
        self.ignored_keys: list[str] = []
        self.paused = False

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: len(self.workers) < MAX_WORKERS)
    @rule(concurrency=st.integers(1, 4))
    def start_worker(self, concurrency: int) -> None:
        self.workers.append(self.world.run(self._start, concurrency))

    async def _start(self, concurrency: int) -> ServingWorker:
        return await start_worker(self.example.workers, self.queue, concurrency=concurrency)

    @precondition(lambda self: self.workers)
    @rule(data=st.data())
    def stop_worker(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(self.workers), label="worker")
        self.workers.remove(worker)
        self.world.run(worker.stop)

    @initialize(data=st.data(), calls=CALLS, workers=st.integers(0, 2))
    def begin(self, data: st.DataObject, calls: list[tuple[Any, ...]], workers: int) -> None:
        self.enqueue(data, calls)
        for _ in range(workers):
            self.start_worker(2)

    @rule(data=st.data(), calls=CALLS)
    def enqueue(self, data: st.DataObject, calls: list[tuple[Any, ...]]) -> None:
        known = list(self.jobs)
        batch: list[JobCall] = []
        scripts: list[tuple[str, int, list[str], str | None]] = []
        for fails, duration, priority, job_id in calls:
            after: list[str] = []
            if known:
                after = data.draw(
                    st.lists(st.sampled_from(known), max_size=2, unique=True), label="after"
                )
            key = f"k{next(self.world.keys)}"
            batch.append(
                JobCall(
                    args=(key, fails, duration),
                    job_id=job_id,
                    priority=priority,
                    after=after,
                )
            )
            scripts.append((key, fails, after, job_id))
        handles = self.world.run(self._enqueue, batch)
        assert len(handles) == len(batch)
        seen_ids: set[str] = set()
        for handle, (key, fails, after, job_id) in zip(handles, scripts, strict=True):
            if job_id is not None:
                assert handle.id == job_id
            if handle.id in self.jobs or handle.id in seen_ids:
                # a duplicate id: the first enqueue's job stands, this script never runs
                assert job_id is not None
                self.ignored_keys.append(key)
                continue
            seen_ids.add(handle.id)
            self.jobs[handle.id] = Model(handle, key, fails, after)

    async def _enqueue(self, batch: list[JobCall]) -> list[JobHandle[Any]]:
        job = self.queue.jobs["scripted"]
        return await job.enqueue_many(batch)

    @rule(calls=LIMITED_CALLS)
    def enqueue_limited(self, calls: list[tuple[Any, ...]]) -> None:
        batch: list[JobCall] = []
        keys: list[tuple[str, int]] = []
        for fails, duration, account in calls:
            key = f"k{next(self.world.keys)}"
            batch.append(JobCall(args=(key, fails, duration, account)))
            keys.append((key, fails))
        handles = self.world.run(self.queue.jobs["limited"].enqueue_many, batch)
        for handle, (key, fails) in zip(handles, keys, strict=True):
            self.jobs[handle.id] = Model(handle, key, fails, [], limited=True)

    @precondition(lambda self: not self.paused)
    @rule()
    def pause_limited(self) -> None:
        self.world.run(self.queue.pause, "limited")
        self.paused = True

    @precondition(lambda self: self.paused)
    @rule()
    def resume_limited(self) -> None:
        self.world.run(self.queue.resume, "limited")
        self.paused = False

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        # Newest first (what Hypothesis tries first): those are likelier to be still
        # running. Never drawn from what was observed, which varies run to run.
        job_id = data.draw(st.sampled_from(list(reversed(self.jobs))), label="abort")
        model = self.jobs[job_id]
        status = self.world.run(model.handle.abort, "test aborts")
        if model.aborted is None or model.aborted is JobStatus.EXECUTING:
            model.aborted = status
        if status.final:
            assert self.final.get(job_id, status) is status

    @rule(seconds=st.sampled_from([0.05, 0.2, 0.5]))
    def run_a_while(self, seconds: float) -> None:
        self.world.run(trio.sleep, seconds)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def limits_are_never_exceeded(self) -> None:
        most = self.world.most
        assert most["*"] <= LIMITED_CONCURRENCY, most
        assert all(most[k] <= 1 for k in most if k != "*"), most

    @invariant()
    def every_job_is_counted_once_and_final_states_stick(self) -> None:
        counts, statuses = self.world.run(self._observe)
        total = sum(n for per in counts.by_name.values() for n in per.values())
        assert total == len(self.jobs), counts
        assert all(n >= 0 for per in counts.by_name.values() for n in per.values()), counts
        for job_id, status in statuses.items():
            if job_id in self.final:
                assert status is self.final[job_id], (job_id, self.final[job_id], status)
            elif status.final:
                self.final[job_id] = status

    async def _observe(self) -> tuple[Any, dict[str, JobStatus]]:
        counts = await self.queue.counts()
        statuses = {job_id: await m.handle.status() for job_id, m in self.jobs.items()}
        return counts, statuses

    # ------------------------------------------------------------------ the end

    def teardown(self) -> None:
        try:
            if self.paused:
                self.resume_limited()
            if not self.workers:
                self.workers.append(self.world.run(self._start, 2))
            outcomes = trio.from_thread.run(self._drain, trio_token=self.world.trio_token)
            self._check(outcomes)
            self.world.run(assert_drained, self.world.redis, self.queue)
        finally:
            self.world.run(self.example.close)

    async def _drain(self) -> dict[str, tuple[JobStatus, Any]]:
        outcomes: dict[str, tuple[JobStatus, Any]] = {}
        with trio.fail_after(DRAIN_TIMEOUT):
            for job_id, model in self.jobs.items():
                try:
                    value: Any = await model.handle.result()
                except JobFailed as exc:
                    value = exc
                info = await model.handle.info()
                outcomes[job_id] = (info.status, (value, info))
        return outcomes

    def _expected(self, job_id: str, ended: dict[str, JobStatus]) -> set[JobStatus]:
        model = self.jobs[job_id]
        own = JobStatus.SUCCESS if model.fails < MAX_TRIES else JobStatus.DEAD
        if model.aborted is not None and model.aborted is not JobStatus.EXECUTING:
            return {model.aborted}
        if any(ended[dep] is not JobStatus.SUCCESS for dep in model.after):
            allowed = {JobStatus.DEAD}
        else:
            allowed = {own}
        if model.aborted is JobStatus.EXECUTING:
            # aborted while a try ran: that try (or a later one) may end first
            allowed = {JobStatus.ABORTED, own}
        return allowed

    def _check(self, outcomes: dict[str, tuple[JobStatus, Any]]) -> None:
        world = self.world
        ended: dict[str, JobStatus] = {}
        tally: Counter[JobStatus] = Counter()
        for job_id, model in self.jobs.items():  # dependencies come first
            status, (value, info) = outcomes[job_id]
            ended[job_id] = status
            tally[status] += 1
            assert status in self._expected(job_id, ended), (job_id, model, status, value)
            key = model.key
            if status is JobStatus.SUCCESS:
                assert value == key
                assert world.successes[key] == 1, "the successful try ran exactly once"
                assert world.failures[key] == model.fails
                assert info.tries == model.fails + 1
            elif status is JobStatus.DEAD:
                assert world.successes[key] == 0
                if value.error_type == "DependencyFailed":
                    assert world.started[key] == 0
                    assert any(ended[dep] is not JobStatus.SUCCESS for dep in model.after)
                else:
                    assert value.error_type == "tests.test_jobs_state.Scripted", value
                    assert world.failures[key] == MAX_TRIES == info.tries
            elif status is JobStatus.ABORTED:
                assert world.successes[key] == 0
                assert value.error_type == "Aborted"
            if job_id in self.final:
                assert status is self.final[job_id]
        for key in self.ignored_keys:
            assert world.started[key] == 0, "a deduplicated enqueue ran"
        # The limited jobs' tries started no faster than the rate, on Redis' clock.
        starts = sorted(
            round(attempt.started_at.timestamp() * 1000)
            for job_id, model in self.jobs.items()
            if model.limited
            for attempt in outcomes[job_id][1][1].history
            if attempt.started_at is not None
        )
        count, window = LIMITED_RATE.count, LIMITED_RATE.per_ms
        assert all(b - a >= window for a, b in zip(starts, starts[count:], strict=False)), starts
        counts = world.run(self.queue.counts)
        assert counts.pending == 0, counts
        assert (counts.succeeded, counts.dead, counts.aborted, counts.expired) == (
            tally[JobStatus.SUCCESS],
            tally[JobStatus.DEAD],
            tally[JobStatus.ABORTED],
            0,
        ), counts


async def test_job_queue_state_machine(redis: Redis) -> None:
    async with trio.open_nursery() as nursery:
        world = World(redis, nursery, trio.lowlevel.current_trio_token())

        class Machine(JobsMachine):
            def __init__(self) -> None:
                super().__init__(world)

        def run() -> None:
            run_state_machine_as_test(
                Machine,
                settings=settings(
                    max_examples=12,
                    stateful_step_count=12,
                    deadline=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow],
                ),
            )

        await trio.to_thread.run_sync(run)
        nursery.cancel_scope.cancel()
