"""An app for expiry under faults: the newest number of each key, in a table whose keys
expire :data:`TTL` seconds after their last event.

``make_app()`` builds it for in-process use (the producer and the checks); the module
level ``app`` is for ``streamkit worker tests.apps.expiring:app`` subprocesses.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from streamkit import App, Events, Record, Stream, Table

PARTITIONS = 8
#: Seconds a key lives after its last event.
TTL = 3.0


class Number(Record):
    key: str
    n: int


def make_app(**settings: Any) -> tuple[App, Stream[Number], Table[int]]:
    app = App("expiring", **settings)
    numbers = app.stream("numbers", record=Number, partition_by="key", partition_count=PARTITIONS)
    latest = app.table("latest", value=int, default=-1, ttl=timedelta(seconds=TTL))

    @app.processor(numbers, tables=[latest])
    async def keep(events: Events[Number]) -> None:
        async for number in events.records():
            latest.set(number.key, max(number.n, await latest.get(number.key)))

    return app, numbers, latest


app = make_app()[0]


async def assert_latest_then_expired(redis: Any, latest: Table[int], sent: dict[str, int]) -> None:
    """Each key reads its greatest n, or nothing once expired (never another value);
    then, once every key's last event is older than the ttl, none reads, and the commits
    of the quiet partitions give the space back."""
    from streamkit.testing import wait_until

    keys = sorted(sent)
    values = await latest.read_many(keys, redis=redis)
    wrong = {k: (v, sent[k]) for k, v in zip(keys, values, strict=True) if v not in (-1, sent[k])}
    assert wrong == {}

    async def gone() -> bool:
        return set(await latest.read_many(keys, redis=redis)) == {-1}

    await wait_until(gone, what="every key expired", within=TTL + 30)

    async def swept() -> bool:
        return sum(await latest.sizes(redis=redis)) == 0

    await wait_until(swept, what="the expired keys swept", within=TTL + 30)
