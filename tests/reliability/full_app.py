"""A scenario app for a full Redis: records each processing in a file, not in Redis.

Redis at ``maxmemory`` refuses the scenario app's ``RPUSH``; this app's processor
appends ``<time ns> key:seq:worker`` lines to ``$FULL_SEEN_DIR/<pid>.log`` instead, so that a
test sees what a worker consumed while Redis refused every write that grows memory.
``FULL_DELAY`` is seconds per batch (default 0.02), to keep a backlog around a while.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import trio

from streamkit import App, Events
from tests.apps.scenario import WORKER, Numbered

PARTITIONS = 4
DELAY = float(os.environ.get("FULL_DELAY", "0.02"))

app = App("scenario")
numbered = app.stream("numbered", record=Numbered, partition_by="key", partition_count=PARTITIONS)


@app.processor(numbered)
async def record(events: Events[Numbered]) -> None:
    path = Path(os.environ.get("FULL_SEEN_DIR", ".")) / f"{os.getpid()}.log"
    with path.open("a", encoding="utf-8") as out:
        async for items in events.take(20, within=0.02):
            await trio.sleep(DELAY)
            now = time.time_ns()  # orders the lines of several workers' files
            out.write("".join(f"{now} {e.key}:{e.seq}:{WORKER}\n" for e in items))
            out.flush()
