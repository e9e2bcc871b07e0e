"""The connection layer on a Redis Cluster: ``redis+cluster://`` URLs and their client."""

from __future__ import annotations

import secrets
from typing import Any, cast

import coredis.exceptions
import pytest
import trio
from coredis._utils import hash_slot
from coredis.response._callbacks import NoopCallback
from coredis.typing import Key

from streamkit import BackendError, ConfigError, OutcomeUnknown, RedisUnavailable, ServerRefused
from streamkit._redis import LuaScript, check_redis_url, open_redis, redis_errors
from streamkit._redis._translate import translate
from streamkit._settings import Settings
from streamkit.lowlevel import call_once, redis_statistics, run_blocking
from streamkit.testing import RedisCluster, RedisServer, free_port, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


async def test_commands_reach_every_master(redis_cluster_url: str) -> None:
    async with open_redis(redis_cluster_url) as redis:
        assert await redis.ping() == b"PONG"
        keys = [f"key-{i}" for i in range(30)]  # spread over the three masters
        for i, key in enumerate(keys):
            await redis.set(key, i)
        assert [await redis.get(key) for key in keys] == [str(i).encode() for i in range(30)]
        async with redis.pipeline(transaction=False) as pipe:
            requests = [pipe.get(key) for key in keys]
        assert [await request for request in requests] == [str(i).encode() for i in range(30)]


async def test_a_multi_key_command_across_slots_is_refused_not_split(
    redis_cluster_url: str,
) -> None:
    async with open_redis(redis_cluster_url) as redis:
        await redis.set("a", 1)
        await redis.set("b", 2)
        with pytest.raises(BackendError, match="same slot"), redis_errors():
            await redis.delete(["a", "b"])
        assert await redis.get("a") == b"1"
        # Keys sharing a hash tag share a slot.
        assert await redis.delete(["{t}a", "{t}b"]) == 0


async def test_a_script_reaches_undeclared_keys_of_its_slot(redis_cluster_url: str) -> None:
    script = LuaScript(
        "redis.call('SET', ARGV[1] .. ':extra', 'x') return redis.call('INCR', KEYS[1])"
    )
    async with open_redis(redis_cluster_url) as redis:
        assert await script(redis, ["{job:1}:count"], ["{job:1}"]) == 1
        assert await redis.get("{job:1}:extra") == b"x"


@pytest.mark.parametrize("hot", [False, True])
async def test_a_script_a_node_lacks_is_loaded_on_that_node_only(
    redis_cluster: RedisCluster, redis_cluster_url: str, hot: bool
) -> None:
    # Loading it on every node (coredis's SCRIPT LOAD) fails while any node is failing
    # over ("Inconsistent response from cluster nodes"), which once stopped a worker.
    token = secrets.token_hex(8)  # a script no node has seen
    script = LuaScript(f"return {{'{token}', KEYS[1]}}", hot=hot)
    async with open_redis(redis_cluster_url) as redis:
        with redis_errors():
            assert await script(redis, ["{k}:1"], []) == [token.encode(), b"{k}:1"]
    holders = []
    for node in redis_cluster.nodes:
        async with open_redis(node.url) as one:
            if (await one.script_exists([script.sha]))[0]:
                holders.append(node.port)
    assert len(holders) == 1, holders


async def test_blocking_commands_run_on_dedicated_connections(redis_cluster_url: str) -> None:
    async with open_redis(redis_cluster_url) as redis:
        # More cancellations than a node's pool has slots: none is lost.
        for _ in range(150):
            with trio.move_on_after(0.005):
                await run_blocking(
                    redis, lambda r: r.xread({"s": "$"}, block=1000), within=5, what="reading"
                )
        await redis.xadd("s", {"n": "1"})
        reply = await run_blocking(
            redis, lambda r: r.xread({"s": "0"}, block=1000), within=5, what="reading"
        )
        assert reply is not None
        assert list(reply) == [b"s"]
        stats = redis_statistics(redis)
        assert stats.dedicated_in_use == 0
        assert stats.discarded > 64  # more than the node's 64 slots
        with pytest.raises(RedisUnavailable, match="no answer within"):
            await run_blocking(
                redis, lambda r: r.blpop(["none"], timeout=5), within=0.05, what="popping"
            )


async def _client_running(redis_cluster: RedisCluster, cmd: str) -> tuple[str, int]:
    """The URL of the node where a client runs ``cmd``, and that client's id."""
    found: list[tuple[str, int]] = []

    async def running() -> bool:
        for node in redis_cluster.nodes:
            async with open_redis(node.url) as client:
                found.extend(
                    (node.url, int(c["id"])) for c in await client.client_list() if c["cmd"] == cmd
                )
        return bool(found)

    await wait_until(running, what=f"a client running {cmd}", within=5, interval=0.01)
    return found[0]


