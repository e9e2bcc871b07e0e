"""An app with a stream processor and jobs, for ``streamkit status --watch`` and
``streamkit dashboard``: what a small fleet runs.

- ``clicks`` (4 partitions) processed by ``count``, which adds each click to the
  Redis counter ``fleet:counted``;
- jobs ``hold`` (reports 25% progress, "holding", then sleeps ``seconds``, to keep a
  worker busy while others wait) and
  ``tally`` (returns at once), and ``fail`` (retried once, then dead).
"""

from __future__ import annotations

import trio

from streamkit import App, Backoff, Events, Record
from streamkit.jobs import progress

app = App("fleet")
COUNTED = "fleet:counted"


class Click(Record):
    user: str
    n: int


clicks = app.stream("clicks", record=Click, partition_by="user", partition_count=4)


@app.processor(clicks)
async def count(events: Events[Click]) -> None:
    async for batch in events.take(500, within=0.05):
        await app.redis.incrby(COUNTED, len(batch))


@app.job
async def hold(seconds: float) -> None:
    await progress(0.25, "holding")
    await trio.sleep(seconds)


@app.job
async def tally(n: int) -> int:
    return n


@app.job(retries=1, backoff=Backoff(initial=0.01, maximum=0.01, jitter=0))
async def fail(n: int) -> None:
    raise ValueError(f"fail {n}")
