"""The consume-path test stack, shared by the events, fetcher and policies tests.

One stream, ``shop.ticks`` with :data:`PARTITIONS` partitions, consumed by processor
``proc``; fixtures (in ``conftest.py``) give the app, the stream and a lock manager.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

from streamkit import (
    ProcessorKeys,
    Record,
    open_events,
    open_fetcher,
    open_lock_manager,
    partition_for,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Events, Fetcher, LockManager, PartitionFeed, Redis, Stream

PARTITIONS = 4
PROC = ProcessorKeys(app="shop", stream="ticks", processor="proc")
GROUP = PROC.group
DEAD = PROC.dead_letter_key


def lock_name(partition: int) -> str:
    return PROC.lock_name(partition)


class Tick(Record):
    n: int
    key: str


def key_for(partition: int) -> str:
    """A partition key that lands in ``partition``."""
    return next(f"k{i}" for i in range(1000) if partition_for(f"k{i}", PARTITIONS) == partition)


KEY = key_for(0)


def ticks_for(partition: int, numbers: range | list[int]) -> list[Tick]:
    key = key_for(partition)
    return [Tick(n=n, key=key) for n in numbers]


async def send(stream: Stream[Tick], numbers: range | list[int], partition: int = 0) -> list[str]:
    """Send ticks numbered ``numbers`` to ``partition``; return their entry ids."""
    return await stream.send_many(ticks_for(partition, numbers))


async def pending_ids(redis: Redis, stream: Stream[Tick], partition: int = 0) -> list[str]:
    entries = await redis.xpending(stream.key(partition), GROUP, "-", "+", 100_000)
    return [cast("bytes", e.identifier).decode() for e in cast("Any", entries)]


async def pending_count(redis: Redis, stream: Stream[Tick], partition: int = 0) -> int:
    return int(cast("Any", await redis.xpending(stream.key(partition), GROUP)).pending)


@contextlib.asynccontextmanager
async def serving(
    fetcher: Fetcher[Tick], locks: LockManager, partition: int, **options: Any
) -> AsyncIterator[Events[Tick]]:
    """``partition``'s events, served by ``fetcher`` under a lease held by ``locks``."""
    async with (
        locks.hold(fetcher.keys.lock_name(partition), ttl=30) as held,
        fetcher.partition(partition, held) as feed,
        open_events(feed, **options) as events,
    ):
        yield events


@contextlib.asynccontextmanager
async def feed_of(
    redis: Redis, stream: Stream[Tick], partition: int = 0, **options: Any
) -> AsyncIterator[PartitionFeed]:
    """A fetcher of its own serving ``partition`` of ``stream`` to processor ``proc``."""
    async with (
        open_lock_manager(redis) as locks,
        open_fetcher(redis, stream, group=PROC, **options) as fetcher,
        locks.hold(lock_name(partition), ttl=30) as held,
        fetcher.partition(partition, held) as feed,
    ):
        yield feed


@contextlib.asynccontextmanager
async def events_of(
    redis: Redis, stream: Stream[Tick], partition: int = 0, **options: Any
) -> AsyncIterator[Events[Tick]]:
    """As :func:`feed_of`, with the feed opened as events (``options`` split between
    the fetcher and :func:`open_events`)."""
    fetcher_options = {k: options.pop(k) for k in ("batch_size", "prefetch") if k in options}
    async with (
        feed_of(redis, stream, partition, **fetcher_options) as feed,
        open_events(feed, **options) as events,
    ):
        yield events
