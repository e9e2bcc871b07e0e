"""Chaos: client connections killed at random (CLIENT KILL) while tasks count and send.

Nothing may run twice: the counter equals the INCR calls that reported success, plus at
most those that reported an unknown outcome; no event is appended twice, every event
whose send succeeded is there once, and no event whose send surely failed is there.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, cast

import pytest
import trio

from streamkit import App, OutcomeUnknown, Record, RedisUnavailable, open_redis
from streamkit.lowlevel import call_once, redis_errors, redis_statistics

if TYPE_CHECKING:
    from streamkit import Redis, Stream

CHAOS_SECONDS = 3.0
#: The kills the run goes on for, past CHAOS_SECONDS if need be.
MIN_KILLS = 60
PARTITIONS = 4


class Item(Record):
    key: str
    n: int


@pytest.mark.timeout(60)
async def test_client_kill_chaos_runs_nothing_twice(redis_url: str) -> None:
    rng = random.Random(1016)
    app = App("chaos", redis_url=redis_url)
    stream = app.stream("items", record=Item, partition_by="key", partition_count=PARTITIONS)
    incr = {"ok": 0, "unknown": 0, "failed": 0}
    sent: set[int] = set()
    send_unknown: set[int] = set()
    send_failed: set[int] = set()
    kills = 0

    async with app, open_redis(redis_url) as killer:
        redis = app.redis
        await stream.check_metadata()
        stop = trio.Event()

        async def count(use_call_once: bool) -> None:
            while not stop.is_set():
                try:
                    if use_call_once:
                        await call_once(redis.incr, "counter", what="counting")
                    else:
                        with redis_errors():
                            await redis.incr("counter")
                except OutcomeUnknown:
                    incr["unknown"] += 1
                except RedisUnavailable:
                    incr["failed"] += 1
                else:
                    incr["ok"] += 1

        async def send(first: int, batch: int) -> None:
            n = first
            while not stop.is_set():
                items = [Item(key=f"k{(n + i) % 17}", n=n + i) for i in range(batch)]
                numbers = {item.n for item in items}
                try:
                    ids = await stream.send_many(items, chunk_size=2)
                except OutcomeUnknown:
                    send_unknown.update(numbers)
                except RedisUnavailable:
                    # Surely not appended, unless part of the batch went through: a
                    # batch spans partitions, each appended (exactly once) on its own.
                    send_unknown.update(numbers)
                else:
                    assert len(ids) == len(items)
                    assert all(ids)
                    sent.update(numbers)
                n += batch

        async def read_and_cancel() -> None:
            while not stop.is_set():
                with trio.move_on_after(rng.uniform(0, 0.01)):
                    try:
                        with redis_errors():
                            await redis.xread({"idle": "$"}, count=1, block=100)
                    except RedisUnavailable:
                        pass

        async def kill_at_random() -> None:
            nonlocal kills
            me = await killer.client_id()
            # For CHAOS_SECONDS, and on until MIN_KILLS kills (a loaded machine kills
            # less often), at most four times as long.
            start = trio.current_time()
            while (now := trio.current_time() - start) < CHAOS_SECONDS or (
                kills < MIN_KILLS and now < 4 * CHAOS_SECONDS
            ):
                await trio.sleep(rng.uniform(0.002, 0.02))
                victims = [int(c["id"]) for c in await killer.client_list() if c["id"] != me]
                if victims:
                    kills += await killer.client_kill(identifier=rng.choice(victims))
            stop.set()

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(count, i % 2 == 0)
            for i in range(3):
                nursery.start_soon(send, (i + 1) * 1_000_000, 1 + i * 3)
            nursery.start_soon(read_and_cancel)
            nursery.start_soon(kill_at_random)

        stats = redis_statistics(redis)
        counter = int(await redis.get("counter") or 0)
        appended = await appended_numbers(redis, stream)

    # The killing did hit commands in flight.
    assert kills >= MIN_KILLS
    assert stats.lost >= 20, stats
    assert incr["ok"] > 100, incr
    assert len(sent) > 100, len(sent)
    # INCR: never sent twice.
    assert incr["ok"] <= counter <= incr["ok"] + incr["unknown"], (counter, incr)
    # Sends: never appended twice; a send reported as done is there.
    duplicates = {n for n in appended if appended.count(n) > 1}
    assert not duplicates
    assert sent <= set(appended)
    assert set(appended) <= sent | send_unknown | send_failed
    assert not (set(appended) & send_failed)


async def appended_numbers(redis: Redis, stream: Stream[Item]) -> list[int]:
    numbers: list[int] = []
    for key in stream.partition_keys():
        with redis_errors():
            for entry in await redis.xrange(key):
                fields = cast("dict[bytes, bytes]", dict(entry.field_values))
                numbers.append(stream.codec.decode(fields, stream=stream.name).n)
    return numbers
