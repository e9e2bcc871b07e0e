"""The receipts example under real workers, through a kill -9: one receipt job per order,
each sent, and one ``receipts_sent`` record per order."""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from examples.receipts.app import Order, ReceiptSent, spent
from streamkit import App, ProcessorKeys
from streamkit.jobs._layout import ShardKeys
from streamkit.lowlevel import redis_errors
from streamkit.testing import wait_until
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

APP = "examples.receipts.app:app"
GROUP = ProcessorKeys(app="receipts", stream="orders", processor="take_orders").group


@pytest.mark.timeout(90)
async def test_one_receipt_per_order_through_a_kill(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    rng = random.Random(3)
    sent: list[Order] = []
    env = {"STREAMKIT_REDIS_URL": redis_url}
    shard = ShardKeys("receipts", 0)  # the app's queue, one shard
    producer = App("receipts", redis_url=redis_url)
    orders = producer.stream("orders", record=Order, partition_by="customer", partition_count=8)
    sent_stream = producer.stream("receipts_sent", record=ReceiptSent, partition_by="customer")
    async with producer:
        first = start_worker(redis_url, tmp_path, app=APP, env=env)
        workers.append(first)
        workers.append(start_worker(redis_url, tmp_path, app=APP, env=env))
        await wait_members(redis, 2, group=GROUP)
        for batch in range(20):
            chunk = [
                Order(order_id=len(sent) + i, customer=f"c{rng.randrange(50)}", amount=1.0)
                for i in range(50)
            ]
            await orders.send_many(chunk)
            sent.extend(chunk)
            if batch == 8:
                first.kill()  # kill -9 mid-processing: the other takes its partitions
            await trio.sleep(0.02)
        counts_key = shard.counts

        async def all_sent() -> bool:
            with redis_errors():
                counters: Any = await redis.hgetall(counts_key)
            return int(counters.get(b"success|send_receipt", 0)) >= len(sent)

        await wait_until(all_sent, what="every receipt sent", within=60, interval=0.2)
        with redis_errors():
            counters = await redis.hgetall(counts_key)
        assert {k: int(v) for k, v in counters.items() if int(v)} == {
            b"success|send_receipt": len(sent)
        }
        customers = sorted({o.customer for o in sent})
        assert sum(await spent.read_many(customers, redis=redis)) == len(sent)
        base = shard.base
        receipts: Counter[int] = Counter()
        async for key in redis.scan_iter(match=f"{base}:job:*"):
            args: Any = await redis.hget(key, "args")
            receipts[orjson.loads(args)[0][0]] += 1
        assert receipts == Counter(o.order_id for o in sent)
        announced: Counter[int] = Counter()
        for partition in range(sent_stream.partition_count):
            entries: Any = await redis.xrange(sent_stream.key(partition))
            for entry in entries:
                record = sent_stream.codec.decode(entry.field_values, stream="receipts_sent")
                announced[record.order_id] += 1
        assert announced == Counter(o.order_id for o in sent)
