"""An app whose stream the tests record in Redis with more partitions than it says (see
``tests/test_cli_read.py``): its worker must refuse it as configuration (exit code 2)."""

from __future__ import annotations

from streamkit import App, Events, Record

app = App("narrow")


class Tick(Record):
    n: int


ticks = app.stream("ticks", record=Tick, partition_by="n", partition_count=4)


@app.processor(ticks)
async def count(events: Events[Tick]) -> None:
    async for _ in events.records():
        pass
