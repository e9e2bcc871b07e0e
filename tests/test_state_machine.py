"""State as a state machine: random sends, processing failures and retries, workers
starting, stopping and being cancelled mid-batch, then every table and the output
stream equal a sequential fold of the events sent.

Hypothesis drives the steps from a worker thread; each step runs in the test's Trio
loop (``trio.from_thread.run``), where the workers keep running between steps.
Shrinking is off to keep the run within its time budget: a failure prints the
unshrunk steps.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio.lowlevel
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from streamkit import App, Backoff, Events, ExceptionPolicy, Record, Stream, Table
from streamkit._worker import Worker, run_worker
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from streamkit import Redis

MAX_WORKERS = 3
KEYS = 6
STEP_TIMEOUT = 15.0
SETTLE_TIMEOUT = 40.0
FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 0.5,
    "batch_size": 7,
}


class Item(Record):
    key: str
    n: int
    value: int
    fails: int  # the processor raises on its first `fails` deliveries


class Out(Record):
    key: str
    n: int
    total: int


@attrs.define(eq=False)
class Example:
    """One example's app and its running workers."""

    app: App
    items: Stream[Item]
    outs: Stream[Out]
    totals: Table[int]
    counts: Table[int]
    failed: defaultdict[int, int] = attrs.field(factory=lambda: defaultdict(int))

    @classmethod
    def make(
        cls, name: str, redis_url: str, failed: defaultdict[int, int] | None = None
    ) -> Example:
        """The app (each worker gets an instance of its own, sharing ``failed``)."""
        app = App(name, redis_url=redis_url, **FAST)
        items = app.stream("items", record=Item, partition_by="key", partition_count=4)
        outs = app.stream("outs", record=Out, partition_by="key", partition_count=2)
        totals: Table[int] = app.table("totals", value=int, default=0)
        counts: Table[int] = app.table("counts", value=int, default=0)
        example = cls(app, items, outs, totals, counts)
        if failed is not None:
            example.failed = failed
        failed = example.failed

        @app.processor(
            items,
            tables=[totals, counts],
            outputs=[outs],
            policy=ExceptionPolicy(
                action="retry", retries=100, backoff=Backoff(initial=0.01, jitter=0)
            ),
        )
        async def fold(events: Events[Item]) -> None:
            async for batch in events.take(3, within=0.01):
                for item in batch:
                    total = await totals.get(item.key) + item.value
                    totals.set(item.key, total)
                    counts.set(item.key, await counts.get(item.key) + 1)
                    events.emit(outs, Out(key=item.key, n=item.n, total=total))
                    if failed[item.n] < item.fails:
                        failed[item.n] += 1
                        raise RuntimeError("scripted failure, after writing")
                await trio.lowlevel.checkpoint()

        return example


@attrs.define(eq=False)
class World:
    redis: Redis
    redis_url: str
    nursery: trio.Nursery
    trio_token: trio.lowlevel.TrioToken
    examples: itertools.count[int] = attrs.field(factory=itertools.count)

    def run(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, timeout: float = STEP_TIMEOUT
    ) -> Any:
        async def bounded() -> Any:
            with trio.fail_after(timeout):
                return await fn(*args)

        return trio.from_thread.run(bounded, trio_token=self.trio_token)

    async def connect(self, app: App) -> trio.Event:
        """Keep ``app`` connected (for sends and reads) until the event returned is set."""
        return await self.nursery.start(self._connected, app)  # type: ignore[no-any-return]

    @staticmethod
    async def _connected(app: App, *, task_status: trio.TaskStatus[trio.Event]) -> None:
        close = trio.Event()
        async with app:
            task_status.started(close)
            await close.wait()

    async def start(self, example: Example) -> Worker:
        """A worker of its own app instance, sharing the example's failure script."""
        app = Example.make(example.app.name, self.redis_url, example.failed).app
        return await self.nursery.start(run_worker, app)  # type: ignore[no-any-return]


