"""``streamkit worker --metrics-port``: a real worker process, a real Redis, scraped over
HTTP while it works through a backlog (see ``tests/apps/metered.py``)."""

from __future__ import annotations

import signal
import socket
from typing import TYPE_CHECKING

import pytest

from streamkit.metrics._collector import METRICS, sample_names
from streamkit.testing import free_port
from tests.apps.metered import POISONED_EVERY, TALLIED
from tests.metered_run import APP, FAST_METRICS, all_done, backlog, fill, scrape_when
from tests.workers import start_worker

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

pytestmark = pytest.mark.timeout(90)

ORDERS = 2000
JOBS = 20


async def test_counters_match_the_work_done_and_lag_falls_to_zero(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    await fill(redis_url, orders=ORDERS, jobs=JOBS)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    worker = start_worker(
        redis_url,
        tmp_path,
        app=APP,
        args=("--metrics-port", str(port)),
        # tally is slow (0.1 s a batch of 50): a backlog to watch for seconds.
        env={**FAST_METRICS, "METERED_DELAY": "0.1"},
    )
    workers.append(worker)

    # The backlog shows as lag + pending of the owned partitions...
    during = await scrape_when(url, "a backlog of tally", lambda s: backlog(s, "tally") > 0)
    assert during.total("streamkit_partitions_owned", processor="tally") == 4
    assert set(during.by_partition("streamkit_partition_pending", processor="tally")) <= set(
        range(4)
    )
    # ... and falls to zero as the worker works through it.
    done = await scrape_when(url, "everything processed, lag zero", all_done(ORDERS, JOBS))

    # The counters say what the processors did: tally counted its events in Redis.
    assert int(await redis.get(TALLIED) or 0) == ORDERS
    processed = done.by_partition("streamkit_events_processed_total", processor="tally")
    assert set(processed) == set(range(4))
    assert all(count > 0 for count in processed.values())
    poisoned = ORDERS // POISONED_EVERY
    assert done.total("streamkit_events_failed_total", processor="audit") == poisoned
    assert done.total("streamkit_events_failed_total", processor="tally") == 0
    assert done.total("streamkit_dead_letters_total", processor="audit", reason="error") == poisoned
    assert done.total("streamkit_dead_letter_stream_length", processor="audit") == poisoned
    # take() is timed per batch, records() per event; every event's latency once.
    assert done.total("streamkit_batch_duration_seconds_count", processor="tally") >= ORDERS / 50
    assert done.total("streamkit_event_duration_seconds_count", processor="tally") == 0
    assert done.total("streamkit_end_to_end_latency_seconds_count", processor="tally") == ORDERS
    assert done.total("streamkit_event_duration_seconds_count", processor="audit") > 0
    assert done.total("streamkit_rebalance_duration_seconds_count", processor="tally") >= 1
    assert done.total("streamkit_rebalance_in_progress") == 0
    assert done.total("streamkit_lease_losses_total") == 0
    assert done.total("streamkit_fenced_out_total") == 0
    assert done.total("streamkit_job_duration_seconds_count", queue="metered") == JOBS
    assert done.total("streamkit_jobs_in_progress", queue="metered") == 0
    assert done.total("streamkit_redis_reconnects_total") == 0
    # The process's own metrics come along (prometheus-client's default registry),
    # and streamkit's are the documented ones.
    assert "process_cpu_seconds_total" in done.names
    documented = {name for spec in METRICS for name in sample_names(spec)}
    assert {n for n in done.names if n.startswith("streamkit_")} == documented

    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log()
    assert f"serving metrics on http://127.0.0.1:{port}" in worker.log()


async def test_a_taken_port_is_one_line_and_exit_code_2(
    redis_url: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = start_worker(redis_url, tmp_path, app=APP, args=("--metrics-port", str(port)))
        workers.append(worker)
        assert await worker.wait_exit() == 2, worker.log()
    log = worker.log()
    assert f"port: cannot serve metrics on 127.0.0.1:{port}" in log
    assert "Traceback" not in log
