"""How a stream's partitions spread over the masters of a Redis Cluster.

Each partition has a hash tag of its own (``{app.stream.N}``), so its slot is the CRC16
of that tag: the partitions of one stream land on slots all over the 16384, and so on
every master. With the default 16 partitions and 3 masters sharing the slots evenly
(as ``redis-cli --cluster create`` splits them), every master serves at least 3 and at
most 10 of them, whatever the app's and the stream's names (checked below for 2000
names; 100000 random names gave the same bounds, see ``docs/redis.md``).
"""

from __future__ import annotations

import random
import string
from typing import TYPE_CHECKING

import pytest
import trio
from attrs import frozen

from streamkit import App, open_redis
from streamkit._defaults import DEFAULT_PARTITION_COUNT
from streamkit._keys import stream_key
from streamkit._redis import key_slot
from streamkit._wire import text

if TYPE_CHECKING:
    from streamkit.testing import RedisCluster

pytestmark = pytest.mark.timeout(60)

# The slots of each of 3 masters, as `redis-cli --cluster create` assigns them.
EVEN_THIRDS = ((0, 5460), (5461, 10922), (10923, 16383))


@frozen
class Reading:
    n: int


def per_master(slots: list[int], ranges: tuple[tuple[int, int], ...]) -> list[int]:
    counts = [0] * len(ranges)
    for slot in slots:
        counts[next(i for i, (low, high) in enumerate(ranges) if low <= slot <= high)] += 1
    return counts


async def test_the_partitions_of_a_stream_spread_over_every_master(
    redis_cluster: RedisCluster, redis_cluster_url: str
) -> None:
    with trio.fail_after(30):
        async with App("shop", redis_url=redis_cluster_url) as app:
            stream = app.stream("readings", record=Reading, partition_by="n")
            assert stream.partition_count == DEFAULT_PARTITION_COUNT
            keys = stream.partition_keys()
            slots = [await app.redis.cluster_keyslot(key) for key in keys]
            # Our slot arithmetic is the cluster's.
            assert slots == [key_slot(key) for key in keys]
            # One record to each partition: count the partitions each master holds.
            await stream.send_many([Reading(n) for n in range(256)])
            assert {text(k) for k in await app.redis.keys("__strm:*")} == set(keys)
        counts = []
        for node in redis_cluster.nodes:
            async with open_redis(node.url) as client:
                if (await client.role()).role == "master":
                    counts.append(len(await client.keys("__strm:*")))
        assert len(counts) == 3
        assert sum(counts) == DEFAULT_PARTITION_COUNT
        assert min(counts) >= 3, counts


@pytest.mark.parametrize(("partitions", "low", "high"), [(8, 2, 4), (16, 3, 10)])
def test_every_master_serves_some_partitions_whatever_the_names(
    partitions: int, low: int, high: int
) -> None:
    rng = random.Random(14)
    alphabet = string.ascii_letters + string.digits + "_-"
    for _ in range(2000):
        app = "".join(rng.choices(alphabet, k=rng.randint(1, 16)))
        name = "".join(rng.choices(alphabet, k=rng.randint(1, 16)))
        slots = [key_slot(stream_key(app, name, p)) for p in range(partitions)]
        counts = per_master(slots, EVEN_THIRDS)
        assert min(counts) >= low, (app, name, counts)
        assert max(counts) <= high, (app, name, counts)
