"""``streamkit.testing``: the private Redis server and the polling helper."""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

import streamkit.testing
from streamkit import open_redis
from streamkit.testing import RedisCluster, RedisServer, RedisServerError, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

    from streamkit import Redis

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def chosen_ports(monkeypatch: pytest.MonkeyPatch, *first: int) -> None:
    """Make the server choose ``first`` ports first, as if someone took each of them
    between ``free_port()`` and ``redis-server`` binding it; then really free ones."""
    real, queue = streamkit.testing.free_port, list(first)
    monkeypatch.setattr(streamkit.testing, "free_port", lambda: queue.pop(0) if queue else real())


async def answers(server: RedisServer) -> bool:
    async with open_redis(server.url) as client:
        return await client.ping() == b"PONG"


async def test_run_starts_a_server_that_answers_and_stops_it() -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server: RedisServer = await nursery.start(RedisServer().run)
            assert await answers(server)
            nursery.cancel_scope.cancel()
    assert not server.running
    assert server.log_tail() == "(no log)"  # its directory is gone


def test_the_port_is_chosen_when_the_server_starts() -> None:
    server = RedisServer()
    with pytest.raises(RedisServerError, match="start it first"):
        _ = server.url
    assert RedisServer(port=6390).url == "redis://127.0.0.1:6390"


async def test_a_chosen_port_taken_meanwhile_is_retried(
    monkeypatch: pytest.MonkeyPatch, taken_port: int
) -> None:
    chosen_ports(monkeypatch, taken_port, taken_port)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server: RedisServer = await nursery.start(RedisServer().run)
            assert server.port != taken_port
            assert await answers(server)
            nursery.cancel_scope.cancel()


def test_the_synchronous_start_retries_too(
    monkeypatch: pytest.MonkeyPatch, taken_port: int
) -> None:
    chosen_ports(monkeypatch, taken_port)
    with RedisServer() as server:
        assert server.port != taken_port
        assert server.running


async def test_a_cluster_nodes_taken_bus_port_is_retried_with_another(
    monkeypatch: pytest.MonkeyPatch, taken_port: int
) -> None:
    """The port taken may be the cluster bus's, not the client's: both are chosen
    again (a bus port kept across attempts failed every one, and a whole test run's
    cluster tests with it)."""
    chosen_ports(monkeypatch, streamkit.testing.free_port(), taken_port)
    node = RedisServer(
        cluster_bus=True, extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "n.conf"]
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server: RedisServer = await nursery.start(node.run)
            assert await answers(server)
            assert server._bus_port not in (None, taken_port)
            nursery.cancel_scope.cancel()


async def test_a_given_port_that_is_taken_is_an_error(taken_port: int) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with pytest.raises(RedisServerError, match=f"port {taken_port} is taken"):
                await nursery.start(RedisServer(port=taken_port).run)
    with pytest.raises(RedisServerError, match=f"port {taken_port} is taken"):
        RedisServer(port=taken_port).start()


async def test_no_free_port_after_every_attempt_is_an_error(
    monkeypatch: pytest.MonkeyPatch, taken_port: int
) -> None:
    chosen_ports(monkeypatch, *[taken_port] * streamkit.testing.PORT_ATTEMPTS)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with pytest.raises(RedisServerError, match="no port was free in 5 attempts"):
                await nursery.start(RedisServer().run)


async def test_stop_and_restart_keep_the_port_and_the_data() -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server: RedisServer = await nursery.start(RedisServer(appendonly=True).run)
            port = server.port
            async with open_redis(server.url) as client:
                await client.set("kept", "yes")
            server.stop()
            assert not server.running
            await trio.to_thread.run_sync(server.start)
            assert server.port == port
            await trio.to_thread.run_sync(server.restart)
            assert server.port == port
            async with open_redis(server.url) as client:
                assert await client.get("kept") == b"yes"
            nursery.cancel_scope.cancel()


async def test_wait_until_returns_once_the_condition_holds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    checks: list[float] = []

    def sync_condition() -> bool:
        checks.append(trio.current_time())
        return len(checks) == 3

    async def async_condition() -> bool:
        await trio.lowlevel.checkpoint()
        return sync_condition()

    start = trio.current_time()
    await wait_until(sync_condition, what="three checks", within=1, interval=0.1)
    assert [round(t - start, 6) for t in checks] == [0.0, 0.1, 0.2]
    checks.clear()
    await wait_until(async_condition, what="three checks", within=1, interval=0.1)
    assert len(checks) == 3


async def test_wait_until_names_what_it_waited_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    with pytest.raises(trio.TooSlowError, match="gave up after 2s waiting for the moon"):
        await wait_until(lambda: False, what="the moon", within=2)
    assert trio.current_time() - start == 2


async def test_a_cluster_comes_up_in_seconds_with_a_replica_per_master() -> None:
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            cluster: RedisCluster = await nursery.start(RedisCluster().run)
            assert cluster.url.startswith("redis+cluster://127.0.0.1:")
            roles = []
            for node in cluster.nodes:
                async with open_redis(node.url) as client:
                    roles.append((await client.role()).role)
            assert sorted(roles) == ["master"] * 3 + ["slave"] * 3
            nursery.cancel_scope.cancel()
    assert not cluster.running
    assert all(node.log_tail() == "(no log)" for node in cluster.nodes)  # directories gone


def test_the_cluster_url_is_known_once_started() -> None:
    with pytest.raises(RedisServerError, match="start it first"):
        _ = RedisCluster().url


async def test_the_fixtures_run_the_server_asked_for(
    redis: Redis, request: pytest.FixtureRequest
) -> None:
    """``--server valkey`` runs the fixtures on Valkey 8, ``redis`` (the default) on
    Redis: the compatibility set is run on the server it says."""
    info = await redis.info("server")
    if request.config.getoption("--server") == "valkey":
        assert str(info["valkey_version"]).startswith("8.")
    else:
        assert "valkey_version" not in info
        assert int(str(info["redis_version"]).split(".")[0]) >= 7
