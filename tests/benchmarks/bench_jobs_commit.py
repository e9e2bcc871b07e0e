"""Jobs enqueued in the commit: a processor enqueuing one job per event, against one
that only acknowledges and one that emits a record per event.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_jobs_commit.py`` inside
.venv). One process, one private redis-server, the same backlog for every variant
(``--events`` small records over ``--partitions`` partitions), one worker
(``run_worker``, serving no job queue: the jobs are enqueued, not run), side by side in
each round:

* **acknowledge only**: a ``records()`` processor with a trivial body;
* **emit a record**: ``events.emit(out, record)`` per event (exactly once, in the
  commit);
* **enqueue a job**: ``events.enqueue(job, n)`` per event (exactly once: the commit
  writes it to the partition's outbox, the relay runs the enqueue script on the job's
  shard).

Each variant runs until every event is committed and, for the jobs, every job is on
its queue. Measured as CPU time, not wall time (the machine is shared): the worker
process's (``time.process_time``) and redis-server's (``INFO`` ``used_cpu_*``) per
event, and their ratios to acknowledging only; events/s of wall time are printed too.

Then no-op jobs (``--jobs`` of them, one worker in the process, concurrency 32), side by
side in each round: with job events off, and on (the default; the next variants too);
reporting ``current_job().progress(i)`` 10 times each; emitting one record each with
``current_job().emit``; streaming 10 chunks each with ``current_job().stream``. CPU per
job of the process and of redis-server, and the ratios to the job with events off.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Literal

import trio

from streamkit import App, Events, Record, open_redis, run_worker
from streamkit.testing import RedisServer, wait_until

Variant = Literal["ack", "emit", "enqueue"]
TITLES: dict[Variant, str] = {
    "ack": "acknowledge only",
    "emit": "emit a record per event",
    "enqueue": "enqueue a job per event",
}


class Order(Record):
    customer: str
    n: int


async def redis_cpu(redis: Any) -> float:
    info: Any = await redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def bench_variant(
    redis_url: str, variant: Variant, n: int, partitions: int
) -> tuple[float, float, float]:
    """(events/s, worker CPU µs per event, Redis CPU µs per event) of one run."""
    app = App(f"jc{time.monotonic_ns()}", redis_url=redis_url)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=partitions)
    out = app.stream("out", record=Order, partition_by="customer", partition_count=partitions)
    done = 0
    finished = trio.Event()

    def tick() -> None:
        nonlocal done
        done += 1
        if done == n:
            finished.set()

    # The enqueued jobs go to a queue the worker does not serve: enqueued, not run.
    @app.job(queue="receipts")
    async def receipt(n: int) -> None:
        return None

    @app.job
    async def served() -> None:
        return None

    if variant == "ack":

        @app.processor(orders)
        async def acknowledging(events: Events[Order]) -> None:
            async for _ in events.records():
                tick()

    elif variant == "emit":

        @app.processor(orders, outputs=[out])
        async def emitting(events: Events[Order]) -> None:
            async for order in events.records():
                events.emit(out, order)
                tick()

    else:

        @app.processor(orders, jobs=[receipt])
        async def enqueueing(events: Events[Order]) -> None:
            async for order in events.records():
                events.enqueue(receipt, order.n)
                tick()

    async with app:
        await orders.send_many([Order(customer=f"c{i % 1000}", n=i) for i in range(n)])
        group = orders.spec.processor(next(iter(app.processors))).group

        async def committed() -> bool:
            pending = 0
            for partition in range(partitions):
                summary: Any = await app.redis.xpending(orders.key(partition), group)
                pending += int(summary[0])
            if pending:
                return False
            if variant != "enqueue":
                return True
            shard = app.job_queues["receipts"].shard_keys[0]
            counts: Any = await app.redis.hget(shard.counts, "sent|receipt")
            return counts is not None and int(counts) == n

        cpu0, redis0, wall0 = time.process_time(), await redis_cpu(app.redis), time.perf_counter()
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(
                lambda task_status: run_worker(app, queues=["default"], task_status=task_status)
            )
            await finished.wait()
            await wait_until(committed, what="every event committed", within=120, interval=0.01)
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0
            await worker.stop()
        redis_used = await redis_cpu(app.redis) - redis0
    return n / wall, cpu / n * 1e6, redis_used / n * 1e6


JobVariant = Literal["off", "plain", "progress", "emit", "stream"]
JOB_TITLES: dict[JobVariant, str] = {
    "off": "no-op job, events off",
    "plain": "no-op job, events on",
    "progress": "+ progress() x10",
    "emit": "+ emit() one record",
    "stream": "+ stream() 10 chunks",
}


async def bench_jobs(redis_url: str, variant: JobVariant, n: int) -> tuple[float, float, float]:
    """(jobs/s, process CPU µs per job, Redis CPU µs per job) of one run."""
    from streamkit.jobs import current_job

    app = App(f"jn{time.monotonic_ns()}", redis_url=redis_url)
    out = app.stream("out", record=Order, partition_by="customer", partition_count=8)
    done = 0
    finished = trio.Event()

    @app.job(keep_result=False)
    async def noop(i: int) -> None:
        nonlocal done
        if variant == "progress":
            job = current_job()
            for step in range(10):
                job.progress(step)
        elif variant == "emit":
            current_job().emit(out, Order(customer=f"c{i % 1000}", n=i))
        elif variant == "stream":
            job = current_job()
            for step in range(10):
                job.stream(step)
        done += 1
        if done == n:
            finished.set()

    async with app:
        await app.job_queue.set_events(variant != "off")
        await noop.enqueue_many((i,) for i in range(n))
        shard = app.job_queue.shard_keys[0]

        async def all_succeeded() -> bool:
            counts: Any = await app.redis.hget(shard.counts, "success|noop")
            return counts is not None and int(counts) == n

        cpu0, redis0, wall0 = time.process_time(), await redis_cpu(app.redis), time.perf_counter()
        async with trio.open_nursery() as nursery:
            await nursery.start(app.job_queue.serve)
            await finished.wait()
            await wait_until(all_succeeded, what="every job recorded", within=120, interval=0.01)
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0
            nursery.cancel_scope.cancel()
        redis_used = await redis_cpu(app.redis) - redis0
    return n / wall, cpu / n * 1e6, redis_used / n * 1e6


async def run(args: argparse.Namespace) -> None:
    print(
        f"\nJobs in the commit: {args.events:,} events, {args.partitions} partitions, one "
        f"worker; best of {args.rounds} rounds, variants side by side in each round\n"
    )
    best: dict[Variant, tuple[float, float, float]] = {}
    with RedisServer() as server:
        for _ in range(args.rounds):
            for variant in TITLES:
                async with open_redis(server.url) as redis:
                    await redis.flushall()
                rate, cpu, redis_us = await bench_variant(
                    server.url, variant, args.events, args.partitions
                )
                old = best.get(variant)
                if old is None or cpu + redis_us < old[1] + old[2]:
                    best[variant] = (rate, cpu, redis_us)
        jobs_best: dict[JobVariant, tuple[float, float, float]] = {}
        for _ in range(args.rounds):
            for job_variant in JOB_TITLES:
                async with open_redis(server.url) as redis:
                    await redis.flushall()
                measured = await bench_jobs(server.url, job_variant, args.jobs)
                old_job = jobs_best.get(job_variant)
                if old_job is None or measured[1] + measured[2] < old_job[1] + old_job[2]:
                    jobs_best[job_variant] = measured
    ack_cpu, ack_redis = best["ack"][1], best["ack"][2]
    print(
        f"  {'':<28}{'events/s':>10}{'worker µs/ev':>14}{'vs ack':>8}{'Redis µs/ev':>13}"
        f"{'vs ack':>8}"
    )
    for variant, title in TITLES.items():
        rate, cpu, redis_us = best[variant]
        print(
            f"  {title:<28}{rate:>10,.0f}{cpu:>14.1f}{cpu / ack_cpu:>7.2f}x{redis_us:>13.2f}"
            f"{redis_us / ack_redis:>7.2f}x"
        )
    _print_jobs(jobs_best, args.jobs)


def _print_jobs(jobs_best: dict[JobVariant, tuple[float, float, float]], n: int) -> None:
    plain_cpu, plain_redis = jobs_best["off"][1], jobs_best["off"][2]
    print(f"\n  No-op jobs, {n:,} of them, one worker in the process:")
    print(
        f"  {'':<28}{'jobs/s':>10}{'CPU µs/job':>14}{'vs off':>10}"
        f"{'Redis µs/job':>14}{'vs off':>10}"
    )
    for variant, title in JOB_TITLES.items():
        rate, cpu, redis_us = jobs_best[variant]
        print(
            f"  {title:<28}{rate:>10,.0f}{cpu:>14.1f}{cpu / plain_cpu:>9.2f}x{redis_us:>14.2f}"
            f"{redis_us / plain_redis:>9.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trio.run(run, args)


if __name__ == "__main__":
    main()
