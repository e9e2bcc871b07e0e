"""An app for the debounce and throttle test with real processes: two ``streamkit
worker`` subprocesses serve it, two enqueuers (``python -m tests.apps.debouncing
enqueue ROUNDS SOURCE``) enqueue its jobs together.

- ``settle(user, n, source)``: debounced per user (``debounce=1.5``, ``max_wait=20``);
- ``notify(user, n, source)``: throttled per user (``throttle=60``).

Each run appends ``"<n> <source> <pid>"`` to ``bounce:runs:<job>:<user>``; each enqueue
appends ``"<id> <added>"`` to ``bounce:handles:<job>:<user>``.
"""

from __future__ import annotations

import os
import sys

import trio

from streamkit import App
from streamkit._redis import run_blocking

USERS = ("ann", "bob", "cy")
READY = "bounce:ready"
GO = "bounce:go"

app = App("bounce")


def runs_key(job: str, user: str) -> str:
    return f"bounce:runs:{job}:{user}"


def handles_key(job: str, user: str) -> str:
    return f"bounce:handles:{job}:{user}"


async def _record(job: str, user: str, n: int, source: str) -> None:
    await app.redis.rpush(runs_key(job, user), [f"{n} {source} {os.getpid()}"])


@app.job(debounce=1.5, max_wait=20.0, key="user")
async def settle(user: str, n: int, source: str) -> None:
    await _record("settle", user, n, source)


@app.job(throttle=60.0, key="user")
async def notify(user: str, n: int, source: str) -> None:
    await _record("notify", user, n, source)


async def enqueue(rounds: int, source: str) -> None:
    """Enqueue both jobs for every user, ``rounds`` times (``n`` = the round), once
    every enqueuer is ready: each says so (``INCR bounce:ready``), then blocks until the
    test pushes a token to ``bounce:go``."""
    async with app:
        await app.redis.incr(READY)
        await run_blocking(
            app.redis,
            lambda r: r.blpop([GO], timeout=20),
            within=25,
            what="waiting for the start",
        )
        for n in range(rounds):
            for user in USERS:
                for job in (settle, notify):
                    handle = await job.enqueue(user, n, source)
                    await app.redis.rpush(
                        handles_key(job.name, user), [f"{handle.id} {int(handle.added)}"]
                    )


if __name__ == "__main__":
    if sys.argv[1:2] != ["enqueue"]:
        sys.exit("usage: python -m tests.apps.debouncing enqueue ROUNDS SOURCE")
    trio.run(enqueue, int(sys.argv[2]), sys.argv[3])
