"""An app under the default exception policy (halt) for halt and resume tests.

The processor fails on every job listed in the Redis set ``halting:broken``
(``key:seq``), recording each attempt in the list ``halting:attempts``, and
appends ``key:seq`` to the list ``halting:done`` for every job it processes.
Removing a job from the set "fixes the bug".
"""

from __future__ import annotations

from streamkit import App, Events, Record

BROKEN = "halting:broken"
ATTEMPTS = "halting:attempts"
DONE = "halting:done"

app = App("halting")


class Job(Record):
    key: str
    seq: int


jobs = app.stream("jobs", record=Job, partition_by="key", partition_count=4)


@app.processor(jobs)
async def handle(events: Events[Job]) -> None:
    async for job in events.records():
        name = f"{job.key}:{job.seq}"
        if await app.redis.sismember(BROKEN, name):
            await app.redis.rpush(ATTEMPTS, [name])
            raise RuntimeError(f"boom on {name}")
        await app.redis.rpush(DONE, [name])
