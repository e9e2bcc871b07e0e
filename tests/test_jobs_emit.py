"""Records a job emits on success (``current_job().emit``): exactly once, from the
successful try only, on a server and on a cluster.

In-process workers on a real server (and the session's cluster): a job that fails
then succeeds emits its successful try's records only; a timed-out and an aborted
try's records are discarded; bad input to ``emit`` is refused where it is called.
The faults (kill -9 after emitting, a zombie try) run real worker processes, below.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, Backoff, ConfigError, EncodeError, Record
from streamkit.jobs import JobFailed, current_job
from streamkit.testing import wait_until
from tests.apps.emitting import make_app
from tests.workers import start_worker

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis, Stream
    from tests.workers import WorkerProcess


class Sent(Record):
    job: str
    try_number: int
    n: int


async def read_all(redis: Redis, stream: Stream[Any]) -> list[Any]:
    out: list[Any] = []
    for partition in range(stream.partition_count):
        entries: Any = await redis.xrange(stream.key(partition))
        out.extend(stream.codec.decode(e.field_values, stream=stream.name) for e in entries)
    return out


@pytest.mark.cluster
async def test_only_the_successful_try_emits(redis_url: str, redis: Redis) -> None:
    app = App("emitter", redis_url=redis_url, job_lease_ttl=1.0)
    sent = app.stream("sent", record=Sent, partition_by="job", partition_count=4)

    @app.job(retries=2, backoff=Backoff(initial=0.01, maximum=0.02))
    async def flaky(n: int) -> int:
        job = current_job()
        for i in range(n):
            job.emit(sent, Sent(job="flaky", try_number=job.try_number, n=i))
        if job.try_number == 1:
            raise ConnectionError("the first try fails after emitting")
        return n

    @app.job(retries=0, timeout=0.05)
    async def slow() -> None:
        current_job().emit(sent, Sent(job="slow", try_number=current_job().try_number, n=0))
        await trio.sleep(10)

    started = trio.Event()

    @app.job
    async def aborted() -> None:
        current_job().emit(sent, Sent(job="aborted", try_number=1, n=0))
        started.set()
        await trio.sleep(10)

    @app.job
    async def refused() -> str:
        job = current_job()
        with pytest.raises(EncodeError):
            job.emit(sent, {"not": "a Sent"})
        with pytest.raises(ConfigError, match="takes a stream"):
            job.emit("sent", Sent(job="x", try_number=1, n=0))  # type: ignore[arg-type]
        return "refused"

    async with app, trio.open_nursery() as nursery:
        await nursery.start(app.job_queue.serve)
        flaky_handle = await flaky.delay(3)
        slow_handle = await slow.delay()
        aborted_handle = await aborted.delay()
        assert await (await refused.delay()).result(timeout=10) == "refused"
        await started.wait()
        await aborted_handle.abort("no need")
        assert await flaky_handle.result(timeout=10) == 3
        for handle in (slow_handle, aborted_handle):
            with pytest.raises(JobFailed):
                await handle.result(timeout=10)

        async def relayed() -> bool:
            return len(await read_all(redis, sent)) >= 3

        await wait_until(relayed, what="the emitted records relayed", within=20)
        nursery.cancel_scope.cancel()
    got = sorted((s.job, s.try_number, s.n) for s in await read_all(redis, sent))
    assert got == [("flaky", 2, 0), ("flaky", 2, 1), ("flaky", 2, 2)]


async def test_a_context_kept_past_its_try_cannot_emit(redis_url: str) -> None:
    app = App("emitter", redis_url=redis_url)
    sent = app.stream("sent", record=Sent, partition_by="job")
    kept: list[Any] = []

    @app.job
    async def keep() -> None:
        kept.append(current_job())

    async with app, trio.open_nursery() as nursery:
        await nursery.start(app.job_queue.serve)
        await (await keep.delay()).result(timeout=10)
        nursery.cancel_scope.cancel()
    with pytest.raises(RuntimeError, match="inside the job's running try"):
        kept[0].emit(sent, Sent(job="x", try_number=1, n=0))


@pytest.mark.parametrize("fault", ["kill", "zombie"])
async def test_a_try_lost_after_emitting_emits_nothing(
    fault: str, redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    emitting = make_app(redis_url=redis_url)
    env = {"EMITTING_HOLD": "4"}
    first = start_worker(redis_url, tmp_path, app="tests.apps.emitting:app", env=env)
    workers.append(first)
    async with emitting.app:
        handle = await emitting.announce.delay(7)

        async def running() -> bool:
            return (await handle.info()).status == "executing"

        await wait_until(running, what="the first try running", within=20)
        if fault == "kill":
            first.kill()  # after emitting, before finishing
        else:
            first.send_signal(signal.SIGSTOP)  # frozen past its lease: a zombie
        workers.append(start_worker(redis_url, tmp_path, app="tests.apps.emitting:app", env=env))
        assert await handle.result(timeout=30) == 7
        if fault == "zombie":
            first.send_signal(signal.SIGCONT)
            # Its try's outcome refused, or the try cancelled by the renewal that noticed.
            try:
                await wait_until(
                    lambda: "took it over" in first.log() or "taken over" in first.log(),
                    what="the zombie to notice",
                    within=20,
                )
            except trio.TooSlowError:
                said = first.log()
                raise AssertionError(f"the zombie did not say so; its log:\n{said}") from None
        info = await handle.info()
    assert info.tries == 2
    announced = await read_all(redis, emitting.announced)
    assert [(a.n, a.try_number) for a in announced] == [(7, 2)]
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()
