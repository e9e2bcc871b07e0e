"""Job events: the state changes of a queue's jobs, from any process, resumable.

The queue's scripts append each state change of a job (enqueued, started, progress,
retried, released, succeeded, dead, aborted, expired) to its shard's event stream
(``__jobs:{Q.S}:events``) in the very call that makes it, so the events of a job come
in the order its changes happened, and none is lost or made up by a crash. Each shard
keeps about :data:`EVENTS_KEEP` events (``MAXLEN ~``): a reader that falls further
behind misses the oldest. Events can be turned off for a queue, fleet-wide
(``__jobs:{Q.S}:evoff``), which saves each script its ``XADD``.

A reader follows every shard; a :class:`JobEvent`'s :attr:`~JobEvent.cursor` says where
it was in all of them, to resume after it (``events(after=event.cursor)``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import trio

from .._backoff import Backoff, retry_unavailable
from .._lua import CONSTANTS
from .._redis import health_of, redis_errors, retry_idempotent, run_blocking
from ._replies import decode_events, event_cursors, events_after

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from .._redis import Redis
    from ._layout import ShardKeys
    from ._model import JobEvent

__all__ = ["EVENTS_KEEP", "events_on", "follow_events", "set_events"]

#: Events a shard keeps, about (the oldest go first).
EVENTS_KEEP = int(CONSTANTS["EVENTS_KEEP"])
#: How long one read of a single shard's events blocks (ms); several shards are read
#: in turn, each without blocking, every :data:`POLL` seconds while idle.
BLOCK_MS = 1000
POLL = 0.1
#: Delays between reads while Redis is unreachable, when following.
FOLLOW_BACKOFF = Backoff(initial=0.1, maximum=2.0)


async def follow_events(
    redis: Redis, keys: Sequence[ShardKeys], *, after: str | None, follow: bool
) -> AsyncIterator[JobEvent]:
    """The events of the shards ``keys``, after ``after`` (a cursor), in order per
    shard; with ``follow``, waiting for new ones until cancelled.

    Error handling:
        :class:`~streamkit.ConfigError` for a cursor of another queue. With
        ``follow``, an outage is ridden out: a read that fails because Redis cannot be
        reached (or lost its reply: reading is safe to do again) is tried again until
        Redis answers, said once in the log and its end in one line (the client's
        :class:`~streamkit._outage.OutageLog`); without, it raises
        :class:`~streamkit.RedisUnavailable` after the usual retries.
    """
    cursors = event_cursors(after, len(keys))
    single = len(keys) == 1
    outage = health_of(redis).outage

    async def read(shard: int, events_key: str) -> list[Any]:
        if single and follow:
            start = events_after(cursors[0])
            reply: Any = await run_blocking(
                redis,
                lambda r: r.xread({events_key: start}, count=500, block=BLOCK_MS),
                within=BLOCK_MS / 1000 + 10,
                what="reading job events",
            )
            return [e for es in (reply or {}).values() for e in es]
        read_range: Any = retry_idempotent(
            redis.xrange,
            events_key,
            f"({events_after(cursors[shard])}",
            "+",
            500,
            what="reading job events",
        )
        return list(await read_range)

    while True:
        got = 0
        for shard, shard_keys in enumerate(keys):
            events_key = f"{shard_keys.base}:events"
            if follow:
                entries = await retry_unavailable(
                    functools.partial(read, shard, events_key),
                    backoff=FOLLOW_BACKOFF,
                    give_up_after=None,
                    what="reading job events",
                    outage=outage,
                )
            else:
                entries = await read(shard, events_key)
            for entry in entries:
                for event in decode_events(entry.identifier, entry.field_values, shard, cursors):
                    got += 1
                    yield event
        if not got:
            if not follow:
                return
            if not single:
                await trio.sleep(POLL)


async def set_events(redis: Redis, keys: Sequence[ShardKeys], on: bool) -> None:
    """Turn the events of the shards ``keys`` on or off, fleet-wide."""
    for shard_keys in keys:
        with redis_errors():
            if on:
                await redis.delete([f"{shard_keys.base}:evoff"])
            else:
                await redis.set(f"{shard_keys.base}:evoff", "1")


async def events_on(redis: Redis, keys: ShardKeys) -> bool:
    """Whether the events of a queue (by its first shard) are on."""
    with redis_errors():
        return not await redis.exists([f"{keys.base}:evoff"])
