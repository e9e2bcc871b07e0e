"""An app for the bad-input reliability scenario: poison, malformed and good events.

Good jobs are recorded like :mod:`tests.apps.scenario` does (``key:seq:worker`` in
``scenario:seen``). A job with ``poison=True`` makes the processor raise every time;
each attempt is recorded in ``poison:attempts``. The policy retries twice, then
dead-letters; undecodable entries and entries delivered more than three times are
dead-lettered without reaching the processor.
"""

from __future__ import annotations

from typing import Any

from streamkit import App, Backoff, Events, ExceptionPolicy, Record, Stream
from tests.apps.scenario import SEEN, WORKER

ATTEMPTS = "poison:attempts"
RETRIES = 2
MAX_DELIVERIES = 3


class Job(Record):
    key: str
    seq: int
    poison: bool = False


POLICY = ExceptionPolicy(
    action="retry",
    retries=RETRIES,
    backoff=Backoff(initial=0.01, maximum=0.05),
    on_exhausted="dead_letter",
    max_deliveries=MAX_DELIVERIES,
)


def make_app(**settings: Any) -> tuple[App, Stream[Job]]:
    """The app (name ``poison``, processor ``handle``) and its stream ``jobs``."""
    app = App("poison", **settings)
    jobs = app.stream("jobs", record=Job, partition_by="key", partition_count=4)

    @app.processor(jobs, policy=POLICY)
    async def handle(events: Events[Job]) -> None:
        async for job in events.records():
            if job.poison:
                await app.redis.rpush(ATTEMPTS, [f"{job.key}:{job.seq}"])
                raise ValueError(f"poison job {job.key}:{job.seq}")
            await app.redis.rpush(SEEN, [f"{job.key}:{job.seq}:{WORKER}"])

    return app, jobs


app, jobs = make_app()
