"""Cancelling Redis commands: no pool slot leaks, no unrelated command fails or runs twice.

coredis 6.9 keeps a pool slot for every cancelled blocking read (after 64 the client
hangs for good) and drops the connection the read shared with other tasks' commands,
which then fail, or are sent again by its default retry policy although Redis had run
them. A client from ``open_redis`` runs blocking commands on dedicated connections and
gives every slot back (see ``streamkit/_redis/_pool.py`` and ``docs/redis.md``).
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, cast

import pytest
import trio
import trio.lowlevel
import trio.testing

from streamkit.lowlevel import redis_errors, redis_statistics
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis

ROUNDS = 1_000
# A Lua script that increments, then keeps the server busy for 300 ms.
SLOW_INCR = """
local n = redis.call('INCR', KEYS[1])
local t0 = redis.call('TIME')
repeat
  local t = redis.call('TIME')
until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 300000
return n
"""


async def info_int(redis: Redis, section: str, field: str) -> int:
    info = await redis.info(section)
    return int(str(info[field]))


async def wait_blocked_clients(redis: Redis, count: int) -> None:
    """Wait until the server counts exactly ``count`` clients blocked in a command."""

    async def blocked() -> bool:
        return await info_int(redis, "clients", "blocked_clients") == count

    await wait_until(blocked, what=f"{count} blocked clients", within=5, interval=0.001)


@pytest.mark.timeout(60)
async def test_the_issue_example_answers_ping_every_round(redis: Redis) -> None:
    # The issue's loop, 100 rounds: with coredis's pool, PING never answers from round 63.
    for _ in range(100):
        with trio.move_on_after(0.005):
            await redis.xread({"some-stream": "$"}, count=1, block=1000)
        with trio.fail_after(3):
            assert await redis.ping() == b"PONG"


@pytest.mark.timeout(60)
async def test_a_thousand_cancelled_blocking_reads_leak_nothing(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """1,000 blocking reads cancelled at once, while connecting, or mid-block (as the
    server reports), while other tasks run commands, some of them cancelled too."""
    rng = random.Random(16)
    done = trio.Event()
    counted = {"incr": 0, "reads": 0, "pipelines": 0}
    kinds = {"at once": 0, "while sending": 0, "mid-block": 0}

    async def incr_forever() -> None:
        # Never cancelled: each INCR must succeed, and run exactly once.
        while not done.is_set():
            with redis_errors():
                await redis.incr("incr-counter")
            counted["incr"] += 1
            await trio.lowlevel.checkpoint()

    async def reads_and_scripts_forever() -> None:
        while not done.is_set():
            with redis_errors():
                await redis.set("k", "v")
                assert await redis.get("k") == b"v"
                assert await redis.eval("return 7", keys=["k"]) == 7
            counted["reads"] += 1

    async def cancelled_commands_forever() -> None:
        # Simple commands and pipelines cancelled at random points.
        while not done.is_set():
            with trio.move_on_after(rng.uniform(0, 0.002)):
                await redis.incrby("cancelled", 1)
            with trio.move_on_after(rng.uniform(0, 0.002)):
                async with redis.pipeline(transaction=False) as pipe:
                    pipe.incr("pipelined")
                    pipe.get("pipelined")
                counted["pipelines"] += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(incr_forever)
        nursery.start_soon(reads_and_scripts_forever)
        nursery.start_soon(cancelled_commands_forever)
        for i in range(ROUNDS):
            kind = ("at once", "while sending", "mid-block")[i % 3]
            kinds[kind] += 1
            if kind == "at once":
                with trio.CancelScope() as scope:
                    scope.cancel()
                    await redis.xread({"idle": "$"}, count=1, block=1000)
            elif kind == "while sending":
                with trio.move_on_after(rng.uniform(0, 0.001)):
                    await redis.xread({"idle": "$"}, count=1, block=1000)
            else:
                # Cancel only once the server reports the read blocked on it.
                await wait_blocked_clients(redis, 0)
                async with trio.open_nursery() as reader:

                    async def read() -> None:
                        await redis.xread({"idle": "$"}, count=1, block=5000)
                        raise AssertionError("nothing was written to 'idle'")

                    reader.start_soon(read)
                    await wait_blocked_clients(redis, 1)
                    reader.cancel_scope.cancel()
            if i % 100 == 0:
                with trio.fail_after(1):
                    assert await redis.ping() == b"PONG"
        done.set()

    with trio.fail_after(1):
        assert await redis.ping() == b"PONG"
    # Every uncancelled INCR ran exactly once: none failed, none was sent again.
    assert int(await redis.get("incr-counter") or 0) == counted["incr"] > 0
    assert counted["reads"] > 0

    stats = redis_statistics(redis)
    assert stats.dedicated_in_use == 0
    # Only as many connections as were in use at once: the reader and a pipeline.
    assert stats.dedicated_connections <= 2, stats
    assert stats.shared_connections <= 4, stats
    # Each mid-block cancellation threw its connection away (and only that one).
    assert stats.discarded >= kinds["mid-block"], stats
    assert stats.lost == 0, stats
    # Cancelling is not an error: nothing logged at warning or above (coredis's
    # "Connection attempt failed unexpectedly!" for a cancelled handshake included).
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    # The server sees no connection the client forgot: discarded ones are closed.
    expected = stats.dedicated_connections + stats.shared_connections

    async def closed() -> bool:
        return await info_int(redis, "clients", "connected_clients") <= expected

    await wait_until(closed, what="discarded connections to close", within=5, interval=0.01)

    # Blocking reads still work, and a pool slot is available for each.
    async def short_read() -> None:
        assert await redis.xread({"idle": "$"}, count=1, block=10) is None

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(short_read)


@pytest.mark.timeout(30)
async def test_a_cancelled_blocking_read_never_touches_a_command_in_flight(
    redis: Redis,
) -> None:
    """The coredis re-send: an INCR script is running when a blocking read is cancelled.

    With coredis's pool the read takes the script's connection (the pool is a LIFO
    stack, and the script's command released it at once); cancelling the read drops
    that connection, the script's call fails with 'Connection lost!' and coredis's
    retry policy runs the script again: the counter ends at 2.
    """
    results: list[int] = []

    async def slow_incr() -> None:
        with redis_errors():
            results.append(cast("int", await redis.eval(SLOW_INCR, keys=["counter"])))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_incr)
        # The script is sent and the server is busy with it.
        await trio.testing.wait_all_tasks_blocked()
        scope = trio.CancelScope()
        nursery.start_soon(_read_in, scope, redis)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
    assert results == [1]
    assert await redis.get("counter") == b"1"


async def _read_in(scope: trio.CancelScope, redis: Redis) -> None:
    with scope:
        await redis.xread({"idle": "$"}, count=1, block=1000)
