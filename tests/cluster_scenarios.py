"""Helpers for the scenarios on a private local Redis Cluster (failover, resharding):
producers that keep going, and what the scenario app's workers processed."""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, cast

import attrs
import trio

from streamkit import RedisUnavailable, StreamkitError, open_redis
from streamkit.lowlevel import redis_errors
from tests.apps.scenario import SEEN, Numbered

if TYPE_CHECKING:
    from collections.abc import Mapping

    from streamkit import Redis, Stream
    from streamkit.testing import RedisServer

PARTITIONS = 8
KEYS = 8


@attrs.define
class Producer:
    """Sends one event per key and sequence number, in order, and keeps the outcome."""

    prefix: str
    replicas: int
    acknowledged: dict[tuple[str, int], float] = attrs.field(factory=dict)
    failed: set[tuple[str, int]] = attrs.field(factory=set)
    errors: list[str] = attrs.field(factory=list)
    seq: int = 0
    # When the last send returned or raised.
    answered_at: float = 0.0

    async def run(self, stream: Stream[Numbered], stop: trio.Event) -> None:
        while not stop.is_set():
            batch = [Numbered(key=f"{self.prefix}{k}", seq=self.seq) for k in range(KEYS)]
            self.seq += 1
            try:
                await stream.send_many(batch, replicas=self.replicas, replica_timeout=2)
            except StreamkitError as exc:
                # A producer goes on: these events may or may not be in the stream.
                self.answered_at = time.monotonic()
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.failed.update((e.key, e.seq) for e in batch)
                await trio.sleep(0.05)
                continue
            now = self.answered_at = time.monotonic()
            for e in batch:
                self.acknowledged[e.key, e.seq] = now
            await trio.sleep(0.01)


def replication_ports(info: Mapping[str, object]) -> list[int]:
    return [
        int(value["port"])
        for name, value in info.items()
        if str(name).startswith("slave") and isinstance(value, dict)
    ]


async def replica_of(master: RedisServer) -> int:
    async with open_redis(master.url) as redis:
        ports = replication_ports(await redis.info("replication"))
    assert len(ports) == 1, ports
    return ports[0]


async def caught_up(master: RedisServer, replica: int) -> bool:
    """Whether the replica on port ``replica`` has every write ``master`` took so far
    (its replication offset reached the master's): killing the master loses nothing."""
    async with open_redis(master.url) as redis:
        wanted = int(cast("int", (await redis.info("replication"))["master_repl_offset"]))
    async with open_redis(f"redis://127.0.0.1:{replica}") as redis:
        info = await redis.info("replication")
    return int(cast("int", info.get("slave_repl_offset", -1))) >= wanted


async def role(port: int) -> str:
    async with open_redis(f"redis://127.0.0.1:{port}") as redis:
        return (await redis.role()).role


async def stream_contents(redis: Redis, stream: Stream[Numbered]) -> set[tuple[str, int]]:
    found = set()
    for partition in range(PARTITIONS):
        for entry in await redis.xrange(stream.key(partition)):
            fields = cast("Mapping[bytes, bytes]", entry.field_values)
            record = stream.codec.decode(fields, stream=stream.name)
            found.add((record.key, record.seq))
    return found


async def processed(redis: Redis) -> list[tuple[str, int]]:
    out = []
    for item in await redis.lrange(SEEN, 0, -1):
        key, seq, _ = item.decode().split(":", 2)
        out.append((key, int(seq)))
    return out


def order_violations(seen: list[tuple[str, int]]) -> int:
    first: dict[str, list[int]] = {}
    done = set()
    for key, seq in seen:
        if (key, seq) not in done:
            done.add((key, seq))
            first.setdefault(key, []).append(seq)
    return sum(1 for seqs in first.values() for a, b in itertools.pairwise(seqs) if b < a)


async def count_processed(redis: Redis) -> int:
    """How many events the workers processed; asks again while the cluster refuses."""
    while True:
        try:
            with redis_errors():
                return await redis.llen(SEEN)
        except RedisUnavailable:  # CLUSTERDOWN, TRYAGAIN for a moment
            await trio.sleep(0.05)


async def processed_at_least(redis: Redis, n: int) -> bool:
    try:
        with redis_errors():
            return await redis.llen(SEEN) >= n
    except RedisUnavailable:
        return False


async def has_role(port: int, wanted: str) -> bool:
    try:
        return await role(port) == wanted
    except StreamkitError:
        return False


async def cluster_ok(nodes: list[RedisServer]) -> bool:
    """Whether every node in ``nodes`` says the cluster is ok."""
    for node in nodes:
        try:
            async with open_redis(node.url) as redis:
                info = await redis.cluster_info()
        except (StreamkitError, OSError):
            return False
        if info.get("cluster_state") != "ok":
            return False
    return True
