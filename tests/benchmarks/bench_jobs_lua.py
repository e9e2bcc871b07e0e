"""The job queue's scripts at scale: the longest a single script call blocks Redis.

A Lua script runs to its end while Redis serves no one else, so each of the job
queue's scripts does a bounded amount of work per call and continues in further calls.
This measures, on one private redis-server, how many calls each kind of work took,
their mean duration (Redis' ``INFO commandstats``), their 99th percentile and the
longest one (its ``SLOWLOG``, which logs the calls over 1 ms): server time, no network
time. The longest call includes any moment the machine took the CPU from Redis (or
Redis grew a large table); the mean and the percentile hardly show those. Sizes far
past the usual:

* **settle**: a job with ``--dependents`` (100,000) dependents ends: aborted (they all
  end dead, in calls of ``SETTLE_BUDGET`` then ``SETTLE_STEP``), and succeeded (they
  are all queued). Beside it, the same work in one call, as the scripts did before
  (every dependent walked in the call that ended the job).
* **counts**: ``JobQueue.counts()`` of a queue of ``--queued`` (1,000,000) jobs, of
  which ``--pending`` (20,000) are claimed and running, then handed back (pending in
  the group, but queued); and the same count in one call, as before (every pending
  entry read in one call).
* **hand back**: a worker's ``--pending`` claimed jobs handed back (``RECOVER``).
* **claim**: ``--pending`` scheduled jobs all due at once, moved to their ready stream
  (at most ``DUE_BUDGET`` per claim) and started 200 per claim.
* **enqueue** and **finish**: the longest call while enqueueing the ``--queued`` jobs
  (250 a call), and of 100 outcomes recorded in one finish call.
* **limits and pauses**: ``--held`` (100,000) jobs of a job limited to 1 running held
  back by the claims that read them (``count + READ_BUDGET`` entries a call); the
  finish that gives the slot back (one let out); the same jobs held by a pause, let
  out by a resume (``UNPARK_BUDGET`` a call); and held by a rate limit whose window
  reopens, let out by the claims (``WAKE_BUDGET`` scopes, ``UNPARK_BUDGET`` jobs a call).

Run inside .venv: ``python tests/benchmarks/bench_jobs_lua.py`` (``--help`` for the
sizes; about 2 minutes and 1 GB of Redis memory at the defaults). The figures are in
docs/jobs.md ("Limits").
"""

from __future__ import annotations

import argparse
import math
import time
from typing import TYPE_CHECKING, Any

import trio

from streamkit import open_redis
from streamkit._lua import script
from streamkit._redis import LuaScript, call_once
from streamkit.jobs import JobCall, open_job_queue
from streamkit.jobs._claim import ensure_groups, hand_back
from streamkit.jobs._finish import settle_all
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from streamkit import Redis
    from streamkit.jobs import JobQueue

_ABORT = LuaScript(script("jobs/abort"))
_CLAIM = LuaScript(script("jobs/claim"))
_COUNTS = LuaScript(script("jobs/counts"))
_FINISH = LuaScript(script("jobs/finish"))
_SETTLE = LuaScript(script("jobs/settle"))

ROWS: list[tuple[str, str, str, str, str, str]] = []
#: Calls slower than this (microseconds) are logged, and the longest one shown: a log
#: of every call would log every command the scripts run too, and slow them down.
_SLOW_US = 1000


async def measure(redis: Redis, what: str, fn: Callable[[], Awaitable[Any]]) -> None:
    """Run ``fn`` and record the script calls it made: how many, their mean and their
    longest duration (server time)."""
    await redis.slowlog_reset()
    calls, usec = await script_stats(redis)
    started = time.perf_counter()
    await fn()
    wall = time.perf_counter() - started
    after_calls, after_usec = await script_stats(redis)
    calls, usec = after_calls - calls, after_usec - usec
    entries = await redis.slowlog_get(-1)
    slow = sorted(e.duration for e in entries if e.command and e.command[0].upper() == b"EVALSHA")
    mean = f"{usec / calls / 1000:.1f} ms" if calls else "-"
    # The calls under 1 ms are not logged: they are the fastest, below the slow ones.
    rank = math.ceil(0.99 * calls) - (calls - len(slow))
    p99 = f"{slow[rank - 1] / 1000:.1f} ms" if rank > 0 else f"< {_SLOW_US / 1000:g} ms"
    longest = f"{slow[-1] / 1000:.1f} ms" if slow else f"< {_SLOW_US / 1000:g} ms"
    ROWS.append((what, f"{calls:,}", mean, p99, longest, f"{wall:.2f} s"))
    print(
        f"{what:<62} calls {calls:>6,}  mean {mean:>8}  p99 {p99:>9}  longest {longest:>9}"
        f"  {wall:6.2f} s"
    )


