"""Background tasks: schedules on a mock clock, and tasks run by real workers."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from streamkit import App, ConfigError
from streamkit._background import BackgroundTask, next_cron_time, run_background_task
from streamkit._worker import Worker, run_worker
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis


def test_next_cron_time() -> None:
    now = datetime(2026, 3, 1, 12, 3, 30)
    assert next_cron_time("*/5 * * * *", now) == datetime(2026, 3, 1, 12, 5)
    assert next_cron_time("0 0 * * *", now) == datetime(2026, 3, 2, 0, 0)


def test_invalid_schedules_are_refused() -> None:
    async def noop() -> None:
        pass

    with pytest.raises(ConfigError, match="crontab"):
        BackgroundTask(name="x", fn=noop, kind="crontab", cron="every minute")
    with pytest.raises(ConfigError, match="interval"):
        BackgroundTask(name="x", fn=noop, kind="timer", interval=0)


async def test_timer_fires_on_schedule_without_drift(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fired: list[float] = []
    start = trio.current_time()

    async def slow() -> None:
        fired.append(trio.current_time() - start)
        await trio.sleep(0.3)  # runs take time: the schedule must not drift

    task = BackgroundTask(name="slow", fn=slow, kind="timer", interval=1.0)
    with trio.move_on_after(4.5):
        await run_background_task(task)
    assert fired == [1.0, 2.0, 3.0, 4.0]


FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 0.5,
}


async def test_workers_run_tasks_and_leader_only_tasks(redis_url: str, redis: Redis) -> None:
    def make(name: str) -> App:
        app = App("bg", redis_url=redis_url, **FAST)

        @app.task
        async def hello() -> None:
            await app.redis.rpush("bg:hello", [name])

        @app.timer(interval=0.05)
        async def tick() -> None:
            await app.redis.hincrby("bg:ticks", name, 1)

        @app.timer(interval=0.05, on_leader=True)
        async def lead() -> None:
            await app.redis.rpush("bg:leader", [name])

        return app

    async with trio.open_nursery() as nursery:
        workers: list[Worker] = [await nursery.start(run_worker, make(n)) for n in ("a", "b")]

        async def both_running() -> bool:
            return await redis.llen("bg:leader") >= 5 and await redis.hlen("bg:ticks") >= 2

        await wait_until(both_running, what="leader runs and both workers' ticks", within=20)
        leaders = set(await redis.lrange("bg:leader", 0, -1))
        assert len(leaders) == 1  # only the leader runs on_leader work
        [leader] = leaders
        # The leader stops: its leader-only work moves to the other worker.
        index = 0 if leader == b"a" else 1
        await workers[index].stop()
        other = b"b" if leader == b"a" else b"a"

        async def taken_over() -> bool:
            return other in await redis.lrange("bg:leader", -1, -1)

        await wait_until(taken_over, what="the other worker's leader runs", within=20)
        await workers[1 - index].stop()
    assert sorted(await redis.lrange("bg:hello", 0, -1)) == [b"a", b"b"]
