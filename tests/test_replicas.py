"""Sends that wait for replicas: ``send(..., replicas=N)`` on a primary with a real
replica, and on the cluster (each master has one replica)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, ConfigError, NotReplicated, open_redis
from streamkit._idempotent import _APPEND, MARKER_TTL, marker_key
from streamkit._keys import stream_key
from streamkit._redis import replicated
from streamkit.lowlevel import redis_errors
from streamkit.testing import RedisServer, free_port, wait_until
from tests.consume import PARTITIONS, Tick, ticks_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Redis

pytestmark = pytest.mark.timeout(60)


async def _replicas_up(redis: Redis, count: int) -> bool:
    info = await redis.info("replication")
    return info.get("connected_slaves") == count and all(
        isinstance(value, dict) and value.get("state") == "online"
        for name, value in info.items()
        if str(name).startswith("slave")
    )


async def _link_up(replica: Redis) -> bool:
    info = await replica.info("replication")
    return info.get("master_link_status") == "up"


async def _acknowledges(redis: Redis) -> bool:
    with replicated(redis, 1, 0.1):
        try:
            with redis_errors():
                await redis.set("probe", "1")
        except NotReplicated:
            return False
    return True


@pytest.fixture
async def primary() -> AsyncIterator[tuple[RedisServer, RedisServer]]:
    """A primary and one replica of it, replication up."""
    async with trio.open_nursery() as nursery:
        # The replica syncs at once (by default the primary waits 5 s for more).
        main: RedisServer = await nursery.start(
            RedisServer(extra_args=["--repl-diskless-sync-delay", "0"]).run
        )
        replica: RedisServer = await nursery.start(
            RedisServer(extra_args=["--replicaof", "127.0.0.1", str(main.port)]).run
        )
        async with open_redis(main.url) as redis, open_redis(replica.url) as follower:
            await wait_until(lambda: _replicas_up(redis, 1), what="replica online", within=10)
            # Loaded what it was sent, so it acknowledges what comes next.
            await wait_until(lambda: _link_up(follower), what="replica link up", within=10)
            # Right after the link is up, a replica may not acknowledge for a moment.
            await wait_until(lambda: _acknowledges(redis), what="replica acknowledging", within=10)
        yield main, replica
        nursery.cancel_scope.cancel()


async def test_a_send_waits_for_the_replica(primary: tuple[RedisServer, RedisServer]) -> None:
    main, replica = primary
    async with App("shop", redis_url=main.url) as app, open_redis(replica.url) as follower:
        ticks = app.stream("ticks", record=Tick, partition_by="key", partition_count=PARTITIONS)
        records = [t for p in range(PARTITIONS) for t in ticks_for(p, range(50))]
        ids = await ticks.send_many(records, chunk_size=7, replicas=1)
        assert len(ids) == len(records)
        # Acknowledged by the replica: there already, without waiting.
        lengths = [await follower.xlen(ticks.key(p)) for p in range(PARTITIONS)]
        assert lengths == [50] * PARTITIONS
        [one] = await ticks.send(Tick(n=99, key="a"), replicas=1, replica_timeout=2)
        assert await follower.xrange(ticks.key(ticks.partition_of(Tick(n=0, key="a"))), one, one)


async def test_too_few_replicas_raise_with_the_count_reached(
    primary: tuple[RedisServer, RedisServer],
) -> None:
    main, _ = primary
    async with App("shop", redis_url=main.url) as app:
        ticks = app.stream("ticks", record=Tick, partition_by="key", partition_count=PARTITIONS)
        await ticks.send(*ticks_for(0, range(3)), replicas=1, replica_timeout=5)
        with trio.fail_after(5), pytest.raises(NotReplicated) as caught:
            await ticks.send(*ticks_for(0, range(3, 6)), replicas=2, replica_timeout=0.5)
        assert (caught.value.wanted, caught.value.acknowledged) == (2, 1)
        assert caught.value.timeout == pytest.approx(0.5)
        assert "only 1 of 2 replicas" in str(caught.value)
        # The write ran on the master.
        assert await app.redis.xlen(ticks.key(0)) == 6
        # The client goes on as before: plain sends do not wait.
        await ticks.send(*ticks_for(0, range(6, 8)))
        assert await app.redis.xlen(ticks.key(0)) == 8


async def test_a_lost_replica_fails_the_send_after_the_timeout(
    primary: tuple[RedisServer, RedisServer],
) -> None:
    main, replica = primary
    async with App("shop", redis_url=main.url) as app:
        ticks = app.stream("ticks", record=Tick, partition_by="key", partition_count=PARTITIONS)
        await ticks.send(*ticks_for(1, range(3)), replicas=1)
        replica.stop()
        await wait_until(lambda: _replicas_up(app.redis, 0), what="replica gone", within=10)
        with trio.fail_after(5), pytest.raises(NotReplicated) as caught:
            await ticks.send(*ticks_for(1, range(3, 6)), replicas=1, replica_timeout=0.2)
        assert caught.value.acknowledged == 0


async def test_a_wait_refused_by_a_node_turned_replica_is_too_few_replicas(
    private_redis: RedisServer,
) -> None:
    """A node that became a replica between a command and its ``WAIT`` (a failover on a
    cluster; the relay of emitted records met it in ``tests/test_cluster_failover.py``)
    refuses the ``WAIT``: that is :class:`NotReplicated` with none counted (the command
    ran; no replica is known to have it), which the relay retries, not a
    :class:`~streamkit.BackendError` that stopped the worker."""
    async with open_redis(private_redis.url) as redis:
        await redis.replicaof("127.0.0.1", free_port())
        try:
            with replicated(redis, 1, 0.5), pytest.raises(NotReplicated) as caught, redis_errors():
                # A script that writes nothing runs on a replica; the WAIT after it not.
                await redis.eval("#!lua flags=no-writes\nreturn 1", [], [])
        finally:
            await redis.replicaof("no", "one")
    assert (caught.value.wanted, caught.value.acknowledged) == (1, 0)


async def test_replica_options_are_checked(redis_url: str) -> None:
    async with App("shop", redis_url=redis_url) as app:
        ticks = app.stream("ticks", record=Tick, partition_by="key", partition_count=PARTITIONS)
        with pytest.raises(ConfigError, match="replicas"):
            await ticks.send(Tick(n=1, key="a"), replicas=-1)
        with pytest.raises(ConfigError, match="replica_timeout"):
            await ticks.send(Tick(n=1, key="a"), replicas=1, replica_timeout=0)


@pytest.mark.cluster
async def test_a_send_waits_for_each_partitions_replica_on_the_cluster(
    redis_cluster_url: str,
) -> None:
    async with App("shop", redis_url=redis_cluster_url) as app:
        # Enough partitions to reach every master.
        ticks = app.stream("ticks", record=Tick, partition_by="key", partition_count=12)
        records = [Tick(n=n, key=f"k{n % 40}") for n in range(400)]
        with trio.fail_after(10):
            ids = await ticks.send_many(records, chunk_size=5, replicas=1)
        assert len(ids) == 400
        with trio.fail_after(5), pytest.raises(NotReplicated) as caught:
            await ticks.send(Tick(n=1, key="a"), replicas=2, replica_timeout=0.5)
        assert (caught.value.wanted, caught.value.acknowledged) == (2, 1)
        total = sum([await app.redis.xlen(ticks.key(p)) for p in range(12)])
        assert total == 401


async def test_a_resent_append_waits_for_the_replicas_too(
    primary: tuple[RedisServer, RedisServer],
) -> None:
    """An append sent again after a lost reply finds its marker and appends nothing, on
    a connection of its own; with replicas=1 it still waits for the replica (the script
    refreshes the marker, a write, so the connection has a write to wait for)."""
    main, replica = primary
    script = _APPEND
    key = stream_key("app", "s", 0)
    keys = [key, marker_key(key, "lost-reply")]
    args: list[Any] = [1000, 0, MARKER_TTL, 0, 1, b"f", b"v"]
    async with open_redis(main.url) as first:
        await script(first, keys=keys, args=args)
    replica.pause()
    try:
        args[3] = 1  # a retry
        async with open_redis(main.url) as again:
            with (
                trio.fail_after(5),
                pytest.raises(NotReplicated) as caught,
                replicated(again, 1, 0.3),
                redis_errors(),
            ):
                await script(again, keys=keys, args=args)
            assert caught.value.acknowledged == 0
            assert await again.xlen(key) == 1
    finally:
        replica.resume()
