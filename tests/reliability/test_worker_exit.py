"""A worker exits with status 0 only when it was asked to stop."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import pytest

from streamkit.testing import wait_until
from tests.workers import ROOT, start_worker

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit.testing import RedisServer
    from tests.workers import WorkerProcess


@pytest.mark.timeout(60)
async def test_a_worker_that_ends_on_its_own_exits_non_zero(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # Nothing to run: the worker ends at once, without being asked to. A supervisor
    # must learn that from the exit status.
    (tmp_path / "idle_app.py").write_text("from streamkit import App\n\napp = App('idle')\n")
    worker = start_worker(
        private_redis.url, tmp_path, app="idle_app:app", env={"PYTHONPATH": f"{ROOT}:{tmp_path}"}
    )
    workers.append(worker)
    code = await worker.wait_exit(within=30)
    log = worker.log()
    assert code == 1, log
    assert "stopped without being asked to" in log.strip().splitlines()[-1]
    assert "Traceback" not in log


@pytest.mark.timeout(60)
async def test_a_worker_stopped_by_a_signal_exits_zero(
    private_redis: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(
        private_redis.url,
        tmp_path,
        app="tests.reliability.full_app:app",
        env={"FULL_SEEN_DIR": str(tmp_path)},  # its processor's record of what it saw
    )
    workers.append(worker)

    await wait_until(lambda: "running record" in worker.log(), what="the worker running", within=30)
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit(within=30) == 0
