"""Jobs that misbehave beyond raising an ``Exception``: ``sys.exit``,
``KeyboardInterrupt`` and the like fail their try (retried, then dead), in an ``async
def`` job and in a plain ``def`` one, and the worker goes on; a backoff that computes
no delay ends the job dead instead of the worker; while cancellations (a stop, a
timeout) and Trio's own interrupts keep their meaning.

A real ``streamkit worker`` taking such jobs is in ``tests/test_jobs_crash.py``.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import pytest
import trio

from streamkit import App, Backoff
from streamkit.jobs import JobFailed, JobStatus
from streamkit.jobs._run import cancels, interrupts, retried
from tests.workers import ROOT

FAST = Backoff(initial=0.01, maximum=0.01, jitter=0)


def _exits() -> NoReturn:
    sys.exit(3)


def _interrupts() -> NoReturn:
    raise KeyboardInterrupt


class _Stop(BaseException):
    """A BaseException of the job's own."""


def _stops() -> NoReturn:
    raise _Stop("enough")


@pytest.mark.parametrize(
    ("raiser", "error_type", "message"),
    [(_exits, "SystemExit", "3"), (_interrupts, "KeyboardInterrupt", ""), (_stops, None, "enough")],
)
@pytest.mark.parametrize("threaded", [False, True], ids=["async", "def"])
@pytest.mark.timeout(30)
async def test_a_job_raising_a_base_exception_fails_its_tries_and_the_worker_goes_on(
    redis_url: str, raiser: Any, error_type: str | None, message: str, threaded: bool
) -> None:
    app = App("unruly", redis_url=redis_url)
    calls: list[int] = []

    def bad_def(n: int) -> None:
        calls.append(n)
        raiser()

    async def bad_async(n: int) -> None:
        calls.append(n)
        await trio.lowlevel.checkpoint()
        raiser()

    bad = app.job(bad_def if threaded else bad_async, name="bad", retries=2, backoff=FAST)

    @app.job
    async def fine(n: int) -> int:
        return n + 1

    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(app.job_queue.serve)
        handle = await bad.delay(1)
        with pytest.raises(JobFailed) as failed:
            await handle.result(timeout=15)
        info = await handle.info()
        assert info.status == JobStatus.DEAD
        assert info.tries == 3  # retries=2: tried three times, each spent
        assert calls == [1, 1, 1]
        expected = error_type or f"{__name__}._Stop"
        assert failed.value.error_type == expected
        assert failed.value.message == message
        assert "raise" in failed.value.traceback or "sys.exit" in failed.value.traceback
        assert [dead.id for dead in await app.job_queue.dead_letters()] == [handle.id]
        # The worker is alive and runs other jobs.
        assert await (await fine.delay(1)).result(timeout=10) == 2
        assert worker.running_jobs == 0
        nursery.cancel_scope.cancel()


@pytest.mark.timeout(30)
async def test_a_base_exception_outside_a_narrow_retry_on_ends_the_job_at_once(
    redis_url: str,
) -> None:
    app = App("unruly", redis_url=redis_url)

    @app.job(retries=3, retry_on=(ConnectionError,), backoff=FAST)
    async def picky() -> None:
        sys.exit("bye")

    async with app, trio.open_nursery() as nursery:
        await nursery.start(app.job_queue.serve)
        handle = await picky.delay()
        with pytest.raises(JobFailed, match="SystemExit"):
            await handle.result(timeout=10)
        assert (await handle.info()).tries == 1
        nursery.cancel_scope.cancel()


async def test_which_base_exceptions_are_a_failed_try() -> None:
    assert retried(SystemExit(3), (Exception,))
    assert retried(KeyboardInterrupt(), (BaseException,))
    assert not retried(SystemExit(3), (ConnectionError,))
    assert retried(SystemExit(3), (SystemExit,))
    assert not retried(ValueError(), (ConnectionError,))
    # A cancellation, alone or in a group, is never the job's.
    cancelled = await _cancelled()
    assert cancels(cancelled)
    assert cancels(BaseExceptionGroup("tasks", [ValueError("x"), cancelled]))
    assert not cancels(BaseExceptionGroup("tasks", [SystemExit(1)]))
    # A KeyboardInterrupt or GeneratorExit raised by the job's code is the job's.
    for exc_type in (KeyboardInterrupt, GeneratorExit):
        with pytest.raises(exc_type) as raised:
            raise exc_type
        assert not interrupts(raised.value)


async def _cancelled() -> trio.Cancelled:
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            return exc
    raise AssertionError("not cancelled")


@pytest.mark.timeout(30)
async def test_a_retry_delay_past_floats_is_the_maximum(redis_url: str) -> None:
    app = App("unruly", redis_url=redis_url)
    tries: list[float] = []

    # factor ** 2 overflows a float: the delay is the maximum, as for any long one.
    @app.job(retries=3, backoff=Backoff(initial=0.01, maximum=0.05, factor=1e300, jitter=0))
    async def flaky() -> None:
        tries.append(trio.current_time())
        raise ConnectionError("down")

    async with app, trio.open_nursery() as nursery:
        await nursery.start(app.job_queue.serve)
        handle = await flaky.delay()
        with pytest.raises(JobFailed, match="ConnectionError"):
            await handle.result(timeout=10)
        assert (await handle.info()).tries == 4
        nursery.cancel_scope.cancel()


@pytest.mark.timeout(30)
async def test_a_backoff_that_computes_no_delay_ends_the_job_dead_not_the_worker(
    redis_url: str,
) -> None:
    app = App("unruly", redis_url=redis_url)

    @app.job(retries=3)
    async def flaky() -> None:
        raise ConnectionError("down")

    @app.job
    async def fine() -> str:
        return "fine"

    # A backoff past the declaration's check (which refuses one that is no Backoff).
    object.__setattr__(flaky.options, "backoff", 5)
    async with app, trio.open_nursery() as nursery:
        await nursery.start(app.job_queue.serve)
        handle = await flaky.delay()
        with pytest.raises(JobFailed, match="ConnectionError") as failed:
            await handle.result(timeout=10)
        assert failed.value.message == "down"
        assert (await handle.info()).tries == 1
        assert await (await fine.delay()).result(timeout=10) == "fine"
        nursery.cancel_scope.cancel()


#: A Ctrl-C that Trio's SIGINT handler raises in a job's code (no checkpoint there).
_CTRL_C = """
import os, signal, threading, time, trio
from streamkit.jobs._run import interrupts

async def main():
    try:
        # (started inside the try: on a loaded machine the signal may come before
        # start() returns)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        start = time.monotonic()
        while time.monotonic() - start < 10:
            pass
    except KeyboardInterrupt as exc:
        print("interrupts:", interrupts(exc))

trio.run(main)
"""


@pytest.mark.timeout(30)
async def test_a_real_ctrl_c_in_a_jobs_code_is_trios_not_the_jobs() -> None:
    done = await trio.run_process(
        [sys.executable, "-c", _CTRL_C], capture_stdout=True, cwd=str(ROOT)
    )
    assert done.stdout.decode().split() == ["interrupts:", "True"]
