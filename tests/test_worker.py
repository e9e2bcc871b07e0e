"""Workers in-process: every event processed once, in order per key, across rebalances."""

from __future__ import annotations

import functools
import gc
import signal
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from streamkit import ConfigError
from streamkit._worker import YOUNG_COLLECTION_EVERY, Worker, run_worker
from streamkit.testing import free_port, wait_until
from tests.apps.scenario import SEEN, Numbered, make_app
from tests.scenarios import numbered_events, seen, tally

if TYPE_CHECKING:
    from streamkit import Redis

FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 1.0,
}


async def wait_processed(redis: Redis, count: int) -> None:
    async def enough() -> bool:
        return await redis.llen(SEEN) >= count

    await wait_until(enough, what=f"{count} processings in {SEEN}", within=30)


async def test_young_collections_are_spaced_while_workers_run(redis_url: str) -> None:
    """While any worker of the process runs, the collector's young generation waits
    for YOUNG_COLLECTION_EVERY allocations; the last worker to stop puts back the
    thresholds it found, whatever order overlapping workers stop in."""
    found = gc.get_threshold()
    gc.set_threshold(700, *found[1:])
    try:
        async with trio.open_nursery() as nursery:
            first_app, _ = make_app(redis_url=redis_url, worker="w0", **FAST)
            second_app, _ = make_app(redis_url=redis_url, worker="w1", **FAST)
            first = await nursery.start(run_worker, first_app)
            assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, *found[1:])
            second = await nursery.start(run_worker, second_app)
            await first.stop()  # the first to start stops first
            assert gc.get_threshold()[0] == YOUNG_COLLECTION_EVERY
            await second.stop()
        assert gc.get_threshold() == (700, *found[1:])
    finally:
        gc.set_threshold(*found)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.cluster
async def test_workers_process_every_event_in_order(
    redis_url: str, redis: Redis, workers: int
) -> None:
    sent = numbered_events(keys=40, per_key=50)
    async with trio.open_nursery() as nursery:
        running: list[Worker] = []
        for n in range(workers):
            app, stream = make_app(redis_url=redis_url, worker=f"w{n}", **FAST)
            running.append(await nursery.start(run_worker, app))
        async with app:
            await stream.send_many(sent)
        await wait_processed(redis, len(sent))
        for worker in running:
            await worker.stop()
    result = tally(sent, await seen(redis))
    assert result.lost == 0
    assert result.order_violations == 0
    assert result.duplicated == 0  # nothing crashed: exactly once in practice
    assert len(result.workers) == workers


@pytest.mark.cluster
async def test_workers_joining_and_leaving_one_by_one(redis_url: str, redis: Redis) -> None:
    total: list[Numbered] = []
    async with trio.open_nursery() as nursery:
        producer_app, stream = make_app(redis_url=redis_url, worker="producer", **FAST)
        async with producer_app:
            running: list[Worker] = []
            for round_number in range(5):  # three join, then two leave
                if round_number < 3:
                    app, _ = make_app(redis_url=redis_url, worker=f"w{round_number}", **FAST)
                    running.append(await nursery.start(run_worker, app))
                else:
                    await running.pop(0).stop()
                batch = numbered_events(keys=20, per_key=20, start=round_number * 20)
                total.extend(batch)
                await stream.send_many(batch)
                await wait_processed(redis, len(total))
            for worker in running:
                await worker.stop()
    result = tally(total, await seen(redis))
    assert result.lost == 0
    assert result.order_violations == 0


async def test_unknown_processor_is_refused(redis_url: str) -> None:
    app, _ = make_app(redis_url=redis_url)
    with pytest.raises(ConfigError, match="unknown processor 'nope'"):
        await run_worker(app, processors=["nope"])


async def test_a_signal_stops_the_worker_gracefully(redis_url: str, redis: Redis) -> None:
    app, stream = make_app(redis_url=redis_url, **FAST)
    before = signal.getsignal(signal.SIGINT)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            worker: Worker = await nursery.start(
                functools.partial(run_worker, app, handle_signals=True)
            )
            async with app:
                await stream.send_many(numbered_events(keys=8, per_key=5))
            await wait_processed(redis, 40)
            signal.raise_signal(signal.SIGINT)
            # The worker stops by itself: the nursery ends without being cancelled.
    assert worker.stop_requested
    assert signal.getsignal(signal.SIGINT) is before
    locks = await redis.keys("__lock:*")
    assert {k for k in locks if not k.endswith(b":fence")} == set()  # every lease released


async def test_a_signal_while_connecting_stops_the_worker() -> None:
    app, _ = make_app(redis_url=f"redis://127.0.0.1:{free_port()}", connect_give_up_after=60)

    async def interrupt() -> None:
        await trio.testing.wait_all_tasks_blocked()  # retrying the connection
        signal.raise_signal(signal.SIGINT)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(interrupt)
            # start() gets the worker, its stop asked for, not "never started".
            worker: Worker = await nursery.start(
                functools.partial(run_worker, app, handle_signals=True)
            )
    assert worker.stop_requested
    assert not worker.executors
