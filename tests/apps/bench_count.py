"""An app for the cluster benchmark's workers: counts processed events in Redis.

``streamkit worker tests.apps.bench_count:app`` processes stream ``benchcount.ticks``
(``BENCH_PARTITIONS`` partitions, default 12) with ``take(500)`` and adds each batch's
size to the counter ``bench:done`` (one ``INCRBY`` per batch).
"""

from __future__ import annotations

import os

from streamkit import App, Events, Record

DONE = "bench:done"


class Tick(Record):
    symbol: str
    price: float
    volume: int


app = App("benchcount")
ticks = app.stream(
    "ticks",
    record=Tick,
    partition_by="symbol",
    partition_count=int(os.environ.get("BENCH_PARTITIONS", "12")),
)


@app.processor(ticks)
async def count(events: Events[Tick]) -> None:
    async for batch in events.take(500, within=0.01):
        await app.redis.incrby(DONE, len(batch))