ITEMS = st.lists(
    st.tuples(
        st.integers(0, KEYS - 1),
        st.integers(-5, 20),
        st.sampled_from([0, 0, 0, 1, 2]),
    ),
    min_size=1,
    max_size=12,
)


class StateMachine(RuleBasedStateMachine):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.example = Example.make(f"sm{next(world.examples)}", world.redis_url)
        self.close_app: trio.Event = world.run(world.connect, self.example.app)
        self.running: list[Worker] = []
        self.sent: list[Item] = []
        self.numbers = itertools.count()

    @initialize(items=ITEMS, workers=st.integers(1, 2))
    def begin(self, items: list[tuple[int, int, int]], workers: int) -> None:
        for _ in range(workers):
            self.start_worker()
        self.send(items)

    @precondition(lambda self: len(self.running) < MAX_WORKERS)
    @rule()
    def start_worker(self) -> None:
        self.running.append(self.world.run(self.world.start, self.example))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def stop_worker(self, data: st.DataObject) -> None:
        running = data.draw(st.sampled_from(self.running), label="stop")
        self.running.remove(running)
        self.world.run(running.stop)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def cancel_worker(self, data: st.DataObject) -> None:
        """Cancelled wherever it is: mid-batch, mid-commit, in a rebalance."""
        running = data.draw(st.sampled_from(self.running), label="cancel")
        self.running.remove(running)
        self.world.run(self._stop_now, running)

    @staticmethod
    async def _stop_now(running: Worker) -> None:
        running.stop_now()
        await trio.lowlevel.checkpoint()

    @rule(items=ITEMS)
    def send(self, items: list[tuple[int, int, int]]) -> None:
        batch = [
            Item(key=f"k{key}", n=next(self.numbers), value=value, fails=fails)
            for key, value, fails in items
        ]
        self.world.run(self.example.items.send_many, batch)
        self.sent.extend(batch)

    @rule(seconds=st.sampled_from([0.02, 0.1, 0.3]))
    def run_a_while(self, seconds: float) -> None:
        self.world.run(trio.sleep, seconds)

    def teardown(self) -> None:
        try:
            if not self.running:
                self.start_worker()
            self.world.run(self._settled, timeout=SETTLE_TIMEOUT + STEP_TIMEOUT)
        finally:
            for running in self.running:
                self.world.run(running.stop)
            trio.from_thread.run_sync(self.close_app.set, trio_token=self.world.trio_token)

    async def _settled(self) -> None:
        # The fold: per key, the running total and count, and the outputs in order.
        totals: dict[str, int] = defaultdict(int)
        counts: dict[str, int] = defaultdict(int)
        outs: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for item in self.sent:
            totals[item.key] += item.value
            counts[item.key] += 1
            outs[item.key].append((item.n, totals[item.key]))
        keys = sorted(counts)
        example = self.example

        async def done() -> bool:
            return await example.counts.read_many(keys) == [counts[k] for k in keys]

        with trio.move_on_after(SETTLE_TIMEOUT):
            await wait_until(done, what="every item folded", within=SETTLE_TIMEOUT)
        assert await example.counts.read_many(keys) == [counts[k] for k in keys]
        assert await example.totals.read_many(keys) == [totals[k] for k in keys]
        got: dict[str, list[tuple[int, int]]] = defaultdict(list)
        redis = self.world.redis
        for partition in range(example.outs.partition_count):
            entries: Any = await redis.xrange(example.outs.key(partition))
            for e in entries:
                out = example.outs.codec.decode(e.field_values, stream="outs")
                got[out.key].append((out.n, out.total))
        assert dict(got) == dict(outs)


async def test_state_equals_a_sequential_fold(redis: Redis, redis_url: str) -> None:
    async with trio.open_nursery() as nursery:
        world = World(redis, redis_url, nursery, trio.lowlevel.current_trio_token())
        config = settings(
            max_examples=4,
            stateful_step_count=10,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        await trio.to_thread.run_sync(
            lambda: run_state_machine_as_test(
                lambda: StateMachine(world),  # type: ignore[arg-type]
                settings=config,
            )
        )
        nursery.cancel_scope.cancel()
