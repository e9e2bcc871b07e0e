"""An app for the log tests: its processor fails on one event (the default policy
halts that partition), and its job ``flaky`` fails on every try (one retry, then dead).

Each event processed increments the counter ``logged:done``.
"""

from __future__ import annotations

from streamkit import App, Backoff, Events, Record

DONE = "logged:done"
#: The event the processor raises on.
BAD = 13

app = App("logged")


class Item(Record):
    key: str
    n: int


items = app.stream("items", record=Item, partition_by="key", partition_count=4)


@app.processor(items)
async def handle(events: Events[Item]) -> None:
    async for item in events.records():
        if item.n == BAD:
            raise RuntimeError(f"boom on item {item.n}")
        await app.redis.incr(DONE)


@app.job(retries=1, backoff=Backoff(initial=0.01, maximum=0.01, jitter=0))
async def flaky(n: int) -> None:
    raise ValueError(f"flaky job {n} fails")