async def script_stats(redis: Redis) -> tuple[int, int]:
    """EVALSHA calls so far, and the microseconds they took."""
    stats = await redis.info("commandstats")
    found = stats.get("cmdstat_evalsha") or {}
    assert isinstance(found, dict)
    return int(found.get("calls", 0)), int(found.get("usec", 0))


async def claim_all(queue: JobQueue, consumer: str, count: int) -> list[Any]:
    """Claim ``count`` jobs for ``consumer`` with the claim script, 200 a call."""
    keys = queue.shard_keys[0]
    claimed: list[Any] = []
    while len(claimed) < count:
        want = min(200, count - len(claimed))
        claim = (keys.base, consumer, want, 600_000, "0", 3, "{}")
        reply = await call_once(_CLAIM, queue.redis, keys.keys, claim, what="claiming")
        claimed.extend(reply[0])
        if not reply[0] and int(reply[1]) < 0:
            break
    return claimed


async def settle(redis: Redis, dependents: int) -> None:
    async with open_job_queue(redis, "settle") as queue:

        @queue.job
        async def step(n: int) -> int:
            return n

        keys = queue.shard_keys[0]
        await ensure_groups(queue, 0)
        killed = await step.delay(0)
        await step.enqueue_many([JobCall(args=(n,), after=[killed]) for n in range(dependents)])
        await measure(
            redis,
            f"settle: abort a job with {dependents:,} dependents (all dead)",
            lambda: queue.abort(killed.id),
        )

        done = await step.delay(0)
        await step.enqueue_many([JobCall(args=(n,), after=[done]) for n in range(dependents)])
        [job] = await claim_all(queue, "bench", 1)

        async def succeed() -> None:
            finish = (keys.base, 600_000, done.id, job[4], "ok", b"0", 1)
            await call_once(_FINISH, redis, keys.keys, finish, what="finishing")
            await settle_all(queue, 0)

        await measure(
            redis, f"settle: finish a job with {dependents:,} dependents (all queued)", succeed
        )

        before = await step.delay(0)
        await step.enqueue_many([JobCall(args=(n,), after=[before]) for n in range(dependents)])
        abort = (keys.base, before.id, "bench")
        await call_once(_ABORT, redis, keys.keys, abort, what="aborting")

        async def at_once() -> None:
            await call_once(
                _SETTLE, redis, keys.keys, (keys.base, 10 * dependents), what="settling"
            )

        await measure(redis, f"  as before: those {dependents:,} dependents in one call", at_once)


async def counts(redis: Redis, queued: int, pending: int) -> None:
    async with open_job_queue(redis, "counts") as queue:

        @queue.job
        async def step(n: int) -> int:
            return n

        keys = queue.shard_keys[0]
        await ensure_groups(queue, 0)
        batch = 100_000

        async def enqueue() -> None:
            for start in range(0, queued, batch):
                await step.enqueue_many([(n,) for n in range(start, min(queued, start + batch))])

        await measure(redis, f"enqueue: {queued:,} jobs, 250 a call", enqueue)
        claimed = await claim_all(queue, "bench", pending)
        await measure(redis, f"counts: {queued:,} queued, {len(claimed):,} running", queue.counts)

        async def finish() -> None:
            outcomes: list[Any] = []
            for job in claimed[:100]:
                outcomes.extend((job[0], job[4], "ok", b"1", 1))
            await call_once(
                _FINISH, redis, keys.keys, (keys.base, 600_000, *outcomes), what="finishing"
            )

        await measure(redis, "finish: 100 outcomes in one call", finish)
        await measure(
            redis,
            f"hand back: {len(claimed) - 100:,} claimed jobs",
            lambda: hand_back(queue, "bench", 0, []),
        )
        await measure(
            redis, f"counts: {queued:,} queued, {pending:,} of them handed back", queue.counts
        )

        async def at_once() -> None:
            every = (keys.base, 10 * queued, "-", "-", "-")
            await call_once(_COUNTS, redis, keys.keys, every, what="counting")

        await measure(redis, "  as before: those pending entries read in one call", at_once)


