"""An app for the counting scenario: the processor counts every delivery of every event.

Each event carries a unique number ``n``. For each event the processor runs one Lua
script that, atomically, adds the event's delivery count to the set
``counting:deliveries:<n>`` and increments the field ``n`` of the hash
``counting:counts`` (HINCRBY). Each delivery runs the processor once, so the
count equals the number of distinct delivery counts recorded, unless a command was
sent twice: a re-sent script increments again but adds nothing new to the set.

``make_app()`` builds an app for in-process use (the producer side); the module-level
``app`` is for ``streamkit worker tests.apps.counting:app`` subprocesses, configured by
``COUNTING_DELAY`` (seconds per batch, default 0.005) and the ``STREAMKIT_*`` settings.
"""

from __future__ import annotations

import os
from typing import Any

import trio

from streamkit import App, Events, Record, Stream

COUNTS = "counting:counts"
DELIVERIES = "counting:deliveries:"
PARTITIONS = 8

_COUNT = """
redis.call('SADD', KEYS[2], ARGV[2])
return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
"""


class Number(Record):
    key: str
    n: int


def make_app(
    *, delay: float = float(os.environ.get("COUNTING_DELAY", "0.005")), **settings: Any
) -> tuple[App, Stream[Number]]:
    app = App("counting", **settings)
    numbers = app.stream("numbers", record=Number, partition_by="key", partition_count=PARTITIONS)

    @app.processor(numbers)
    async def count(events: Events[Number]) -> None:
        async for batch in events.take_raw(20, within=0.02):
            for event in batch:
                n = str(event.record.n)
                await app.redis.eval(
                    _COUNT, keys=[COUNTS, DELIVERIES + n], args=[n, event.delivery_count]
                )
            if delay:
                await trio.sleep(delay)

    return app, numbers


app, numbers = make_app()
