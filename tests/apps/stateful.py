"""An app for the state fault scenarios: counts, sums and an echo of every event.

Each event carries a key and a unique number ``n``. The processor keeps, per key, the
number of events (table ``counts``) and the sum of their ``n`` (table ``sums``), emits
an :class:`Echo` of every event to the stream ``echoes``, and sums ``n`` per key in
tumbling windows of :data:`WINDOW` ms of event time, the event time being ``n`` ms
(windowed table ``tens``, results to the stream ``tens_out`` as they close), all
committed with the acknowledgements. After any fault, exactly once means:
``counts[k]`` is the number of events sent with key ``k``, ``sums[k]`` their sum,
``echoes`` holds each ``n`` once, in send order per key, and each closed window's
result is in ``tens_out`` once, with the sum of its events.

``make_app()`` builds an app for in-process use (the producer and the checks); the
module-level ``app`` is for ``streamkit worker tests.apps.stateful:app`` subprocesses,
configured by ``STATEFUL_DELAY`` (seconds per batch, default 0.005), ``STATEFUL_BATCH``
(default 20) and the ``STREAMKIT_*`` settings.
"""

from __future__ import annotations

import operator
import os
from datetime import timedelta
from typing import Any

import trio

from streamkit import App, Events, Record, Table, WindowedTable, tumbling

PARTITIONS = 8
#: The windows of ``tens``, in ms of event time (``n``), and their grace.
WINDOW = 500
GRACE = 1000


class Number(Record):
    key: str
    n: int


class Echo(Record):
    key: str
    n: int


class Stateful:
    """The app and its pieces."""

    def __init__(self, delay: float, batch: int, settings: dict[str, Any]) -> None:
        self.app = app = App("stateful", **settings)
        self.numbers = app.stream(
            "numbers", record=Number, partition_by="key", partition_count=PARTITIONS
        )
        self.echoes = app.stream("echoes", record=Echo, partition_by="key", partition_count=4)
        self.tens_out = app.stream(
            "tens_out", record=dict, partition_by=lambda r: r["key"], partition_count=4
        )
        self.counts: Table[int] = app.table("counts", value=int, default=0)
        self.sums: Table[int] = app.table("sums", value=int, default=0)
        self.tens: WindowedTable[int] = app.window(
            "tens",
            tumbling(timedelta(milliseconds=WINDOW)),
            value=int,
            initial=0,
            grace=timedelta(milliseconds=GRACE),
            time=lambda number: number.n / 1000,
            output=self.tens_out,
            # Event time is synthetic (n ms), not the wall clock's: only events close.
            idle=False,
        )
        counts, sums, tens, echoes = self.counts, self.sums, self.tens, self.echoes

        @app.processor(self.numbers, tables=[counts, sums, tens], outputs=[echoes])
        async def count(events: Events[Number]) -> None:
            async for items in events.take(batch, within=0.02):
                for number in items:
                    counts.set(number.key, await counts.get(number.key) + 1)
                    sums.set(number.key, await sums.get(number.key) + number.n)
                    await tens.update(number.key, number, operator.add, number.n)
                    events.emit(echoes, Echo(key=number.key, n=number.n))
                if delay:
                    await trio.sleep(delay)


def make_app(
    *,
    delay: float = float(os.environ.get("STATEFUL_DELAY", "0.005")),
    batch: int = int(os.environ.get("STATEFUL_BATCH", "20")),
    **settings: Any,
) -> Stateful:
    return Stateful(delay, batch, settings)


app = make_app().app
