"""The job queue with real ``streamkit worker`` subprocesses: kills, pauses, stops,
a Redis restart, cron ticks and enqueue races across processes.

The jobs (``tests/apps/jobs_app.py``) record every start and end of their functions
in Redis, keyed by the job's tag (also its id), so each test counts executions, and
reads the queue's own record of the job (status, tries, lost, result, worker).
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio
from coredis.response.types import StreamPending

from streamkit import App, open_redis
from streamkit.jobs import JobCall, JobFailed, JobHandle, JobQueue, JobStatus, open_job_queue
from streamkit.jobs._serve import PUT_BACK_WITHIN
from streamkit.testing import wait_until
from tests.apps import jobs_app
from tests.apps.jobs_app import Note, ends_key, log_key, starts_key
from tests.workers import FAST_ENV, ROOT, WorkerProcess, start_worker

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from streamkit.jobs import Job
    from streamkit.testing import RedisServer

APP = "tests.apps.jobs_app:app"
LEASE_TTL = 2.0
FAST_LEASE = {"STREAMKIT_JOB_LEASE_TTL": f"{LEASE_TTL:g}"}
THREADS_2 = {"STREAMKIT_JOB_THREADS": "2"}
SERVING = "serving jobs of queue"


def start_job_worker(
    url: str,
    log_dir: Path,
    *,
    app: str = APP,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> WorkerProcess:
    return start_worker(url, log_dir, app=app, env=env, args=args)


async def wait_serving(*workers: WorkerProcess) -> None:
    """Wait until each worker serves its app's jobs (or fail with its log if it died)."""
    for worker in workers:

        def serving(worker: WorkerProcess = worker) -> bool:
            if worker.process.poll() is not None:
                raise AssertionError(f"worker exited early:\n{worker.log()}")
            return SERVING in worker.log()

        await wait_until(serving, what=f"worker {worker.pid} serving jobs", within=15)


async def enqueue(queue: JobQueue, job: Job[Any, Any], tag: str, *args: Any) -> JobHandle[Any]:
    """Enqueue ``job(tag, *args)`` with ``tag`` as its id."""
    [handle] = await queue.enqueue_calls(job, [JobCall(args=(tag, *args), job_id=tag)])
    return handle


async def count(redis: Redis, key: str) -> int:
    return int(await redis.get(key) or 0)


async def runs(redis: Redis, tag: str) -> list[tuple[str, int, float]]:
    """The recorded starts and ends of job ``tag``: (kind, pid, time) each."""
    entries = []
    for raw in await redis.lrange(log_key(tag), 0, -1):
        kind, pid, at = raw.decode().split()
        entries.append((kind, int(pid), float(at)))
    return entries


async def wait_started(redis: Redis, tag: str, times: int = 1) -> int:
    """Wait until job ``tag`` has started ``times`` times; the pid of the last start."""

    async def started() -> bool:
        return await count(redis, starts_key(tag)) >= times

    await wait_until(started, what=f"job {tag} started {times} time(s)", within=15)
    return [pid for kind, pid, _ in await runs(redis, tag) if kind == "start"][times - 1]


def by_pid(workers: list[WorkerProcess], pid: int) -> tuple[WorkerProcess, WorkerProcess]:
    """(the worker with ``pid``, the other one) of two workers."""
    [chosen] = [w for w in workers if w.pid == pid]
    [other] = [w for w in workers if w.pid != pid]
    return chosen, other


def assert_clean(worker: WorkerProcess) -> None:
    log = worker.log()
    assert "Traceback" not in log, log


# ---------------------------------------------------------------------------- crashes


