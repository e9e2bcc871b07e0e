"""A job worker's no-op jobs per second in one process, with the CPU each side spends.

Run with ``python tests/benchmarks/jobs_in_process.py`` inside .venv (``--jobs`` sets
how many, ``--rounds`` how many runs, ``--concurrency`` the worker's). Each round
queues the no-op jobs on a private redis-server, then runs
``JobQueue.serve(concurrency=...)`` in this same process until every one has run, and
prints the rate, the worker's CPU per job (``time.process_time``, this process), the
server's (``INFO cpu``) and the jobs per script call (``INFO commandstats``). Unlike
``bench_jobs.py`` (worker subprocesses, peers side by side), this is for a quick
before/after of the worker's own path: run it on two checkouts, alternating.
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import trio

from streamkit import open_redis
from streamkit.jobs import open_job_queue
from streamkit.testing import RedisServer


async def _cpu(redis: Any) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _script_calls(redis: Any) -> int:
    info = await redis.info("commandstats")
    return int(info.get("cmdstat_evalsha", {}).get("calls", 0))


async def one_round(url: str, jobs: int, concurrency: int) -> str:
    done = 0
    all_done = trio.Event()

    async def noop() -> None:
        nonlocal done
        done += 1
        if done == jobs:
            all_done.set()

    async with open_redis(url) as redis, open_job_queue(redis, "bench") as queue:
        await redis.flushall()
        await queue.job(noop).enqueue_many([() for _ in range(jobs)])
        server_cpu, calls = await _cpu(redis), await _script_calls(redis)
        began, cpu = time.perf_counter(), time.process_time()
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(queue.serve, concurrency=concurrency))
            await all_done.wait()
            nursery.cancel_scope.cancel()
        seconds = time.perf_counter() - began
        worker_us = (time.process_time() - cpu) / jobs * 1e6
        server_us = (await _cpu(redis) - server_cpu) / jobs * 1e6
        per_call = jobs / max(1, await _script_calls(redis) - calls)
    return (
        f"{jobs / seconds:>9,.0f} jobs/s   worker CPU {worker_us:5.1f} us/job   "
        f"redis-server CPU {server_us:5.1f} us/job   {per_call:4.1f} jobs per script call"
    )


async def main(jobs: int, rounds: int, concurrency: int) -> None:
    print(f"no-op jobs in one process: {jobs:,} per round, concurrency {concurrency}")
    with RedisServer() as server:
        for n in range(rounds):
            print(f"  round {n + 1}: {await one_round(server.url, jobs, concurrency)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    options = parser.parse_args()
    trio.run(main, options.jobs, options.rounds, options.concurrency)
