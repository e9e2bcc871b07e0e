"""The app of ``bench_fleet.py``'s worker processes: one stream of ``FLEET_PARTITIONS``
partitions (from the environment, as the Redis URL) and a processor with nothing to
do: what an idle fleet costs Redis is its leases, reads and membership alone."""

from __future__ import annotations

import logging
import os

from streamkit import App, Events, Record

# The warning about more than 1,024 partitions a stream: said once by the bench.
logging.getLogger("streamkit.app").setLevel(logging.ERROR)


class Tick(Record):
    n: int


app = App(os.environ.get("FLEET_APP", "fleet"), redis_url=os.environ["FLEET_REDIS_URL"])
ticks = app.stream(
    "ticks", record=Tick, partition_by="n", partition_count=int(os.environ["FLEET_PARTITIONS"])
)


@app.processor(ticks)
async def idle(events: Events[Tick]) -> None:
    async for _ in events.records():
        pass
