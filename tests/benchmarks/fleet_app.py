"""The app of ``bench_fleet.py``'s workers: one stream of ``FLEET_PARTITIONS``
partitions (from the environment, as the Redis URL) and a processor with nothing to
do: what an idle fleet costs Redis is its leases, reads and membership alone.

``app`` is what ``streamkit worker tests.benchmarks.fleet_app:app`` runs; ``make_app()``
builds another one alike, for ``fleet_host.py``'s several worker instances in one process
(each instance its own app, so its own connections)."""

from __future__ import annotations

import logging
import os

from streamkit import App, Events, Record

# The warning about more than 1,024 partitions a stream: said once by the bench.
logging.getLogger("streamkit.app").setLevel(logging.ERROR)


class Tick(Record):
    n: int


def make_app() -> App:
    """An app with the fleet's stream and its idle processor."""
    app = App(os.environ.get("FLEET_APP", "fleet"), redis_url=os.environ["FLEET_REDIS_URL"])
    ticks = app.stream(
        "ticks", record=Tick, partition_by="n", partition_count=int(os.environ["FLEET_PARTITIONS"])
    )

    @app.processor(ticks)
    async def idle(events: Events[Tick]) -> None:
        async for _ in events.records():
            pass

    return app


app = make_app()