@pytest.mark.cluster
@pytest.mark.timeout(40)
async def test_kill_9_during_a_job_runs_it_once_more_on_another_worker(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    workers.extend(start_job_worker(redis_url, tmp_path, env=FAST_LEASE) for _ in range(2))
    await wait_serving(*workers)
    async with open_job_queue(redis, "jobs", lease_ttl=LEASE_TTL) as queue:
        handle = await enqueue(queue, jobs_app.hold, "killed", 60.0)
        victim, survivor = by_pid(workers, await wait_started(redis, "killed"))

        killed_at = time.time()
        victim.kill()
        assert await victim.wait_exit() == -signal.SIGKILL

        assert await handle.result(timeout=LEASE_TTL + 10) == survivor.pid
        info = await handle.info()
        counts = await queue.counts()

    takeover = info.started_at.timestamp() - killed_at if info.started_at else float("inf")
    print(f"kill -9 to take-over: {takeover:.3f}s (lease_ttl {LEASE_TTL:g}s)")
    # The lost try's lease runs out lease_ttl after its last renewal (before the
    # kill), and an idle worker looks for such jobs every RECLAIM_INTERVAL (0.5 s):
    # the result's timeout above is the bound, with slack for a loaded CI machine.

    assert [(kind, pid) for kind, pid, _ in await runs(redis, "killed")] == [
        ("start", victim.pid),
        ("start", survivor.pid),
        ("end", survivor.pid),
    ]
    assert info.status is JobStatus.SUCCESS
    assert (info.tries, info.lost) == (2, 1)  # the lost try counts
    assert f"-{survivor.pid}-" in (info.worker or "")
    assert (counts.succeeded, counts.dead, counts.pending) == (1, 0, 0)
    assert_clean(survivor)


@pytest.mark.cluster
@pytest.mark.timeout(40)
async def test_a_worker_paused_past_its_lease_commits_nothing_when_it_wakes(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    workers.extend(start_job_worker(redis_url, tmp_path, env=FAST_LEASE) for _ in range(2))
    await wait_serving(*workers)
    async with open_job_queue(redis, "jobs", lease_ttl=LEASE_TTL) as queue:
        # Its first try takes 1 s, which runs out while its worker is paused: woken,
        # that worker has a result to commit.
        handle = await enqueue(queue, jobs_app.hold, "paused", 1.0)
        sleeper, survivor = by_pid(workers, await wait_started(redis, "paused"))
        sleeper.send_signal(signal.SIGSTOP)
        try:
            assert await handle.result(timeout=LEASE_TTL + 10) == survivor.pid
            before = await handle.info()
        finally:
            sleeper.send_signal(signal.SIGCONT)

        def warned() -> bool:
            log = sleeper.log()
            return "taken over by another worker" in log or "not recorded" in log

        await wait_until(warned, what="the woken worker's warning", within=10)
        after = await handle.info()
        assert await handle.result(timeout=1) == survivor.pid
        counts = await queue.counts()

    assert before.status is JobStatus.SUCCESS
    assert after == before  # status, result, finish time, worker: all the survivor's
    assert (after.tries, after.lost) == (2, 1)
    assert counts.succeeded == 1
    starts = [pid for kind, pid, _ in await runs(redis, "paused") if kind == "start"]
    assert starts == [sleeper.pid, survivor.pid]
    assert sleeper.process.poll() is None  # it goes on serving
    assert_clean(sleeper)
    assert_clean(survivor)


@pytest.mark.cluster
@pytest.mark.timeout(60)
async def test_a_job_that_kills_its_worker_every_time_ends_dead(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    env = {"STREAMKIT_JOB_LEASE_TTL": "1"}
    async with open_job_queue(redis, "jobs", lease_ttl=1) as queue:
        handle = await enqueue(queue, jobs_app.poison, "poison")
        # One worker at a time: each takes the job over from the last one, and dies.
        for deliveries in range(1, 4):
            worker = start_job_worker(redis_url, tmp_path, env=env)
            workers.append(worker)
            assert await worker.wait_exit(within=20) == -signal.SIGKILL, worker.log()
            assert await count(redis, starts_key("poison")) == deliveries
        # The next one finds it lost max_deliveries (3) times: dead, not run again
        # (its tries, 4 with the default 3 retries, would have allowed one more).
        last = start_job_worker(redis_url, tmp_path, env=env)
        workers.append(last)
        with pytest.raises(JobFailed) as failed:
            await handle.result(timeout=20)
        info = await handle.info()
        counts = await queue.counts()
        keys = queue.shard_keys[0]
        queued = await redis.xlen(keys.ready(1))
        pending = await redis.xpending(keys.ready(1), "workers")

    assert failed.value.status == "dead"
    assert failed.value.error_type == "WorkerLost"
    assert "max_deliveries" in failed.value.message
    assert (info.status, info.tries, info.lost) == (JobStatus.DEAD, 3, 3)
    assert await count(redis, starts_key("poison")) == 3
    assert await count(redis, ends_key("poison")) == 0
    # Its entry is gone from the ready stream, so nothing can deliver it again.
    assert isinstance(pending, StreamPending)
    assert (queued, pending.pending) == (0, 0)
    assert (counts.dead, counts.pending) == (1, 0)
    assert [job.id for job in await queue.dead_letters()] == ["poison"]
    assert last.process.poll() is None
    assert_clean(last)


@pytest.mark.timeout(40)
async def test_a_job_calling_sys_exit_fails_its_tries_and_its_worker_goes_on(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    workers.append(start_job_worker(redis_url, tmp_path, env=FAST_LEASE))
    [worker] = workers
    await wait_serving(worker)
    async with open_job_queue(redis, "jobs", lease_ttl=LEASE_TTL) as queue:
        for job, tag in ((jobs_app.exits, "exit-async"), (jobs_app.exits_in_thread, "exit-def")):
            handle = await enqueue(queue, job, tag)
            with pytest.raises(JobFailed) as failed:
                await handle.result(timeout=15)
            info = await handle.info()
            assert (failed.value.error_type, failed.value.message) == ("SystemExit", "3")
            # Both tries (retries=1) ran, failed and were spent: none was lost.
            assert (info.status, info.tries, info.lost) == (JobStatus.DEAD, 2, 0)
            assert await count(redis, starts_key(tag)) == 2
            assert info.worker is not None
            assert info.worker.split("-")[-2] == str(worker.pid)
        # The worker lives on, and runs the next job.
        assert await (await enqueue(queue, jobs_app.work, "after")).result(timeout=10) == worker.pid
        dead = [job.id for job in await queue.dead_letters()]
    assert sorted(dead) == ["exit-async", "exit-def"]
    assert worker.process.poll() is None
    assert "ExceptionGroup" not in worker.log()


@pytest.mark.timeout(40)
async def test_def_jobs_beyond_a_workers_threads_stay_queued_and_survive_its_kill_9(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    workers.append(start_job_worker(redis_url, tmp_path, env=FAST_LEASE | THREADS_2))
    [victim] = workers
    await wait_serving(victim)
    tags = [f"nap-{i}" for i in range(4)]
    async with open_job_queue(redis, "jobs", lease_ttl=LEASE_TTL) as queue:
        handles = [await enqueue(queue, jobs_app.naps, tag, 60.0) for tag in tags]

        async def started(n: int) -> bool:
            return sum([await count(redis, starts_key(tag)) for tag in tags]) == n

        # A worker of 2 threads runs 2 and claims no more: 2 stay queued.
        await wait_until(functools.partial(started, 2), what="2 naps started", within=15)
        statuses = [(await handle.info()).status for handle in handles]
        assert sorted(statuses) == sorted([JobStatus.EXECUTING] * 2 + [JobStatus.SENT] * 2)
        ran_there = [tag for tag in tags if await count(redis, starts_key(tag))]
        # Killed, it loses the 2 it ran (retries=0: dead), and only those: another
        # worker runs the 2 it never claimed, and takes the lost ones over.
        victim.kill()
        workers.append(start_job_worker(redis_url, tmp_path, env=FAST_LEASE))
        await wait_serving(workers[1])
        await wait_until(functools.partial(started, 4), what="4 naps started", within=15)

        async def lost() -> bool:
            return len(await queue.dead_letters()) == 2

        await wait_until(lost, what="the killed worker's naps dead", within=20)
        infos = {tag: await handle.info() for tag, handle in zip(tags, handles, strict=True)}
    dead = {tag for tag, info in infos.items() if info.status == JobStatus.DEAD}
    assert dead == set(ran_there)
    errors = [infos[tag].error for tag in dead]
    assert [error.type if error else None for error in errors] == ["WorkerLost"] * 2
    others = [info for tag, info in infos.items() if tag not in dead]
    assert [(info.status, info.tries) for info in others] == [(JobStatus.EXECUTING, 1)] * 2
    assert all(info.worker and info.worker.split("-")[-2] == str(workers[1].pid) for info in others)


@pytest.mark.timeout(40)
async def test_a_schedule_of_a_debounced_job_is_said_once_and_its_worker_goes_on(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    workers.append(start_job_worker(redis_url, tmp_path, env=FAST_LEASE))
    [worker] = workers
    await wait_serving(worker)
    # Set by a producer that cannot check it (a queue by name alone knows no jobs).
    async with open_job_queue(redis, "jobs") as by_name:
        await by_name.set_schedule("bad", "settles", "* * * * * *", args=["x"])
        await by_name.set_schedule("good", "work", "* * * * * *", args=["tick"])

        async def ticked() -> bool:
            return await count(redis, starts_key("tick")) >= 3

        await wait_until(ticked, what="3 ticks of the good schedule", within=15)
    assert worker.process.poll() is None
    log = worker.log()
    assert log.count("schedule bad: not run: debounce: schedule bad: job settles") == 1, log
    assert await count(redis, starts_key("x")) == 0
    assert_clean(worker)


@pytest.mark.timeout(60)
async def test_nothing_is_lost_across_a_redis_restart_with_aof(
    private_redis: RedisServer,
    redis_url: str,
    redis: Redis,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    # The queue on the private server (restarted), the records on the session's one.
    total, down = 200, 1.0
    url = private_redis.url
    lease = 4.0  # longer than the outage and the reconnection: no lease is lost
    worker = start_job_worker(
        url,
        tmp_path,
        env={"JOBS_MARKERS_URL": redis_url, "STREAMKIT_JOB_LEASE_TTL": f"{lease:g}"},
        args=("--concurrency", "8"),
    )
    workers.append(worker)
    tags = [f"n{i}" for i in range(total)]
    async with open_redis(url) as queue_redis, open_job_queue(queue_redis, "jobs") as queue:
        handles = await queue.enqueue_calls(
            jobs_app.work, [JobCall(args=(tag, 0.1), job_id=tag) for tag in tags]
        )
        await wait_serving(worker)

        async def tally(prefix: str) -> int:
            return sum(int(n or 0) for n in await redis.mget([f"{prefix}{t}" for t in tags]))

        async def some_ended() -> bool:
            return await tally("jobs:ends:") >= total // 5

        await wait_until(some_ended, what=f"{total // 5} jobs ended", within=20)
        # Paused first, so that the crash comes with a claim in flight: the tries
        # running end, their slots free up, and the next claim waits for an answer.
        private_redis.pause()

        async def idle() -> bool:
            return await tally("jobs:ends:") == await tally("jobs:starts:")

        try:
            await wait_until(idle, what="the tries running to end", within=10)
        finally:
            private_redis.stop()  # SIGKILL: only what the AOF holds survives
        await trio.sleep(down)  # the injected fault's duration
        await trio.to_thread.run_sync(private_redis.start)
        assert await tally("jobs:ends:") < total, "every job ended before the restart"

        async def all_succeeded() -> bool:
            return (await queue.counts()).succeeded == total

        await wait_until(all_succeeded, what=f"{total} jobs succeeded", within=30)
        infos = [await h.info() for h in handles]
        counts = await queue.counts()

    starts = await redis.mget([starts_key(t) for t in tags])
    ends = await redis.mget([ends_key(t) for t in tags])
    assert {i.status for i in infos} == {JobStatus.SUCCESS}
    # No lease ran out, so every job ran exactly once.
    assert [int(n or 0) for n in ends] == [1] * total
    assert [int(n or 0) for n in starts] == [1] * total
    assert {(i.tries, i.lost) for i in infos} == {(1, 0)}
    assert (counts.succeeded, counts.dead, counts.pending) == (total, 0, 0)
    assert worker.process.poll() is None, worker.log()
    log = worker.log()
    # The outage, said once with its end (the claim in flight among what it cut short),
    # and the jobs of the lost claim's reply handed back.
    assert re.search(r"unreachable: .*connection lost.*; retrying", log, re.IGNORECASE), log
    assert re.search(r"back after [\d.]+s", log), log
    assert "not recorded" not in log
    assert_clean(worker)


@pytest.mark.timeout(40)
async def test_sigterm_during_an_outage_stops_in_time_and_the_jobs_run_again(
    private_redis: RedisServer,
    redis_url: str,
    redis: Redis,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    # Redis killed, then SIGTERM: the stop must not wait for Redis. Two jobs end during
    # the grace (their outcomes cannot be recorded), two outlast it (cancelled, and
    # they cannot be put back). The worker exits 0 within grace + the clean-up's 5 s,
    # says once what was not recorded, and the jobs run again once Redis is back.
    grace = float(FAST_ENV["STREAMKIT_GRACE_PERIOD"])
    url = private_redis.url
    env = {"JOBS_MARKERS_URL": redis_url, **FAST_LEASE}
    worker = start_job_worker(url, tmp_path, env=env)
    workers.append(worker)
    ending, outlasting = ["ends-0", "ends-1"], ["outlasts-0", "outlasts-1"]
    async with open_redis(url) as queue_redis, open_job_queue(queue_redis, "jobs") as queue:
        handles = [await enqueue(queue, jobs_app.hold, tag, 1.5) for tag in ending]
        handles += [await enqueue(queue, jobs_app.hold, tag, 60.0) for tag in outlasting]
        await wait_serving(worker)
        for tag in ending + outlasting:
            await wait_started(redis, tag)
        private_redis.stop()  # SIGKILL
        await trio.sleep(0.5)  # the trial's timing: the signal comes during the outage
        stopped_at = trio.current_time()
        worker.send_signal(signal.SIGTERM)
        code = await worker.wait_exit(within=grace + PUT_BACK_WITHIN + 3)
        took = trio.current_time() - stopped_at
        log = worker.log()
        print(f"SIGTERM to exit during the outage: {took:.1f}s")
        assert code == 0, log
        assert took < grace + PUT_BACK_WITHIN + 1.5, log
        for tag in ending:
            assert await count(redis, ends_key(tag)) == 1  # ended while Redis was down
        # Said once, with what it means; no end of the outage that did not end.
        assert log.count("were not recorded") == 1, log
        assert "the outcomes of 4 job(s) in flight were not recorded" in log, log
        assert "back after" not in log, log
        assert "Error:" not in log, log
        assert_clean(worker)

        # At-least-once: back up, another worker runs all four again.
        await trio.to_thread.run_sync(private_redis.start)
        workers.append(start_job_worker(url, tmp_path, env=env))
        for handle in handles:
            await handle.result(timeout=20)
    for tag in ending + outlasting:
        assert await count(redis, starts_key(tag)) == 2, tag


@pytest.mark.timeout(40)
async def test_a_worker_never_takes_a_job_over_from_itself(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # The job blocks the only worker's event loop past its lease: once the loop runs
    # again, the worker's own claimer finds the lease run out. It must not start the
    # job a second time beside the first try, nor count that try as lost.
    worker = start_job_worker(redis_url, tmp_path, env=FAST_LEASE)
    workers.append(worker)
    await wait_serving(worker)
    async with open_job_queue(redis, "jobs", lease_ttl=LEASE_TTL) as queue:
        handle = await enqueue(queue, jobs_app.blocker, "blocker", LEASE_TTL + 1.5)
        assert await handle.result(timeout=LEASE_TTL + 10) == worker.pid
        info = await handle.info()

    assert (info.status, info.tries, info.lost) == (JobStatus.SUCCESS, 1, 0)
    assert [(kind, pid) for kind, pid, _ in await runs(redis, "blocker")] == [
        ("start", worker.pid),
        ("end", worker.pid),
    ]
    log = worker.log()
    assert "the event loop has been blocked" in log  # the lease did lapse
    assert "taken over" not in log
    assert "not recorded" not in log
    assert_clean(worker)


@pytest.mark.timeout(40)
async def test_a_stop_with_a_claim_in_flight_hands_the_claimed_jobs_back(
    private_redis: RedisServer,
    redis_url: str,
    redis: Redis,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    # Redis paused while the worker claims: the stop comes with a claim in flight,
    # whose jobs must be handed back, not left in the stopped worker's name (they
    # would wait for their leases, then count as lost, spending a try).
    total = 40
    url = private_redis.url
    worker = start_job_worker(
        url, tmp_path, env={"JOBS_MARKERS_URL": redis_url}, args=("--concurrency", "4")
    )
    workers.append(worker)
    tags = [f"c{i}" for i in range(total)]
    async with open_redis(url) as queue_redis, open_job_queue(queue_redis, "jobs") as queue:
        handles = await queue.enqueue_calls(
            jobs_app.work, [JobCall(args=(tag, 0.05), job_id=tag) for tag in tags]
        )

        async def tally(prefix: str) -> int:
            return sum(int(n or 0) for n in await redis.mget([f"{prefix}{t}" for t in tags]))

        async def some_ended() -> bool:
            return await tally("jobs:ends:") >= 8

        await wait_until(some_ended, what="8 jobs ended", within=20)
        private_redis.pause()
        try:
            # The tries running end, their slots free up: the next claim hangs.
            async def idle() -> bool:
                return await tally("jobs:ends:") == await tally("jobs:starts:")

            await wait_until(idle, what="the tries running to end", within=10)
            worker.send_signal(signal.SIGTERM)
            await wait_until(
                lambda: "stopping gracefully" in worker.log(), what="the stop", within=10
            )
        finally:
            private_redis.resume()
        assert await worker.wait_exit(within=15) == 0, worker.log()
        counts = await queue.counts()
        assert counts.running == 0, counts  # nothing left in the stopped worker's name

        workers.append(start_job_worker(url, tmp_path, env={"JOBS_MARKERS_URL": redis_url}))

        async def all_succeeded() -> bool:
            return (await queue.counts()).succeeded == total

        await wait_until(all_succeeded, what=f"{total} jobs succeeded", within=20)
        infos = [await h.info() for h in handles]

    assert {(i.status, i.tries, i.lost) for i in infos} == {(JobStatus.SUCCESS, 1, 0)}
    # Each ran to its end once. (A try that started as the stop came, from a claim
    # answered just before the pause, was cut short and put back: it started twice.)
    ends = await redis.mget([ends_key(t) for t in tags])
    assert [int(n or 0) for n in ends] == [1] * total
    assert_clean(worker)


# ---------------------------------------------------------------------------- distribution


@pytest.mark.timeout(40)
async def test_each_cron_tick_runs_once_with_three_workers(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    cron = "tests.apps.jobs_app:cron_app"
    workers.extend(
        start_job_worker(redis_url, tmp_path, app=cron, args=("--log-level", "debug"))
        for _ in range(3)
    )
    await wait_serving(*workers)
    first = int(time.time()) + 2  # a tick all three workers enqueue
    wanted = [f"cron:tick:{t}" for t in range(first, first + 5)]
    async with open_job_queue(redis, "jobcron") as queue:

        async def all_ran() -> bool:
            keys = queue.shard_keys[0]
            statuses = [await redis.hget(keys.job(i), "status") for i in wanted]
            return statuses == [b"success"] * len(wanted)

        await wait_until(all_ran, what="5 ticks run", within=20)
        infos = [await queue.handle(i).info() for i in wanted]

    for job_id, info in zip(wanted, infos, strict=True):
        assert (info.status, info.tries) == (JobStatus.SUCCESS, 1), info
        assert await count(redis, starts_key(job_id)) == 1, job_id
        assert await count(redis, ends_key(job_id)) == 1, job_id
    # Every worker enqueued every one of these ticks: the dedupe kept one of each.
    for worker in workers:
        log = worker.log()
        for job_id in wanted:
            tick = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(job_id.rsplit(":")[-1])))
            assert f"cron job tick: tick {tick}" in log, (worker.pid, tick)
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert await worker.wait_exit() == 0, worker.log()
        assert_clean(worker)


def start_racer(url: str, log_dir: Path, rounds: int) -> WorkerProcess:
    log_path = log_dir / f"racer-{len(list(log_dir.glob('racer-*')))}.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.apps.jobs_app", "race", str(rounds)],
        cwd=ROOT,
        env={**os.environ, "STREAMKIT_REDIS_URL": url},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return WorkerProcess(process, log_path, log)


@pytest.mark.timeout(40)
async def test_concurrent_enqueues_of_one_job_id_make_one_job(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    racers, rounds = 4, 200
    workers.extend(start_racer(redis_url, tmp_path, rounds) for _ in range(racers))

    async def all_ready() -> bool:
        return await count(redis, jobs_app.RACE_READY) == racers

    await wait_until(all_ready, what=f"{racers} racers ready", within=15)
    await redis.rpush(jobs_app.RACE_GO, ["go"] * racers)
    for racer in workers:
        assert await racer.wait_exit() == 0, racer.log()

    async with open_job_queue(redis, "jobs") as queue:
        counts = await queue.counts()
        keys = queue.shard_keys[0]
        assert await redis.xlen(keys.ready(1)) == rounds
        assert counts.queued["normal"] == rounds
        assert counts.by_name == {"work": {"sent": rounds}}

        worker = start_job_worker(redis_url, tmp_path)
        workers.append(worker)

        async def all_succeeded() -> bool:
            return (await queue.counts()).succeeded == rounds

        await wait_until(all_succeeded, what=f"{rounds} jobs succeeded", within=20)
    tags = [f"race-{i}" for i in range(rounds)]
    starts = await redis.mget([starts_key(t) for t in tags])
    assert [int(n or 0) for n in starts] == [1] * rounds


@pytest.mark.timeout(40)
async def test_sigterm_puts_the_running_job_back_without_spending_a_try(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # Put back, not left for its lease to run out: the take-over spends no try and
    # counts no lost worker (an expired lease would count one).
    workers.extend(start_job_worker(redis_url, tmp_path) for _ in range(2))
    await wait_serving(*workers)
    async with open_job_queue(redis, "jobs") as queue:
        handle = await enqueue(queue, jobs_app.hold, "stopped", 60.0)
        stopped, survivor = by_pid(workers, await wait_started(redis, "stopped"))

        stopped_at = time.time()
        stopped.send_signal(signal.SIGTERM)
        assert await stopped.wait_exit(within=15) == 0, stopped.log()
        assert await handle.result(timeout=10) == survivor.pid
        info = await handle.info()

    takeover = info.started_at.timestamp() - stopped_at if info.started_at else float("inf")
    print(f"SIGTERM to take-over: {takeover:.3f}s (lease_ttl {queue.lease_ttl:g}s)")
    assert info.status is JobStatus.SUCCESS
    assert (info.tries, info.lost) == (1, 0)  # put back: no try spent, not lost
    assert [t.outcome for t in info.history] == ["released", "success"]
    assert [(kind, pid) for kind, pid, _ in await runs(redis, "stopped")] == [
        ("start", stopped.pid),
        ("start", survivor.pid),
        ("end", survivor.pid),
    ]
    assert "stopping gracefully" in stopped.log()
    assert_clean(stopped)
    assert_clean(survivor)


@pytest.mark.timeout(40)
async def test_one_worker_runs_an_apps_jobs_and_processors(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = start_job_worker(redis_url, tmp_path, app="tests.apps.jobs_app:mixed")
    workers.append(worker)
    producer = App("jobmixed", redis_url=redis_url)
    notes = producer.stream("notes", record=Note, partition_by="key", partition_count=2)
    async with producer:
        await notes.send_many([Note(key=f"k{n % 4}", n=n) for n in range(20)])
    async with open_job_queue(redis, "jobmixed") as queue:
        handles = await queue.enqueue_calls(
            jobs_app.mixed_work, [JobCall(args=(f"m{i}",), job_id=f"m{i}") for i in range(5)]
        )
        results = [await h.result(timeout=20) for h in handles]

    async def all_seen() -> bool:
        return await redis.llen(jobs_app.EVENTS_SEEN) == 20

    await wait_until(all_seen, what="20 events processed", within=20)
    assert results == [worker.pid] * 5
    seen = {raw.decode() for raw in await redis.lrange(jobs_app.EVENTS_SEEN, 0, -1)}
    assert seen == {f"k{n % 4}:{n}" for n in range(20)}
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log()
    assert_clean(worker)


# ---------------------------------------------------------------------------- limits


@pytest.mark.cluster
@pytest.mark.timeout(60)
async def test_limits_hold_across_three_workers_and_a_kill_9_leaks_no_slot(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    workers.extend(start_job_worker(redis_url, tmp_path, env=FAST_LEASE) for _ in range(3))
    await wait_serving(*workers)
    tags = [f"lim-{n}" for n in range(12)]
    async with open_job_queue(redis, "jobs", lease_ttl=LEASE_TTL) as queue:
        handles = [
            await enqueue(queue, jobs_app.limited, tag, f"acct-{n % 3}", 0.3)
            for n, tag in enumerate(tags)
        ]
        # Kill -9 the worker of the first job while it runs: its slots (of the name and
        # of acct-0) are held by a dead worker until its lease runs out.
        first_pid = await wait_started(redis, tags[0])
        [victim] = [w for w in workers if w.pid == first_pid]
        killed_at = time.time()
        victim.kill()
        assert await victim.wait_exit() == -signal.SIGKILL
        results = [await handle.result(timeout=LEASE_TTL + 20) for handle in handles]
        infos = [await handle.info() for handle in handles]
        leftover = [key async for key in redis.scan_iter(match="__jobs:{jobs.0}:cc:*")]

    assert victim.pid not in results[:1]  # the first job finished on another worker
    assert infos[0].lost == 1
    assert leftover == []  # every slot given back, the dead worker's by the takeover
    # Never more than 2 running, nor 2 of one account, at any moment: each run lasts
    # from its start to its end, or to the kill for a run the kill cut short.
    spans: list[tuple[float, float, str]] = []
    for n, tag in enumerate(tags):
        entries = await runs(redis, tag)
        for kind, pid, at in entries:
            if kind == "start":
                ends = [e for k, p, e in entries if k == "end" and p == pid and e >= at]
                spans.append((at, ends[0] if ends else killed_at, f"acct-{n % 3}"))
    for at, _, _ in spans:
        running = [s for s in spans if s[0] <= at < s[1]]
        assert len(running) <= 2, running
        for account in ("acct-0", "acct-1", "acct-2"):
            assert len([s for s in running if s[2] == account]) <= 1, running
    # Never more than 5 tries started in any second (Redis' clock: the claims).
    starts_ms = sorted(
        round(attempt.started_at.timestamp() * 1000)
        for info in infos
        for attempt in info.history
        if attempt.started_at is not None
    )
    assert len(starts_ms) == 12 + sum(info.lost for info in infos)  # lost tries started again
    gaps = [b - a for a, b in zip(starts_ms, starts_ms[5:], strict=False)]
    assert min(gaps) >= 1000, gaps
    for worker in workers:
        if worker is not victim:
            assert_clean(worker)
