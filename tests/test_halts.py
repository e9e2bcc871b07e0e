"""A halting policy stops one partition, not the worker nor the fleet; status shows
it and ``streamkit resume`` (with or without ``--skip``) continues it."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

from streamkit import ProcessorKeys
from streamkit._cli._admin import processor_status, resume_partitions
from streamkit._locks import lock_key
from streamkit._worker import Worker, run_worker
from streamkit.testing import wait_until
from tests.apps.halting import ATTEMPTS, BROKEN, DONE, Job, app, jobs
from tests.test_cli import streamkit
from tests.workers import WorkerProcess, _pid_of, start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis

APP = "tests.apps.halting:app"
KEYS = ProcessorKeys(app="halting", stream="jobs", processor="handle")
PER_KEY = 5


def halt_key(partition: int) -> str:
    return f"__halt:{{halting.jobs.{partition}}}.handle"


def key_in(partition: int) -> str:
    """A job key that lands in ``partition``."""
    for i in range(1000):
        if jobs.partition_of(Job(key=f"k{i}", seq=0)) == partition:
            return f"k{i}"
    raise AssertionError(partition)


async def done(redis: Redis) -> list[str]:
    return [d.decode() for d in await redis.lrange(DONE, 0, -1)]


async def send_jobs(redis_url: str, keys: list[str]) -> list[str]:
    app.settings = attrs.evolve(app.settings, redis_url=redis_url)
    async with app:
        await jobs.send_many(Job(key=k, seq=s) for s in range(PER_KEY) for k in keys)
    return [f"{k}:{s}" for k in keys for s in range(PER_KEY)]


async def lock_holders_of(redis: Redis) -> dict[int, int | None]:
    return {
        p: _pid_of(await redis.get(lock_key(KEYS.lock_name(p))))
        for p in range(jobs.partition_count)
    }


@pytest.mark.timeout(60)
async def test_a_halt_stops_one_partition_and_resume_continues_it(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    bad_partition = 1
    keys = [key_in(p) for p in range(jobs.partition_count)]
    bad_key = keys[bad_partition]
    await redis.sadd(BROKEN, [f"{bad_key}:2"])
    workers.extend(start_worker(redis_url, tmp_path, app=APP) for _ in range(2))
    await wait_members(redis, 2, group=KEYS.group)
    sent = await send_jobs(redis_url, keys)
    others = [j for j in sent if not j.startswith(f"{bad_key}:")]

    async def halted_and_others_done() -> bool:
        seen = set(await done(redis))
        return bool(await redis.exists([halt_key(bad_partition)])) and set(others) <= seen

    with trio.fail_after(50):
        await wait_until(halted_and_others_done, what="the halt and the rest", within=20)
        # The partition stopped at the bad job: the jobs before it were processed.
        assert [j for j in await done(redis) if j.startswith(f"{bad_key}:")] == [
            f"{bad_key}:0",
            f"{bad_key}:1",
        ]
        for worker in workers:
            assert worker.process.poll() is None, worker.log()
        # The halt is written to Redis before it is logged: wait for the line.
        await wait_until(
            lambda: "streamkit resume" in "".join(w.log() for w in workers),
            what="the halt's log line",
            within=10,
        )
        logs = "".join(w.log() for w in workers)
        # The processor's own traceback, file and line, once.
        assert logs.count("Traceback (most recent call last)") == 1, logs
        assert 'tests/apps/halting.py", line' in logs
        assert "streamkit resume tests.apps.halting:app handle --partition 1" in logs

        status = await streamkit("status", APP, redis_url=redis_url)
        assert status.code == 0, status.err
        assert "partition 1 HALTED" in status.out, status.out
        assert "RuntimeError: boom on" in status.out
        assert f"streamkit resume {APP} handle --partition 1\n" in status.out

        # The holder of the halted partition stops: the other worker takes the
        # partition over and stays halted instead of halting on the event again.
        holders = await lock_holders_of(redis)
        holder = next(w for w in workers if w.pid == holders[bad_partition])
        survivor = next(w for w in workers if w is not holder)
        holder.send_signal(signal.SIGTERM)
        assert await holder.wait_exit(within=15) == 0, holder.log()

        async def taken_over() -> bool:
            return (await lock_holders_of(redis))[bad_partition] == survivor.pid

        await wait_until(taken_over, what="the survivor holding partition 1", within=15)
        await wait_until(
            lambda: "stays halted" in survivor.log(),
            what="the survivor saying the partition stays halted",
            within=10,
        )
        assert await redis.llen(ATTEMPTS) == 1
        assert "halting the partition" not in survivor.log()

        # The bug is fixed; resume: the bad job and the ones after it are processed.
        await redis.srem(BROKEN, [f"{bad_key}:2"])
        resumed = await streamkit("resume", APP, "handle", "--partition", "1", redis_url=redis_url)
        assert (resumed.code, resumed.out) == (0, "resumed handle on partition 1\n"), resumed.err

        async def all_done() -> bool:
            return set(sent) <= set(await done(redis))

        await wait_until(all_done, what="every job processed", within=10)
        assert [j for j in await done(redis) if j.startswith(f"{bad_key}:")] == [
            f"{bad_key}:{s}" for s in range(PER_KEY)
        ]
        assert not await redis.exists([halt_key(bad_partition)])
        assert survivor.process.poll() is None


@pytest.mark.timeout(60)
async def test_resume_skip_acknowledges_the_halted_event(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    key = key_in(0)
    await redis.sadd(BROKEN, [f"{key}:1"])
    workers.append(start_worker(redis_url, tmp_path, app=APP))
    await wait_members(redis, 1, group=KEYS.group)
    sent = await send_jobs(redis_url, [key])
    with trio.fail_after(40):
        await wait_until(lambda: redis.exists([halt_key(0)]), what="partition 0 halted", within=15)
        # Still broken, so skip the job.
        resumed = await streamkit("resume", APP, "handle", "--skip", redis_url=redis_url)
        assert resumed.code == 0, resumed.err
        assert resumed.out.startswith("resumed handle on partition 0, skipping "), resumed.out

        async def rest_done() -> bool:
            return len(await done(redis)) == len(sent) - 1

        await wait_until(rest_done, what="the jobs after the skipped one", within=10)
        assert await done(redis) == [j for j in sent if j != f"{key}:1"]
        assert await redis.llen(ATTEMPTS) == 1

        async def nothing_pending() -> bool:
            summary: Any = await redis.xpending(jobs.key(0), KEYS.group)
            return int(summary.pending) == 0

        await wait_until(nothing_pending, what="everything acknowledged", within=10)

        again = await streamkit("resume", APP, "handle", "--partition", "0", redis_url=redis_url)
        assert again.code == 1
        assert again.err.strip().endswith(
            f"handle is not halted on partition 0 (see `streamkit status {APP}`)"
        ), again.err
        out_of_range = await streamkit(
            "resume", APP, "handle", "--partition", "9", redis_url=redis_url
        )
        assert out_of_range.code == 2, out_of_range.err
        assert "jobs has no partition 9 (0..3)" in out_of_range.err


@pytest.mark.timeout(60)
async def test_undecodable_entries_do_not_stop_the_default_policy(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # Two entries written with a bare XADD used to stop every worker in turn.
    workers.extend(start_worker(redis_url, tmp_path, app=APP) for _ in range(2))
    await wait_members(redis, 2, group=KEYS.group)
    sent = await send_jobs(redis_url, [key_in(0), key_in(1)])
    await redis.xadd(jobs.key(0), {"data": "not json"})
    await redis.xadd(jobs.key(1), {"what": "no data field"})
    later = await send_jobs(redis_url, [key_in(2), key_in(3)])

    async def all_done_and_dead_lettered() -> bool:
        seen = set(await done(redis))
        return set(sent + later) <= seen and await redis.xlen(KEYS.dead_letter_key) == 2

    with trio.fail_after(30):
        await wait_until(all_done_and_dead_lettered, what="jobs and 2 dead letters", within=20)
    letters = await redis.xrange(KEYS.dead_letter_key)
    assert {e.field_values[b"dl.reason"] for e in letters} == {b"undecodable"}
    for worker in workers:
        assert worker.process.poll() is None, worker.log()
        assert "halting the partition" not in worker.log()
    for partition in range(jobs.partition_count):
        assert not await redis.exists([halt_key(partition)])


async def test_in_process_halt_is_watchable_and_resumed_from_code(
    redis_url: str, redis: Redis
) -> None:
    key = key_in(2)
    await redis.sadd(BROKEN, [f"{key}:0"])
    app.settings = attrs.evolve(app.settings, redis_url=redis_url, lease_ttl=1.5)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            worker: Worker = await nursery.start(run_worker, app)
            [executor] = worker.executors
            await jobs.send_many(Job(key=key, seq=s) for s in range(3))
            await executor.halted.wait_value(lambda halted: 2 in halted)
            record = executor.halted.value[2]
            assert (record.error_type, record.error) == ("RuntimeError", f"boom on {key}:0")
            statuses = await processor_status(app, app.processors["handle"])
            assert [s.partition for s in statuses if s.halted is not None] == [2]
            # The lease is kept while halted.
            assert 2 in executor.rebalancer.owned.value
            cleared = await resume_partitions(app, app.processors["handle"], skip=True)
            assert list(cleared) == [2]
            await executor.halted.wait_value(lambda halted: not halted)

            async def rest_done() -> bool:
                return await done(redis) == [f"{key}:1", f"{key}:2"]

            await wait_until(rest_done, what="the jobs after the skipped one", within=10)
            await worker.stop()
