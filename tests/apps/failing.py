"""An app whose processor fails on every job with ``n % 10 == 3`` (dead-lettered)."""

from __future__ import annotations

from streamkit import App, Events, ExceptionPolicy, Record

app = App("failing")


class Job(Record):
    key: str
    n: int


jobs = app.stream("jobs", record=Job, partition_by="key", partition_count=2)


@app.processor(jobs, policy=ExceptionPolicy(action="dead_letter"))
async def handle(events: Events[Job]) -> None:
    async for job in events.records():
        if job.n % 10 == 3:
            raise ValueError(f"bad job {job.n}")
        await app.redis.rpush("failing:done", [str(job.n)])
