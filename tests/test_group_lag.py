"""A consumer group's lag (streamkit._group_lag), as ``streamkit status`` and the
metrics show it: right after a restart of Redis from its AOF, which leaves Redis 7.0's
own ``lag`` wrong for good, and counted up to a limit on a plain server."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import orjson

from streamkit import open_redis
from streamkit._group_lag import entry_id_order, undelivered
from streamkit.metrics._readings import read_groups
from streamkit.testing import wait_until
from tests.apps.scenario import SEEN, make_app
from tests.scenarios import numbered_events
from tests.test_cli import streamkit
from tests.workers import SCENARIO_GROUP, start_worker

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

APP = "tests.apps.scenario:app"


async def status(url: str) -> dict[str, Any]:
    result = await streamkit("status", APP, "--json", redis_url=url)
    assert result.code == 0, result.err
    document: dict[str, Any] = orjson.loads(result.out)
    [processor] = document["processors"]
    assert isinstance(processor, dict)
    return processor


def lags(processor: dict[str, Any]) -> list[int | None]:
    return [p["lag"] for p in processor["partitions"]]


async def group_fields(redis: Redis, key: str) -> dict[str, Any]:
    [info] = await redis.xinfo_groups(key)
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}


async def test_a_processed_partition_has_no_lag_after_a_restart_from_the_aof(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    url = private_redis.url
    app, stream = make_app(redis_url=url)
    sent = numbered_events(keys=1, per_key=5)  # one partition: 5 events
    async with app:
        await stream.send_many(sent)
    [partition] = {stream.partition_of(e) for e in sent}
    key = stream.key(partition)
    worker = start_worker(url, tmp_path)
    workers.append(worker)
    async with open_redis(url) as redis:

        async def processed() -> bool:
            return await redis.llen(SEEN) == len(sent) and (await status(url))["lag"] == 0

        await wait_until(processed, what="the 5 events processed", within=30)
        worker.send_signal(signal.SIGTERM)
        assert await worker.wait_exit() == 0, worker.log()
    private_redis.stop()  # every write is in the AOF (appendfsync always)
    private_redis.start()

    async with open_redis(url) as redis:
        info = await group_fields(redis, key)
        newest = (await redis.xrevrange(key, count=1))[0].identifier
        # What Redis says after the reload: nothing pending, every entry delivered,
        # and yet, on Redis 7.0, a lag of every entry (its entries-read back at 0).
        assert info["pending"] == 0
        assert entry_id_order(info["last-delivered-id"]) == entry_id_order(newest)
        after_restart = await status(url)
        readings = await read_groups(redis, [key], SCENARIO_GROUP)
        # Sent after the restart, with no worker: those three are the lag.
        await stream_again(url, 3)
        behind = await status(url)
        readings_behind = await read_groups(redis, [key], SCENARIO_GROUP)

    assert after_restart["lag"] == 0
    assert lags(after_restart) == [0] * stream.partition_count
    assert [(r.lag, r.pending) for r in readings if r is not None] == [(0, 0)]
    assert behind["lag"] == 3
    assert lags(behind)[partition] == 3
    assert [(r.lag, r.pending) for r in readings_behind if r is not None] == [(3, 0)]


async def stream_again(url: str, count: int) -> None:
    app, stream = make_app(redis_url=url)
    async with app:
        await stream.send_many(numbered_events(keys=1, per_key=count))


async def test_the_lag_is_counted_up_to_the_limit_then_is_redis_own(redis: Redis) -> None:
    key = "s"
    for n in range(10):
        await redis.xadd(key, {"n": str(n)})
    await redis.xgroup_create(key, "g", "0")
    newest = (await redis.xrevrange(key, count=1))[0].identifier
    await redis.xreadgroup("g", "c", streams={key: ">"}, count=4)
    info = await group_fields(redis, key)

    async def lag(fields: dict[str, Any], limit: int) -> int | None:
        return await undelivered(redis, key, fields, newest=newest, length=10, limit=limit)

    assert await lag(info, 100) == 6  # counted
    assert await lag({**info, "lag": 99}, 100) == 6  # counted, whatever Redis says
    assert await lag(info, 5) == 6  # past the limit: Redis's own, at least the limit
    assert await lag({**info, "lag": 4}, 5) is None  # Redis's is less than counted
    assert await lag({**info, "lag": None}, 5) is None  # Redis cannot tell
    assert await lag({**info, "lag": 50}, 5) == 10  # never more than the stream holds
    # Caught up, or an empty stream: no lag, and no count.
    assert await lag({**info, "last-delivered-id": newest, "lag": 10}, 5) == 0
    assert await undelivered(redis, key, info, newest=None, length=0) == 0
