"""Apps for the job queue's crash tests: their jobs record in Redis what they do.

Every start and every end of a job's function is recorded under the job's tag (the
tests enqueue each job with its tag as its id): ``INCR jobs:starts:<tag>`` /
``jobs:ends:<tag>``, and ``RPUSH jobs:log:<tag>`` of ``"start <pid> <time>"`` /
``"end <pid> <time>"``, so a test counts executions and sees which worker ran each.

The records go to the server of ``JOBS_MARKERS_URL`` (the app's own server by
default), through a client the worker's background task opens: a test that restarts
the queue's server keeps them on another one.

- ``app`` (queue ``jobs``): ``hold``, ``poison``, ``work``, ``blocker``, ``limited``,
  ``exits``, ``exits_in_thread``, ``naps``, ``settles``; for
  ``streamkit worker tests.apps.jobs_app:app``.
- ``cron_app`` (queue ``jobcron``): ``tick``, every second.
- ``mixed`` (queue ``jobmixed``): a job and a stream processor in one app.

``python -m tests.apps.jobs_app race ROUNDS`` enqueues ``work`` with the ids
``race-0`` ... once each, starting together with the other racing processes (see
:func:`race`).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import trio

from streamkit import App, Backoff, Events, Record, Redis, open_redis
from streamkit._redis import run_blocking

PID = os.getpid()
EVENTS_SEEN = "jobs:mixed:seen"
RACE_READY = "jobs:race:ready"
RACE_GO = "jobs:race:go"

_markers: Redis | None = None
_markers_ready = trio.Event()


def starts_key(tag: str) -> str:
    return f"jobs:starts:{tag}"


def ends_key(tag: str) -> str:
    return f"jobs:ends:{tag}"


def log_key(tag: str) -> str:
    return f"jobs:log:{tag}"


def with_markers(app: App) -> App:
    """Give ``app``'s workers the markers client (a background task holds it open), on
    the server of ``JOBS_MARKERS_URL`` (the app's own by default)."""

    @app.task
    async def markers_client() -> None:
        global _markers
        url = os.environ.get("JOBS_MARKERS_URL") or app.settings.redis_url
        async with open_redis(url, give_up_after=10) as client:
            _markers = client
            _markers_ready.set()
            await trio.sleep_forever()

    return app


async def markers() -> Redis:
    """The markers client of a worker of an app given it by :func:`with_markers`."""
    await _markers_ready.wait()
    assert _markers is not None
    return _markers


async def _record(kind: str, tag: str) -> int:
    """Record a start or end of job ``tag``; return how many there are now."""
    client = await markers()
    # The log entry first: a test that sees the count sees the entry too.
    await client.rpush(log_key(tag), [f"{kind} {PID} {time.time()}"])
    count: int = await client.incr(f"jobs:{kind}s:{tag}")
    return count


def _current_job_id() -> str:
    from streamkit.jobs import current_job

    return current_job().id


app = with_markers(App("jobs"))


@app.job
async def hold(tag: str, seconds: float) -> int:
    """On its first start, take ``seconds``; on later starts, end at once.

    Returns the pid of the worker that ran it. (A try lost with its worker is spent:
    the default retries, 3, let it survive a few.)
    """
    if await _record("start", tag) == 1:
        await trio.sleep(seconds)
    await _record("end", tag)
    return PID


@app.job
async def poison(tag: str) -> None:
    """Kill the worker running it, every time (SIGKILL: no clean-up at all)."""
    await _record("start", tag)
    os.kill(PID, signal.SIGKILL)


@app.job
async def work(tag: str, seconds: float = 0.0) -> int:
    """Take ``seconds``; return the worker's pid."""
    await _record("start", tag)
    if seconds:
        await trio.sleep(seconds)
    await _record("end", tag)
    return PID


@app.job
async def blocker(tag: str, seconds: float) -> int:
    """On its first start, block the worker's event loop for ``seconds`` (a bug of
    the job's: no lease is renewed meanwhile); on later starts, end at once."""
    if await _record("start", tag) == 1:
        time.sleep(seconds)  # noqa: ASYNC251 (the point)
    await _record("end", tag)
    return PID


@app.job(concurrency=2, rate_limit="5/s", limit_key="account", key_concurrency=1)
async def limited(tag: str, account: str, seconds: float) -> int:
    """Limited across the fleet: 2 running, 5 started per second, 1 running per
    account. Records its start and end like the others; returns the worker's pid."""
    await _record("start", tag)
    await trio.sleep(seconds)
    await _record("end", tag)
    return PID


QUICK_RETRY = Backoff(initial=0.05, maximum=0.05, jitter=0)


@app.job(retries=1, backoff=QUICK_RETRY)
async def exits(tag: str) -> None:
    """Call ``sys.exit(3)``, every time (a try that fails; the worker goes on)."""
    await _record("start", tag)
    sys.exit(3)


@app.job(retries=1, backoff=QUICK_RETRY)
def exits_in_thread(tag: str) -> None:
    """As :func:`exits`, a plain ``def``: in a worker thread."""
    trio.from_thread.run(_record, "start", tag)
    sys.exit(3)


@app.job(retries=0)
def naps(tag: str, seconds: float) -> int:
    """A plain ``def``: take ``seconds`` in its thread; return the worker's pid."""
    trio.from_thread.run(_record, "start", tag)
    time.sleep(seconds)
    trio.from_thread.run(_record, "end", tag)
    return PID


@app.job(debounce=1.0, key="tag")
async def settles(tag: str) -> None:
    """Debounced by its tag: a schedule cannot enqueue it (its ticks have ids)."""
    await _record("start", tag)


cron_app = with_markers(App("jobcron"))


@cron_app.cron("* * * * * *")  # croniter's optional sixth field: seconds
async def tick() -> None:
    tag = _current_job_id()
    await _record("start", tag)
    await _record("end", tag)


class Note(Record):
    key: str
    n: int


mixed = with_markers(App("jobmixed"))
notes = mixed.stream("notes", record=Note, partition_by="key", partition_count=2)


@mixed.processor(notes)
async def note_taker(events: Events[Note]) -> None:
    async for note in events.records():
        await mixed.redis.rpush(EVENTS_SEEN, [f"{note.key}:{note.n}"])


@mixed.job
async def mixed_work(tag: str) -> int:
    await _record("start", tag)
    await _record("end", tag)
    return PID


async def race(rounds: int) -> None:
    """Enqueue ``work`` as ``race-0`` ... ``race-<rounds - 1>``, one call per id, after
    every racing process is ready: each says so (``INCR jobs:race:ready``), then
    blocks until the test pushes a token to ``jobs:race:go``."""
    async with app:
        await app.redis.incr(RACE_READY)
        await run_blocking(
            app.redis,
            lambda r: r.blpop([RACE_GO], timeout=20),
            within=25,
            what="waiting for the start of the race",
        )
        for i in range(rounds):
            await work.enqueue(f"race-{i}", job_id=f"race-{i}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["race"]:
        sys.exit("usage: python -m tests.apps.jobs_app race ROUNDS")
    trio.run(race, int(sys.argv[2]))
