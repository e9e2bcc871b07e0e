"""An app for the state fault scenarios: counts, sums and an echo of every event.

Each event carries a key and a unique number ``n``. The processor keeps, per key, the
number of events (table ``counts``) and the sum of their ``n`` (table ``sums``), and
emits an :class:`Echo` of every event to the stream ``echoes``, all committed with the
acknowledgements. After any fault, exactly once means: ``counts[k]`` is the number of
events sent with key ``k``, ``sums[k]`` their sum, and ``echoes`` holds each ``n``
once, in send order per key.

``make_app()`` builds an app for in-process use (the producer and the checks); the
module-level ``app`` is for ``streamkit worker tests.apps.stateful:app`` subprocesses,
configured by ``STATEFUL_DELAY`` (seconds per batch, default 0.005), ``STATEFUL_BATCH``
(default 20) and the ``STREAMKIT_*`` settings.
"""

from __future__ import annotations

import os
from typing import Any

import trio

from streamkit import App, Events, Record, Stream, Table

PARTITIONS = 8


class Number(Record):
    key: str
    n: int


class Echo(Record):
    key: str
    n: int


def make_app(
    *,
    delay: float = float(os.environ.get("STATEFUL_DELAY", "0.005")),
    batch: int = int(os.environ.get("STATEFUL_BATCH", "20")),
    **settings: Any,
) -> tuple[App, Stream[Number], Stream[Echo], Table[int], Table[int]]:
    app = App("stateful", **settings)
    numbers = app.stream("numbers", record=Number, partition_by="key", partition_count=PARTITIONS)
    echoes = app.stream("echoes", record=Echo, partition_by="key", partition_count=4)
    counts = app.table("counts", value=int, default=0)
    sums = app.table("sums", value=int, default=0)

    @app.processor(numbers, tables=[counts, sums], outputs=[echoes])
    async def count(events: Events[Number]) -> None:
        async for items in events.take(batch, within=0.02):
            for number in items:
                counts.set(number.key, await counts.get(number.key) + 1)
                sums.set(number.key, await sums.get(number.key) + number.n)
                events.emit(echoes, Echo(key=number.key, n=number.n))
            if delay:
                await trio.sleep(delay)

    return app, numbers, echoes, counts, sums


app, numbers, echoes, counts, sums = make_app()
