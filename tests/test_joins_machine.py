"""Joins as a state machine: two streams with random event times (out of order within
and beyond the grace), workers starting, stopping and cancelled mid-batch; then the
output equals the join's semantics run one event at a time over the order the events
reached it (``tests.apps.joined.model``), each result exactly once.

Driven like ``test_state_machine.py``: Hypothesis steps from a worker thread, each run
in the test's Trio loop, where the workers keep running between steps.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

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

from streamkit import App, Stream, _keys
from streamkit._worker import Worker, run_worker
from streamkit.testing import wait_until
from tests.apps.joined import Order, Payment, forwarded_rows, model
from tests.test_state_machine import FAST, World

if TYPE_CHECKING:
    from streamkit import Redis

PARTITIONS = 2
WITHIN = 100
GRACE = 150
HOW: Final = "outer"
SETTLE_TIMEOUT = 40.0
MAX_WORKERS = 2


def result(key: str, order: Order | None, payment: Payment | None) -> dict[str, Any]:
    return {
        "key": key,
        "order": None if order is None else order.at,
        "payment": None if payment is None else payment.at,
    }


@attrs.define(eq=False)
class JoinExample:
    app: App
    orders: Stream[Order]
    payments: Stream[Payment]
    paid: Stream[dict[str, Any]]

    @classmethod
    def make(cls, name: str, redis_url: str) -> JoinExample:
        app = App(name, redis_url=redis_url, **FAST)
        orders = app.stream(
            "orders", record=Order, partition_by="order_id", partition_count=PARTITIONS
        )
        payments = app.stream(
            "payments", record=Payment, partition_by="order_id", partition_count=PARTITIONS
        )
        paid = app.stream("paid", record=dict, partition_by=lambda r: r["key"])
        app.join(
            "j",
            orders,
            payments,
            within=WITHIN / 1000,
            grace=GRACE / 1000,
            how=HOW,
            output=paid,
            left_time=lambda o: o.at / 1000,
            right_time=lambda p: p.at / 1000,
            result=result,
            idle=False,
        )
        return cls(app, orders, payments, paid)


EVENTS = st.lists(
    st.tuples(st.booleans(), st.integers(0, 5), st.integers(-300, 300)),
    min_size=1,
    max_size=10,
)


class JoinMachine(RuleBasedStateMachine):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.example = JoinExample.make(f"jm{next(world.examples)}", world.redis_url)
        self.close_app: trio.Event = world.run(world.connect, self.example.app)
        self.running: list[Worker] = []
        self.clock = 10_000  # event time (ms) moves on by steps, events around it

    def start(self) -> None:
        async def start() -> Worker:
            app = JoinExample.make(self.example.app.name, self.world.redis_url).app
            return await self.world.nursery.start(run_worker, app)  # type: ignore[no-any-return]

        self.running.append(self.world.run(start))

    @initialize(events=EVENTS)
    def begin(self, events: list[tuple[bool, int, int]]) -> None:
        self.start()
        self.send(events)

    @precondition(lambda self: len(self.running) < MAX_WORKERS)
    @rule()
    def start_worker(self) -> None:
        self.start()

    @precondition(lambda self: self.running)
    @rule(data=st.data(), cancel=st.booleans())
    def stop_worker(self, data: st.DataObject, cancel: bool) -> None:
        running = data.draw(st.sampled_from(self.running), label="stop")
        self.running.remove(running)
        if cancel:  # cancelled wherever it is: mid-batch, mid-commit, in a rebalance

            async def now() -> None:
                running.stop_now()
                await trio.lowlevel.checkpoint()

            self.world.run(now)
        else:
            self.world.run(running.stop)

    @rule(events=EVENTS, advance=st.sampled_from([0, 50, 200, 400]))
    def send(self, events: list[tuple[bool, int, int]], advance: int = 0) -> None:
        self.clock += advance
        orders = [Order(order_id=k, at=self.clock + d) for is_order, k, d in events if is_order]
        payments = [
            Payment(order_id=k, at=self.clock + d) for is_order, k, d in events if not is_order
        ]
        if orders:
            self.world.run(self.example.orders.send_many, orders)
        if payments:
            self.world.run(self.example.payments.send_many, payments)

    @rule(seconds=st.sampled_from([0.02, 0.1, 0.3]))
    def run_a_while(self, seconds: float) -> None:
        self.world.run(trio.sleep, seconds)

    def teardown(self) -> None:
        try:
            if not self.running:
                self.start()
            self.world.run(self._settled, timeout=SETTLE_TIMEOUT + 15)
        finally:
            for running in self.running:
                self.world.run(running.stop)
            trio.from_thread.run_sync(self.close_app.set, trio_token=self.world.trio_token)

    async def _settled(self) -> None:
        example = self.example
        redis = self.world.redis
        # Event time far beyond, on every partition: every window closes.
        far = self.clock + 100 * (WITHIN + GRACE)
        partition_of = example.orders.partition_of
        closing = [
            next(n for n in range(10**6, 10**7) if partition_of(Order(order_id=n, at=0)) == p)
            for p in range(PARTITIONS)
        ]
        await example.orders.send_many([Order(order_id=n, at=far) for n in closing])
        await example.payments.send_many([Payment(order_id=n, at=far) for n in closing])
        inner = example.app.streams["j__in"]

        async def forwarded() -> list[list[tuple[bytes, int, int]]]:
            out = []
            for partition in range(PARTITIONS):
                entries = await redis.xrange(inner.key(partition))
                out.append([row for entry in entries for row in forwarded_rows(entry.field_values)])
            return out

        async def got() -> Counter[tuple[str, int | None, int | None]]:
            counted: Counter[tuple[str, int | None, int | None]] = Counter()
            for partition in range(example.paid.partition_count):
                for entry in await redis.xrange(example.paid.key(partition)):
                    fields: Any = entry.field_values
                    r = example.paid.codec.decode(fields, stream="paid")
                    counted[r["key"], r["order"], r["payment"]] += 1
            return counted

        async def settled() -> bool:
            rows = await forwarded()
            seen = sum(1 for partition in rows for _, key, _ in partition if key >= 10**6)
            expected = model(rows, within=WITHIN, grace=GRACE, how=HOW)
            return seen == 2 * PARTITIONS and await got() == expected

        with trio.move_on_after(SETTLE_TIMEOUT):
            await wait_until(settled, what="every result emitted", within=SETTLE_TIMEOUT)
        rows = await forwarded()
        expected = model(rows, within=WITHIN, grace=GRACE, how=HOW)
        emitted = await got()
        missing, extra = sorted(expected - emitted)[:5], sorted(emitted - expected)[:5]
        assert emitted == expected, (
            f"missing {missing}, extra {extra}; forwarded {rows}; "
            f"join state {await self._join_state()}"
        )

    async def _join_state(self) -> list[Any]:
        """What Redis holds of the join's partitions: buffers, index, state hash."""
        redis = self.world.redis
        app = self.example.app
        join: Any = app.processors["j"].tables[0]
        out: list[Any] = []
        for partition in range(PARTITIONS):
            state = _keys.state_key(app.name, "j__in", "j", partition)
            out.append(
                {
                    "buffers": await redis.hgetall(join.key(partition)),
                    "index": await redis.zrange(join.index_key(partition), 0, -1, withscores=True),
                    "state": await redis.hgetall(state),
                }
            )
        return out


async def test_a_join_equals_its_semantics_one_event_at_a_time(
    redis: Redis, redis_url: str
) -> None:
    async with trio.open_nursery() as nursery:
        world = World(redis, redis_url, nursery, trio.lowlevel.current_trio_token())
        config = settings(
            # (JOIN_MACHINE_EXAMPLES=200 for a long hunt.)
            max_examples=int(os.environ.get("JOIN_MACHINE_EXAMPLES", "4")),
            stateful_step_count=8,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        await trio.to_thread.run_sync(
            lambda: run_state_machine_as_test(
                lambda: JoinMachine(world),  # type: ignore[arg-type]
                settings=config,
            )
        )
        nursery.cancel_scope.cancel()
