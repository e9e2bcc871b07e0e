"""Redis's passing refusals (OOM, READONLY, BUSY, ...) are outages, not crashes.

Each test runs against a private server of its own, driven into the refusing state for
real: ``maxmemory`` reached under ``noeviction``, a replica, a long script.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import coredis.exceptions
import pytest
import redis.exceptions
import trio

from streamkit import (
    App,
    Record,
    RedisUnavailable,
    ServerRefused,
    open_lock_manager,
    open_membership,
    open_redis,
)
from streamkit._membership_state import membership_keys
from streamkit._redis import LuaScript, as_unavailable
from streamkit._refusals import code_types
from streamkit.lowlevel import redis_errors
from streamkit.testing import RedisServer, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Redis


class Order(Record):
    key: str
    n: int


@pytest.fixture
async def server() -> AsyncIterator[RedisServer]:
    async with trio.open_nursery() as nursery:
        started: RedisServer = await nursery.start(RedisServer().run)
        yield started
        nursery.cancel_scope.cancel()


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[Redis]:
    async with open_redis(server.url) as redis:
        yield redis


async def fill(redis: Redis) -> None:
    """Make the server refuse every command that may grow memory (OOM)."""
    await redis.config_set({"maxmemory-policy": "noeviction", "maxmemory": 1})


async def free(redis: Redis) -> None:
    await redis.config_set({"maxmemory": 0})


async def test_out_of_memory_is_a_refusal_naming_the_server_and_what_to_do(
    server: RedisServer, client: Redis
) -> None:
    with trio.fail_after(10):
        await client.set("k", "v")
        await fill(client)
        with pytest.raises(ServerRefused) as caught, redis_errors(server.url):
            await client.set("k", "w")
        refused = caught.value
        assert isinstance(refused, RedisUnavailable)
        assert refused.code == "OOM"
        assert refused.out_of_memory
        message = str(refused)
        assert message.startswith(f"Redis at {server.url} refused the command: out of memory")
        assert "maxmemory" in refused.hint
        assert refused.hint in message

        # Inside a script, in a transaction: the same refusal.
        script = LuaScript("return redis.call('SET', KEYS[1], 'x')")
        with pytest.raises(ServerRefused, match="out of memory"), redis_errors(server.url):
            await script(client, keys=["k"], args=[])
        with pytest.raises(ServerRefused, match="out of memory"), redis_errors(server.url):
            async with client.pipeline(transaction=True) as pipe:
                pipe.set("k", "y")

        # A processor's own command (not translated) counts as Redis unavailable.
        with pytest.raises(coredis.exceptions.ResponseError) as raw:
            await client.rpush("list", ["x"])
        assert isinstance(as_unavailable(raw.value, server.url), ServerRefused)

        await free(client)
        with redis_errors(server.url):
            await client.set("k", "z")


async def test_a_replica_refuses_writes_as_read_only(server: RedisServer, client: Redis) -> None:
    async with trio.open_nursery() as nursery:
        replica: RedisServer = await nursery.start(RedisServer().run)
        async with open_redis(replica.url) as follower:
            with trio.fail_after(10):
                await follower.replicaof("127.0.0.1", server.port)
                with pytest.raises(ServerRefused) as caught, redis_errors(replica.url):
                    await follower.set("k", "v")
                assert caught.value.code == "READONLY"
                assert "primary" in str(caught.value)
        nursery.cancel_scope.cancel()


async def test_a_busy_script_is_a_refusal(server: RedisServer, client: Redis) -> None:
    await client.config_set({"busy-reply-threshold": 50})
    spin = "local t = redis.call('TIME')[1] while redis.call('TIME')[1] - t < 5 do end"
    async with trio.open_nursery() as nursery, open_redis(server.url) as other:

        async def run_long_script() -> None:
            # Ends in an error once killed below (coredis may report it as a lost
            # connection): which one does not matter here.
            with pytest.raises(coredis.exceptions.RedisError):
                await other.eval(spin, keys=[], args=[])

        nursery.start_soon(run_long_script)
        refusals: list[ServerRefused] = []

        async def refused() -> bool:
            try:
                with redis_errors(server.url):
                    await client.get("k")
            except ServerRefused as exc:
                refusals.append(exc)
                return True
            return False

        await wait_until(refused, what="BUSY", within=5)
        assert refusals[0].code == "BUSY"
        assert "SCRIPT KILL" in str(refusals[0])
        with trio.fail_after(5):
            await client.script_kill()


async def test_a_lock_can_be_taken_and_kept_while_redis_is_out_of_memory(client: Redis) -> None:
    with trio.fail_after(10):
        async with open_lock_manager(client) as locks:
            held = await locks.acquire("before", ttl=1)
            await fill(client)
            # Taking a new lock (a partition of a dead worker, say) works when full...
            taken = await locks.acquire("after", ttl=1)
            # ...and so does keeping one.
            extended = await locks.extend(held)
            assert extended.token == held.token
            await locks.release(taken)


async def test_a_member_joins_a_full_redis_once_it_accepts_and_keeps_beating_meanwhile(
    client: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    joined = trio.Event()
    with trio.fail_after(15):
        async with open_membership(
            client, "g", partitions=4, heartbeat_interval=0.05, session_timeout=0.5
        ) as first:
            await fill(client)

            async def second_member() -> None:
                async with open_membership(
                    client, "g", partitions=4, heartbeat_interval=0.05, session_timeout=0.5
                ) as second:
                    joined.set()
                    await second.assignment.wait_value(lambda a: len(a.members) == 2)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(second_member)
                # Refused for far longer than session_timeout: the newcomer waits
                # (saying so) instead of giving up; the first member's heartbeats go on.
                await wait_until(
                    lambda: any(
                        "joining membership group" in r.getMessage() for r in caplog.records
                    ),
                    what="a warning about the refused join",
                    within=5,
                )
                await trio.sleep(1.5)  # three session timeouts: the fault's duration
                assert not joined.is_set()
                beat = membership_keys("g").heartbeat(first.id)
                assert await client.pttl(beat) > 0
                await free(client)
                with trio.fail_after(5):
                    await joined.wait()
            assert first.connected.value
    refusal = next(r for r in caplog.records if "joining membership group" in r.getMessage())
    assert "out of memory" in refusal.getMessage()


async def test_send_under_out_of_memory_fails_at_once_and_appends_nothing(
    server: RedisServer, client: Redis
) -> None:
    async with App("shop", redis_url=server.url) as app:
        # One partition: how send_many reports refusals of several partitions at once
        # is the business of its own tests.
        orders = app.stream("orders", record=Order, partition_by="key", partition_count=1)
        await orders.send(Order(key="a", n=0))
        await orders.send(Order(key="a", n=1))  # leaves a finished marker to delete
        await fill(client)
        with trio.fail_after(1):  # no seconds of retries
            with pytest.raises(ServerRefused) as caught:
                await orders.send_many([Order(key=f"k{i}", n=i) for i in range(20)])
        assert caught.value.out_of_memory
        assert await client.xlen(orders.key(0)) == 2
        with trio.fail_after(1), pytest.raises(ServerRefused):
            await orders.send(Order(key="b", n=1))
        await free(client)
        with trio.fail_after(5):
            await orders.send_many([Order(key=f"k{i}", n=i) for i in range(20)])
        assert await client.xlen(orders.key(0)) == 22


def test_each_client_library_says_its_refusal_codes_by_the_types_it_has() -> None:
    # One table of type names serves coredis and redis-py: a type a library renames
    # would drop out of it silently, so the tables are pinned here (subclasses first).
    assert code_types(coredis.exceptions) == (
        (coredis.exceptions.BusyLoadingError, "LOADING"),
        (coredis.exceptions.ReadOnlyError, "READONLY"),
        (coredis.exceptions.TryAgainError, "TRYAGAIN"),
        (coredis.exceptions.ClusterDownError, "CLUSTERDOWN"),
        (coredis.exceptions.UnblockedError, "UNBLOCKED"),
        (coredis.exceptions.MovedError, "MOVED"),
        (coredis.exceptions.AskError, "ASK"),
    )
    assert code_types(redis.exceptions) == (
        (redis.exceptions.OutOfMemoryError, "OOM"),
        (redis.exceptions.BusyLoadingError, "LOADING"),
        (redis.exceptions.ReadOnlyError, "READONLY"),
        (redis.exceptions.MasterDownError, "MASTERDOWN"),
        (redis.exceptions.TryAgainError, "TRYAGAIN"),
        (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
        (redis.exceptions.MovedError, "MOVED"),
        (redis.exceptions.AskError, "ASK"),
    )
