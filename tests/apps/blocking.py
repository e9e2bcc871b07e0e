"""An app whose processor blocks the event loop in synchronous code.

For every job, the processor appends its number to the list ``blocking:started``
and then calls ``time.sleep(job.seconds)``: the mistake of calling blocking code
from a processor.
"""

from __future__ import annotations

import time

from streamkit import App, Events, Record

STARTED = "blocking:started"

app = App("blocking")


class Job(Record):
    n: int
    seconds: float


jobs = app.stream("jobs", record=Job, partition_by="n", partition_count=2)


@app.processor(jobs)
async def sleepy(events: Events[Job]) -> None:
    async for job in events.records():
        await app.redis.rpush(STARTED, [str(job.n)])
        time.sleep(job.seconds)  # noqa: ASYNC251 - the mistake under test
