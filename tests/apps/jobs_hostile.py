"""An app whose jobs meet hostile input, for ``tests/test_jobs_hostile.py``.

``ship`` takes an ``Order`` record, which producers on an older ``Order`` send without
its ``sku``; ``echo`` returns what it gets; ``big`` returns a string of ``n`` bytes;
``note_taker`` is a stream processor beside them, recording the events it sees in the
list ``hostile:seen``.
"""

from __future__ import annotations

from typing import Any

from streamkit import App, Events, Record

SEEN = "hostile:seen"

app = App("hostile")


class Order(Record):
    order_id: int
    sku: str


@app.job(retries=2)
async def ship(o: Order) -> str:
    return f"shipped {o.order_id} ({o.sku})"


@app.job
async def echo(value: Any) -> Any:
    return value


@app.job(retries=2)
async def big(n: int) -> str:
    return "x" * n


class Note(Record):
    key: str
    n: int


notes = app.stream("notes", record=Note, partition_by="key", partition_count=2)


@app.processor(notes)
async def note_taker(events: Events[Note]) -> None:
    async for note in events.records():
        await app.redis.rpush(SEEN, [f"{note.key}:{note.n}"])