async def due(redis: Redis, jobs: int) -> None:
    async with open_job_queue(redis, "due") as queue:

        @queue.job
        async def step(n: int) -> int:
            return n

        await ensure_groups(queue, 0)
        await step.enqueue_many([(n,) for n in range(jobs)], delay=0.001)
        await trio.sleep(0.1)
        await measure(
            redis,
            f"claim: {jobs:,} scheduled jobs due at once, 200 started a call",
            lambda: claim_all(queue, "bench", jobs),
        )


async def held_back(redis: Redis, held: int) -> None:
    async with open_job_queue(redis, "limits") as queue:

        @queue.job(concurrency=1)
        async def one_at_a_time(n: int) -> int:
            return n

        @queue.job(rate_limit="100/0.5s")
        async def rated(n: int) -> int:
            return n

        keys = queue.shard_keys[0]
        await ensure_groups(queue, 0)

        async def claim_until_read(want: int = 200) -> list[Any]:
            claimed: list[Any] = []
            # until every entry is read: held back, or started (a started job's entry
            # stays, pending: its lease)
            while await redis.xlen(keys.ready(1)) > len(claimed):
                claim = (keys.base, "bench", want, 600_000, "0", 3, "{}")
                reply = await call_once(_CLAIM, redis, keys.keys, claim, what="claiming")
                claimed.extend(reply[0])
            return claimed

        await one_at_a_time.enqueue_many([(n,) for n in range(held)])
        claimed: list[Any] = []

        async def hold_all() -> None:
            claimed.extend(await claim_until_read())

        await measure(
            redis, f"limits: claims that hold back {held:,} jobs (concurrency 1)", hold_all
        )

        async def give_back() -> None:
            [job] = claimed
            finish = (keys.base, 600_000, job[0], job[4], "ok", b"0", 1)
            await call_once(_FINISH, redis, keys.keys, finish, what="finishing")

        await measure(
            redis, f"limits: a slot given back, {held - 1:,} held (one let out)", give_back
        )
        await redis.flushall()
        await ensure_groups(queue, 0)
        await queue.pause(one_at_a_time)
        await one_at_a_time.enqueue_many([(n,) for n in range(held)])
        await claim_until_read(1)  # the paused name: every entry read is held
        await measure(
            redis,
            f"pause: resume a job name with {held:,} held",
            lambda: queue.resume(one_at_a_time),
        )
        await redis.flushall()
        await ensure_groups(queue, 0)
        await rated.enqueue_many([(n,) for n in range(held)])
        await claim_until_read()
        await trio.sleep(0.6)  # the window reopens

        async def one_claim() -> None:
            claim = (keys.base, "bench", 200, 600_000, "0", 3, "{}")
            await call_once(_CLAIM, redis, keys.keys, claim, what="claiming")

        await measure(redis, f"limits: a rate window reopens, {held:,} held (a claim)", one_claim)


async def run(args: argparse.Namespace) -> None:
    async with trio.open_nursery() as nursery:
        server: RedisServer = await nursery.start(RedisServer().run)
        async with open_redis(server.url) as redis:
            await redis.config_set(
                {"slowlog-log-slower-than": _SLOW_US, "slowlog-max-len": 100_000}
            )
            await settle(redis, args.dependents)
            await redis.flushall()
            await counts(redis, args.queued, args.pending)
            await redis.flushall()
            await due(redis, args.pending)
            await redis.flushall()
            await held_back(redis, args.held)
        nursery.cancel_scope.cancel()
    print()
    print("| what | calls | mean call | 99th percentile | longest call | time |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in ROWS:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dependents", type=int, default=100_000)
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--held", type=int, default=100_000)
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
