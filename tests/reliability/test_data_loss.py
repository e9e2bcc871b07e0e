"""Redis loses its data under running workers (FLUSHALL; a restart without persistence):
each worker says so once per processor, at ERROR, instead of a warning per partition,
counts it in a metric, and ``streamkit status`` shows it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from streamkit import open_redis
from streamkit.testing import RedisServer, free_port, wait_until
from tests.apps.lossy import make_app
from tests.scrape import scrape
from tests.test_cli import streamkit
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from tests.workers import WorkerProcess

APP = "tests.apps.lossy:app"
PROCESSORS = ("count", "watch")
LOSS = re.compile(r"ERROR .*processor (\w+): Redis lost its data")
# What a worker said per partition before: none of it at WARNING now.
PER_PARTITION = ("lease on", "stopped fetching", "vanished", "rejoining", "no longer in")


def orders(customers: int, start: int) -> list[Any]:
    _, stream, _ = make_app()
    record = stream.spec.record
    return [record(order_id=start + i, customer=f"c{i % customers}") for i in range(customers * 5)]


def losses(worker: WorkerProcess) -> list[str]:
    return LOSS.findall(worker.log())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["flushall", "restart"])
async def test_lost_data_is_said_once_per_processor(
    how: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    async with trio.open_nursery() as nursery:
        server: RedisServer = await nursery.start(RedisServer(appendonly=False).run)
        url = server.url
        app, stream, tally = make_app(redis_url=url)
        ports = [free_port(), free_port()]
        async with open_redis(url) as redis, app:
            await stream.send_many(orders(8, 0))
            workers.extend(
                start_worker(url, tmp_path, app=APP, env={"STREAMKIT_METRICS_PORT": str(port)})
                for port in ports
            )
            for processor in PROCESSORS:  # both ran before the loss, in both workers
                await wait_members(redis, 2, group=f"lossy.orders.{processor}")

            async def counted(n: int) -> bool:
                return sum(await tally.read_many([f"c{i}" for i in range(8)])) == n

            await wait_until(lambda: counted(40), what="the first orders counted", within=30)

            if how == "flushall":
                await redis.flushall()
            else:
                server.stop()  # SIGKILL, no persistence: it comes back empty
                await trio.to_thread.run_sync(server.start)
            await stream.send_many(orders(8, 1000))
            # Processing goes on; what was counted before the loss is gone.
            await wait_until(lambda: counted(40), what="the new orders counted", within=40)

            async def said() -> bool:
                return all(sorted(losses(w)) == sorted(PROCESSORS) for w in workers)

            await wait_until(said, what="each worker's data loss lines", within=30)
            for worker in workers:
                lines = worker.log().splitlines()
                warned = [
                    line
                    for line in lines
                    if " WARNING " in line and any(w in line for w in PER_PARTITION)
                ]
                assert warned == [], worker.log()
                assert "Traceback" not in worker.log(), worker.log()
            for port in ports:
                metrics = await scrape(f"http://127.0.0.1:{port}/metrics")
                for processor in PROCESSORS:
                    assert metrics.total("streamkit_data_loss_total", processor=processor) == 1

        status = await streamkit("status", APP, "--json", redis_url=url)
        assert status.code == 0, status.err
        for processor in orjson.loads(status.out)["processors"]:
            assert processor["data_loss"] is not None, processor
            what = processor["data_loss"]["what"]
            assert "consumer group" in what or "metadata" in what, what
        text = await streamkit("status", APP, redis_url=url)
        assert "DATA LOSS" in text.out, text.out
        assert "may have lost updates" in " ".join(text.out.split()), text.out
        nursery.cancel_scope.cancel()
