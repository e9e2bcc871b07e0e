"""An app for the fault scenarios of jobs enqueued in the commit.

Each event carries a key and a unique number ``n``. The processor counts the events
per key (table ``counts``), enqueues one job ``note(n)`` per event with
:meth:`Events.enqueue <streamkit.Events.enqueue>` and emits a :class:`Enqueued` with
the job's id to the stream ``enqueued``, all committed with the acknowledgements.
After any fault, exactly once means: ``counts[k]`` is the number of events sent with
key ``k``; ``enqueued`` holds each ``n`` once, with one job id; the queue holds exactly
those jobs (one per event, no other), each with its ``n``, and each runs to success.

``make_app()`` builds an app for in-process use (the producer and the checks); the
module-level ``app`` is for ``streamkit worker tests.apps.committing:app``
subprocesses, configured by ``COMMITTING_DELAY`` (seconds per batch, default 0.005)
and the ``STREAMKIT_*`` settings.
"""

from __future__ import annotations

import os
from typing import Any

import trio

from streamkit import App, Events, Record, Table

PARTITIONS = 8


class Number(Record):
    key: str
    n: int


class Enqueued(Record):
    key: str
    n: int
    job_id: str


class Committing:
    """The app and its pieces."""

    def __init__(self, delay: float, settings: dict[str, Any]) -> None:
        self.app = app = App("committing", **settings)
        self.numbers = app.stream(
            "numbers", record=Number, partition_by="key", partition_count=PARTITIONS
        )
        self.enqueued = app.stream(
            "enqueued", record=Enqueued, partition_by="key", partition_count=4
        )
        self.counts: Table[int] = app.table("counts", value=int, default=0)
        counts, enqueued = self.counts, self.enqueued

        @app.job(retries=5)
        async def note(n: int) -> int:
            return n

        self.note = note

        @app.processor(self.numbers, tables=[counts], outputs=[enqueued], jobs=[note])
        async def count(events: Events[Number]) -> None:
            async for items in events.take(20, within=0.02):
                for number in items:
                    counts.set(number.key, await counts.get(number.key) + 1)
                    handle = events.enqueue(note, number.n)
                    events.emit(enqueued, Enqueued(key=number.key, n=number.n, job_id=handle.id))
                if delay:
                    await trio.sleep(delay)


def make_app(
    *, delay: float = float(os.environ.get("COMMITTING_DELAY", "0.005")), **settings: Any
) -> Committing:
    return Committing(delay, settings)


app = make_app().app
