"""Slots moved with ``redis-cli --cluster reshard`` while workers process and a
producer sends, on a private local Redis Cluster.

Node 0 serves slots 0-5460, among them those of partitions 0 (slot 3234) and 4 (slot
3110) of the scenario stream. 3300 of its slots (``redis-cli`` takes them from the
start: 0-3299) move to node 1, key by key (``MIGRATE``), while two workers
consume and a producer sends: commands meet ``ASK`` (a key already moved),
``TRYAGAIN`` (a script whose keys are split between the nodes for a moment) and, once
a slot has moved, ``MOVED``.

Expectation, written before the first run: nothing is lost (every event whose send
returned is processed), per-key order holds, duplicates are allowed (counted); the
workers and the producer go on without restarting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from streamkit import App, open_redis
from streamkit.testing import RedisCluster, wait_until
from tests.apps.scenario import Numbered
from tests.cluster_scenarios import (
    PARTITIONS,
    Producer,
    count_processed,
    order_violations,
    processed,
    processed_at_least,
    stream_contents,
)
from tests.workers import start_worker

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

MOVED_SLOTS = 3300
# The slots of partitions 0 and 4, among those moved.
PARTITION_SLOTS = (3234, 3110)


async def node_id(node: RedisServer) -> str:
    async with open_redis(node.url) as redis:
        return str((await redis.cluster_myid()).decode())


async def reshard(cluster: RedisCluster, source: RedisServer, target: RedisServer) -> None:
    args = [
        "redis-cli", "--cluster", "reshard", f"127.0.0.1:{source.port}",
        "--cluster-from", await node_id(source),
        "--cluster-to", await node_id(target),
        "--cluster-slots", str(MOVED_SLOTS),
        "--cluster-yes",
    ]  # fmt: skip
    with trio.fail_after(60):
        done = await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()[-2000:]


async def test_workers_and_a_producer_ride_out_a_resharding(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    async with trio.open_nursery() as nursery:
        cluster: RedisCluster = await nursery.start(RedisCluster().run)
        nodes = cluster.nodes
        env = {"SCENARIO_PARTITIONS": str(PARTITIONS), "SCENARIO_BATCH": "20"}
        workers.extend(start_worker(cluster.url, tmp_path, env=env) for _ in range(2))
        app = App("scenario", redis_url=cluster.url)
        stream = app.stream(
            "numbered", record=Numbered, partition_by="key", partition_count=PARTITIONS
        )
        producer = Producer("k", replicas=0)
        stop = trio.Event()
        async with app:
            redis = app.redis
            async with trio.open_nursery() as producers:
                producers.start_soon(producer.run, stream, stop)
                await wait_until(
                    lambda: processed_at_least(redis, 300), what="300 processed", within=60
                )
                await reshard(cluster, nodes[0], nodes[1])
                count = await count_processed(redis)
                await wait_until(
                    lambda: processed_at_least(redis, count + 300),
                    what="progress after moving slots to node 1",
                    within=30,
                )
                async with open_redis(nodes[1].url) as target:
                    for slot in PARTITION_SLOTS:
                        # The partition's stream, its lock, ... moved.
                        assert await target.cluster_countkeysinslot(slot) > 0
                stop.set()

            acknowledged = set(producer.acknowledged)

            async def all_processed() -> bool:
                return acknowledged <= set(await processed(redis))

            await wait_until(all_processed, what="every sent event processed", within=60)
            in_streams = await stream_contents(redis, stream)
            seen = await processed(redis)

        for worker in workers:
            assert worker.process.poll() is None, worker.log()
        nursery.cancel_scope.cancel()

    report = (
        f"{len(acknowledged)} acknowledged, {len(producer.failed)} failed "
        f"({sorted(set(producer.errors))[:3]}); in streams: {len(in_streams)}; "
        f"duplicated: {len(seen) - len(set(seen))}; order violations: {order_violations(seen)}"
    )
    print(report)
    assert acknowledged <= in_streams, report
    assert order_violations(seen) == 0, report
