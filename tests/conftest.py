"""Shared fixtures: every test that touches Redis talks to a real, private server."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import pytest
import trio

from streamkit import App, LockManager, Redis, Stream, open_lock_manager, open_redis
from streamkit.testing import RedisServer
from tests.consume import PARTITIONS, Tick

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from tests.workers import WorkerProcess


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private ``redis-server`` for the session; tests flush it before use."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def redis_url(redis_server: RedisServer) -> str:
    """The URL of the session's server, flushed empty for this test."""
    async with open_redis(redis_server.url) as client:
        await client.flushall()
    return redis_server.url


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A connected client on an empty server."""
    async with open_redis(redis_url) as client:
        yield client


@pytest.fixture
async def private_redis() -> AsyncIterator[RedisServer]:
    """A server of this test's own, which the test may stop, restart or pause."""
    async with trio.open_nursery() as nursery:
        server: RedisServer = await nursery.start(RedisServer(appendonly=True).run)
        yield server
        nursery.cancel_scope.cancel()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse ``usefixtures`` naming an async fixture: pytest-trio never runs those."""
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
