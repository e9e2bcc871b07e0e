"""Jobs enqueued in the commit (``events.enqueue``): once per event, on a server and a
cluster.

In-process workers on a real server (and the session's cluster): every event enqueues
exactly one job, beside its table write and emitted record; a failed and retried
event's job is discarded with it; the relay run again after a crash adds nothing; a
job the processor does not declare, or a dependency on another shard, is refused.
The faults (kill -9, a zombie, takeovers) are in ``tests/reliability``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, Backoff, ConfigError, Events, ExceptionPolicy, Record
from streamkit._lua import script
from streamkit._redis import LuaScript
from streamkit._worker import run_worker
from streamkit.jobs import JobCall
from streamkit.jobs._committed import CommittedJobs, relay_calls
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis

FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 1.0,
}


class Order(Record):
    order_id: int
    customer: str


class Sent(Record):
    order_id: int
    customer: str
    job_id: str


def shop(redis_url: str, ran: list[int], fail_once: set[int] | None = None) -> tuple[App, Any]:
    app = App("shop", redis_url=redis_url, **FAST)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=4)
    sent = app.stream("sent", record=Sent, partition_by="customer", partition_count=2)
    counts = app.table("counts", value=int, default=0)
    failing = set(fail_once or ())

    @app.job
    async def send_receipt(order_id: int) -> str:
        ran.append(order_id)
        return f"receipt {order_id}"

    policy = ExceptionPolicy(action="retry", backoff=Backoff(initial=0.01, maximum=0.02))

    @app.processor(orders, tables=[counts], outputs=[sent], jobs=[send_receipt], policy=policy)
    async def take_orders(events: Events[Order]) -> None:
        async for order in events.records():
            counts.set(order.customer, await counts.get(order.customer) + 1)
            handle = events.enqueue(send_receipt, order.order_id)
            events.emit(
                sent, Sent(order_id=order.order_id, customer=order.customer, job_id=handle.id)
            )
            if order.order_id in failing:
                failing.discard(order.order_id)
                raise ConnectionError("the processor fails once on this order")

    return app, orders


@pytest.mark.cluster
async def test_each_event_enqueues_its_job_once(redis_url: str, redis: Redis) -> None:
    ran: list[int] = []
    app, orders = shop(redis_url, ran, fail_once={3, 17})
    sent = [Order(order_id=n, customer=f"c{n % 7}") for n in range(60)]
    async with trio.open_nursery() as nursery:
        await nursery.start(run_worker, app)
        await orders.send_many(sent)
        await wait_until(lambda: len(ran) >= len(sent), what="every job run", within=30)

        async def all_succeeded() -> bool:
            # (a job's body runs before its success is committed)
            return (await app.job_queue.counts()).succeeded >= len(sent)

        await wait_until(all_succeeded, what="every job's success", within=30)
        counts = await app.job_queue.counts()
        nursery.cancel_scope.cancel()
    # Each order's job once, the two failed processings' jobs discarded with them.
    assert sorted(ran) == list(range(60))
    assert counts.succeeded == 60


async def test_a_relay_run_again_adds_nothing(redis_url: str, redis: Redis) -> None:
    app = App("relaid", redis_url=redis_url)

    @app.job
    async def note(n: int) -> int:
        return n

    async with app:
        planner = CommittedJobs([note])
        entries: list[tuple[bytes, bytes]] = []
        for n, entry_id in ((1, b"5-0"), (2, b"5-1"), (3, b"6-0")):
            _, _, _, (_field, payload) = planner.entry(note, JobCall(args=(n,)))
            assert isinstance(payload, bytes)
            entries.append((entry_id, payload))
        enqueue = LuaScript(script("jobs/enqueue"))

        async def relay(batch: list[tuple[bytes, bytes]]) -> list[int]:
            added: list[int] = []
            for keys, args in relay_calls(batch, "relaid.orders.0.p"):
                added.extend(await enqueue(redis, keys=keys, args=args))
            return added

        assert await relay(entries[:2]) == [1, 1]
        # A crash before the outbox was trimmed: the new owner relays it all again.
        assert await relay(entries) == [0, 0, 1]
        assert await relay(entries) == [0, 0, 0]
        assert (await app.job_queue.counts()).pending == 3


async def test_an_undeclared_job_or_a_remote_dependency_is_refused(redis_url: str) -> None:
    app = App("refusing", redis_url=redis_url, job_shards=4)

    @app.job
    async def note(n: int) -> int:
        return n

    @app.job
    async def other(n: int) -> int:
        return n

    async with app:
        planner = CommittedJobs([note])
        with pytest.raises(ConfigError, match="not a job of this processor"):
            planner.entry(other, JobCall(args=(1,)))
        with pytest.raises(TypeError, match="job note"):
            planner.entry(note, JobCall(args=("one", 2)))
        home = app.job_queue.handle("mine-0").shard
        far = next(f"dep-{i}" for i in range(100) if app.job_queue.handle(f"dep-{i}").shard != home)
        with pytest.raises(ConfigError, match="only on jobs of its own shard"):
            planner.entry(note, JobCall(args=(1,), after=[far], job_id="mine-0"))