async def test_a_lost_command_is_outcome_unknown_and_not_sent_again(
    redis_cluster: RedisCluster, redis_cluster_url: str
) -> None:
    calls = 0
    async with open_redis(redis_cluster_url) as redis:

        async def pop() -> Any:
            nonlocal calls
            calls += 1
            return await redis.blpop(["jobs"], timeout=5)

        async with trio.open_nursery() as nursery:

            async def once() -> None:
                with pytest.raises(OutcomeUnknown):
                    await call_once(pop, what="popping a job")

            nursery.start_soon(once)
            url, identifier = await _client_running(redis_cluster, "blpop")
            async with open_redis(url) as killer:
                await killer.client_kill(identifier=identifier)
        assert calls == 1
        assert await redis.ping() == b"PONG"
        assert redis_statistics(redis).lost == 1


async def test_a_server_that_is_not_a_cluster_node_is_a_config_error(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url.replace("redis://", "redis+cluster://")
    with pytest.raises(ConfigError, match="not a cluster node"):
        async with open_redis(url):
            pass


async def test_an_unreachable_cluster_is_unavailable() -> None:
    url = f"redis+cluster://127.0.0.1:{free_port()}"
    with trio.fail_after(10), pytest.raises(RedisUnavailable) as info:
        async with open_redis(url, give_up_after=0.3):
            pass
    assert not isinstance(info.value, OutcomeUnknown)
    assert "redis+cluster://127.0.0.1" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://127.0.0.1:7000",
        "rediss+cluster://user:secret@node-1.example:7000",
        "redis+cluster://127.0.0.1:7000/0",
    ],
)
def test_cluster_urls_are_accepted(url: str) -> None:
    check_redis_url(url)
    assert Settings.from_env({}, redis_url=url).redis_url == url


def test_a_cluster_has_database_0_only() -> None:
    with pytest.raises(ConfigError, match="database 0 only"):
        check_redis_url("redis+cluster://127.0.0.1:7000/2")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (coredis.exceptions.MovedError("3999 127.0.0.1:7001"), "MOVED"),
        (coredis.exceptions.AskError("3999 127.0.0.1:7001"), "ASK"),
        (coredis.exceptions.TryAgainError("Multiple keys request during rehashing"), "TRYAGAIN"),
        (coredis.exceptions.ClusterDownError("The cluster is down"), "CLUSTERDOWN"),
    ],
)
def test_redirections_and_cluster_refusals_are_server_refused(error: Exception, code: str) -> None:
    translated = translate(error, "redis+cluster://127.0.0.1:7000")
    assert isinstance(translated, ServerRefused)
    assert translated.code == code


def test_nodes_that_disagree_are_unavailable_not_a_backend_error() -> None:
    error = coredis.exceptions.ClusterResponseError("Inconsistent response from cluster nodes")
    translated = translate(error, "redis+cluster://127.0.0.1:7000")
    assert isinstance(translated, RedisUnavailable)
    assert not isinstance(translated, OutcomeUnknown)


def test_redirections_given_up_on_are_unavailable_not_outcome_unknown() -> None:
    error = coredis.exceptions.ClusterError("Maximum retries exhausted.")
    translated = translate(error, "redis+cluster://127.0.0.1:7000")
    assert isinstance(translated, RedisUnavailable)
    assert not isinstance(translated, OutcomeUnknown)


async def test_a_transaction_refused_after_its_slot_moved_runs_again_on_the_new_owner(
    redis_cluster: RedisCluster, redis_cluster_url: str
) -> None:
    # A failover or a resharding between WATCH and EXEC: the queued command is refused
    # with MOVED and EXEC runs nothing (EXECABORT). The transaction runs again where
    # the slot is now, instead of failing with "Transaction discarded".
    key = "{tx}state"
    slot = hash_slot(key.encode())
    async with open_redis(redis_cluster.nodes[0].url) as node:
        nodes = await node.cluster_nodes()
    masters = [n for n in nodes if n["slots"]]
    owner = next(n for n in masters if slot in n["slots"])
    target = next(n for n in masters if n["id"] != owner["id"])

    async def move_slot() -> None:
        async with (
            open_redis(f"redis://{owner['host']}:{owner['port']}") as source,
            open_redis(f"redis://{target['host']}:{target['port']}") as destination,
        ):
            await destination.cluster_setslot(slot, importing=owner["id"])
            await source.cluster_setslot(slot, migrating=target["id"])
            await destination.cluster_setslot(slot, node=target["id"])
            await source.cluster_setslot(slot, node=target["id"])

    runs = 0

    async def body(pipe: Any) -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            await move_slot()
        pipe.set(key, str(runs))

    async with open_redis(redis_cluster_url) as redis:
        with redis_errors():
            await cast("Any", redis).transaction(body, key)
        assert runs == 2
        assert await redis.get(key) == b"2"


async def test_a_transaction_refused_for_good_raises_the_refusal(redis_cluster_url: str) -> None:
    async with open_redis(redis_cluster_url) as redis:

        async def body(pipe: Any) -> None:
            pipe.set("{tx}first", "1")
            # Refused when queued (wrong number of arguments): EXEC runs nothing.
            pipe.create_request(b"SET", Key("{tx}second"), callback=NoopCallback())

        with pytest.raises(BackendError, match="wrong number of arguments"), redis_errors():
            await cast("Any", redis).transaction(body, "{tx}first")
        assert await redis.get("{tx}first") is None
