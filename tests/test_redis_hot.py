"""The hot path (``streamkit/_redis/_hot.py``): hot scripts packed and parsed by hiredis.

A script marked ``hot`` must be indistinguishable from the same script on the shared
pool, but for its speed: the same bytes on the wire, the same replies, the same errors
once translated, the same cancellation (the connection untouched, every other call
its own reply), a lost connection an unknown outcome that is never sent again, and
the shared way inside ``replicated()`` (its ``WAIT`` on the same connection).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, cast

import pytest
import trio
from coredis._packer import Packer
from coredis.tokens import PureToken

from streamkit import BackendError, NotReplicated, OutcomeUnknown
from streamkit._redis import LuaScript, hot_hget, replicated
from streamkit._redis._hot import pack
from streamkit.lowlevel import redis_errors, redis_statistics
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "command",
    [
        (b"EVALSHA", "abc", 2, "k1", b"k2", b"raw\x00\xff", "text é", 0, -17, 2**62),
        (b"EVALSHA", "abc", 0, 0.1 + 0.2, 1e16, -0.0, 1.5, 3.0),
        (b"EVALSHA", "abc", 0, True, False),
        (b"EVALSHA", "abc", 0, b"", ""),
        # Long commands, packed by pack itself: every type, and arguments of 8 KiB and
        # more (no length prefix made in advance).
        (b"EVALSHA", "abc", 1, "k", *[b"id-%d" % i for i in range(40)], "é", 7, -1.5, True),
        (b"EVALSHA", "abc", 0, *[b"x" * n for n in (0, 8191, 8192, 70_000)] * 8),
    ],
)
def test_pack_sends_what_coredis_sends(command: tuple[Any, ...]) -> None:
    assert pack(command) == b"".join(Packer("utf-8").pack_commands([command]))


@pytest.mark.parametrize("value", [None, bytearray(b"ba"), memoryview(b"mv"), [1]])
def test_pack_refuses_what_coredis_refuses(value: object) -> None:
    with pytest.raises(TypeError):
        b"".join(Packer("utf-8").pack_commands([cast("Any", (b"EVALSHA", "abc", 0, value))]))
    with pytest.raises(TypeError, match="cannot send a"):
        pack((b"EVALSHA", "abc", 0, value))
    with pytest.raises(TypeError, match="cannot send a"):
        pack((b"EVALSHA", "abc", 0, *[b"v"] * 40, value))


REPLIES = {
    "nested": "return {1, {'a', {'b', 'c'}, {}}, 'x', {}}",
    "integer": "return -42",
    "nil": "return nil",
    "true": "return true",
    "false": "return false",
    "status": "return redis.status_reply('FINE')",
    "binary": "return ARGV[1]",
    "empty": "return {}",
    "keys and args": "return {KEYS[1], ARGV[2], #ARGV}",
    "table with a hole": "return {1, 2, nil, 4}",
    "float": "return 3.99",
}


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(REPLIES))
async def test_hot_scripts_reply_as_on_the_shared_pool(redis: Redis, name: str) -> None:
    source = REPLIES[name]
    args = [b"\x00\xfe binary \r\n", "text é", 3]
    with redis_errors():
        hot = await LuaScript(source, hot=True)(redis, keys=["{k}1"], args=args)
        shared = await LuaScript(source)(redis, keys=["{k}1"], args=args)
    assert hot == shared


ERRORS = {
    "error reply": "return redis.error_reply('ERR boom')",
    "coded error reply": "return redis.error_reply('SOMECODE boom')",
    "wrong type": "redis.call('SET', KEYS[1], 'x'); return redis.call('LPUSH', KEYS[1], 'y')",
    "runtime error": "error('broken')",
    "bad call": "return redis.call('NOSUCHCOMMAND')",
    "nested error": "return {1, redis.error_reply('ERR inner')}",
}


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(ERRORS))
async def test_hot_script_errors_are_the_shared_pools(redis: Redis, name: str) -> None:
    source = ERRORS[name]
    outcomes = []
    for hot in (True, False):
        try:
            with redis_errors():
                outcomes.append(await LuaScript(source, hot=hot)(redis, keys=["{e}"], args=[]))
        except BackendError as exc:
            outcomes.append((type(exc), str(exc)))
    hot_outcome, shared_outcome = outcomes
    if name == "nested error":
        # An error inside a reply stays a value: coredis's own exception object.
        assert type(hot_outcome[1]) is type(shared_outcome[1])
        assert str(hot_outcome[1]) == str(shared_outcome[1])
    else:
        assert hot_outcome == shared_outcome
        assert hot_outcome[0] is BackendError


@pytest.mark.cluster
async def test_a_hot_hget_replies_and_fails_as_coredis(redis: Redis) -> None:
    await redis.hset("h", {b"f\x00\xff": b"v\r\n\x00", b"empty": b""})
    await redis.set("not-a-hash", "x")
    cases: list[tuple[str, bytes]] = [
        ("h", b"f\x00\xff"),
        ("h", b"empty"),
        ("h", b"absent"),
        ("nokey", b"f"),
    ]
    for key, field in cases:
        with redis_errors():
            assert await hot_hget(redis, key, field) == await redis.hget(key, field)
    outcomes = []
    for get in (hot_hget, lambda r, k, f: r.hget(k, f)):
        with pytest.raises(BackendError) as caught, redis_errors():
            await get(redis, "not-a-hash", "f")
        outcomes.append(str(caught.value))
    assert outcomes[0] == outcomes[1]


async def test_a_flushed_script_cache_is_loaded_again(redis: Redis) -> None:
    script = LuaScript("return 'again'", hot=True)
    with redis_errors():
        assert await script(redis, keys=[], args=[]) == b"again"
        await redis.script_flush()
        assert await script(redis, keys=[], args=[]) == b"again"


async def test_cancelled_hot_calls_leave_every_other_call_its_own_reply(redis: Redis) -> None:
    """Many tasks call an echoing, counting script on the hot connection, a third of
    the calls cancelled at random moments: every call that returns gets its own token,
    and nothing is lost or run twice (the counter is within what was sent)."""
    rng = random.Random(25)
    script = LuaScript("redis.call('INCR', KEYS[1]); return ARGV[1]", hot=True)
    returned = cancelled = 0

    async def caller(task: int) -> None:
        nonlocal returned, cancelled
        for call in range(200):
            token = f"{task}:{call}".encode()
            with trio.move_on_after(rng.choice([0, 1e-5, 1e-4, 1e-3, 10, 10, 10])) as scope:
                with redis_errors():
                    reply = await script(redis, keys=["counter"], args=[token])
                assert reply == token
                returned += 1
            if scope.cancelled_caught:
                cancelled += 1

    async with trio.open_nursery() as nursery:
        for task in range(10):
            nursery.start_soon(caller, task)
    assert cancelled > 0
    assert returned > 0
    with trio.fail_after(5):
        # The cancelled calls' replies are read and dropped: the connection carries on.
        assert await LuaScript("return 'still'", hot=True)(redis, keys=[], args=[]) == b"still"
    counter = int(await redis.get("counter") or 0)
    assert returned <= counter <= returned + cancelled
    stats = redis_statistics(redis)
    assert stats.lost == 0
    assert stats.discarded == 0


async def test_a_call_the_socket_takes_in_part_keeps_its_place(redis: Redis) -> None:
    """A call is written by its caller when nothing waits to be written: one too big
    for the socket at once (16 MiB) leaves the rest to the writer task, and the calls
    made meanwhile go after it, each with its own reply, in order."""
    script = LuaScript("return {ARGV[1], string.len(ARGV[2])}", hot=True)
    big = b"x" * (16 << 20)
    with redis_errors():
        await script(redis, keys=[], args=["warm", ""])
    replies: dict[int, Any] = {}

    async def call(n: int, payload: bytes) -> None:
        with redis_errors():
            replies[n] = await script(redis, keys=[], args=[str(n), payload])

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for n in range(50):
                nursery.start_soon(call, n, big if n % 10 == 0 else b"ab")
    assert replies == {n: [str(n).encode(), len(big) if n % 10 == 0 else 2] for n in range(50)}
    assert redis_statistics(redis).lost == 0


async def test_a_cancelled_caller_sends_nothing(redis: Redis) -> None:
    script = LuaScript("return redis.call('INCR', KEYS[1])", hot=True)
    with redis_errors():
        assert await script(redis, keys=["sent"], args=[]) == 1
    with trio.CancelScope() as scope:
        scope.cancel()
        with redis_errors():
            await script(redis, keys=["sent"], args=[])
    assert scope.cancelled_caught
    with redis_errors():
        assert await script(redis, keys=["sent"], args=[]) == 2


async def _hot_client_id(redis: Redis, command: str) -> int:
    found: list[int] = []

    async def running() -> bool:
        found[:] = [
            int(c["id"])
            for c in await redis.client_list()
            if str(c["cmd"]).lower() == command and "b" in str(c["flags"])
        ]
        return bool(found)

    await wait_until(running, what=f"a client paused in {command}", within=5, interval=0.01)
    return found[0]


async def test_a_lost_hot_call_is_outcome_unknown_and_not_sent_again(redis: Redis) -> None:
    """A hot call held back by ``CLIENT PAUSE WRITE`` loses its connection: the caller
    learns the outcome is unknown at once, and the script never runs (nothing was sent
    again, the call was not run by the server either)."""
    script = LuaScript("return redis.call('INCR', KEYS[1])", hot=True)
    with redis_errors():
        assert await script(redis, keys=["lost"], args=[]) == 1
    await redis.client_pause(5_000, PureToken.WRITE)
    try:
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                with pytest.raises(OutcomeUnknown), redis_errors():
                    await script(redis, keys=["lost"], args=[])

            nursery.start_soon(call)
            victim = await _hot_client_id(redis, "evalsha")
            assert await redis.client_kill(identifier=victim) == 1
    finally:
        await redis.client_unpause()
    assert await redis.get("lost") == b"1"
    with redis_errors():
        # A new hot connection takes over.
        assert await script(redis, keys=["lost"], args=[]) == 2
    assert redis_statistics(redis).lost == 1


async def test_inside_replicated_hot_scripts_take_the_waiting_path(redis: Redis) -> None:
    """``replicated()`` makes every command wait for replicas on its own connection:
    a hot script too (here, with no replica at all, NotReplicated after the script ran)."""
    script = LuaScript("return redis.call('INCR', KEYS[1])", hot=True)
    with pytest.raises(NotReplicated), replicated(redis, 1, 0.05), redis_errors():
        await script(redis, keys=["replicated"], args=[])
    assert await redis.get("replicated") == b"1"


async def test_hot_connections_count_as_shared_ones(redis: Redis) -> None:
    before = redis_statistics(redis).shared_connections
    with redis_errors():
        await LuaScript("return 1", hot=True)(redis, keys=[], args=[])
    assert redis_statistics(redis).shared_connections == before + 1
