"""An app for worker tests: records every processing of every event in Redis.

Each event has a key and a per-key sequence number. The processor appends
``key:seq:worker`` to the list ``scenario:seen`` for every event it processes, so a
test can count losses, duplicates and order violations afterwards. With
``mark_taken``, it also appends them to ``scenario:taken`` as it takes a batch, before
the batch's delay, so a test can wait until a worker is in the middle of a batch.

``make_app()`` builds a fresh app for in-process tests; the module-level ``app`` is for
real ``streamkit worker tests.apps.scenario:app`` subprocesses, configured by
environment variables: ``SCENARIO_PARTITIONS`` (default 8), ``SCENARIO_DELAY`` (seconds
per batch, default 0), ``SCENARIO_BATCH`` (default 50), ``SCENARIO_MARK_TAKEN``
(``1`` for ``mark_taken``) and the ``STREAMKIT_*`` settings.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import trio

from streamkit import App, Events, Record, Stream

SEEN = "scenario:seen"
TAKEN = "scenario:taken"
WORKER = f"{socket.gethostname()}:{os.getpid()}"


class Numbered(Record):
    key: str
    seq: int


def make_app(
    *,
    partitions: int = int(os.environ.get("SCENARIO_PARTITIONS", "8")),
    delay: float = float(os.environ.get("SCENARIO_DELAY", "0")),
    batch: int = int(os.environ.get("SCENARIO_BATCH", "50")),
    mark_taken: bool = os.environ.get("SCENARIO_MARK_TAKEN") == "1",
    worker: str = WORKER,
    **settings: Any,
) -> tuple[App, Stream[Numbered]]:
    """A scenario app whose processor records ``key:seq:worker`` for each event."""
    app = App("scenario", **settings)
    numbered = app.stream(
        "numbered", record=Numbered, partition_by="key", partition_count=partitions
    )

    @app.processor(numbered)
    async def record(events: Events[Numbered]) -> None:
        async for items in events.take(batch, within=0.02):
            entries = [f"{e.key}:{e.seq}:{worker}" for e in items]
            if mark_taken:
                await app.redis.rpush(TAKEN, entries)
            if delay:
                await trio.sleep(delay)
            await app.redis.rpush(SEEN, entries)

    return app, numbered


app, numbered = make_app()
