"""streamkit.metrics in process: a worker's metrics in a registry of the test's own, the
endpoint from the ``metrics_port`` setting, and what happens without the extra."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest

from streamkit import ConfigError, Settings, run_worker
from streamkit._cli._cmd_worker import metrics_settings
from streamkit._meter import TIMING
from streamkit.metrics import open_metrics
from streamkit.metrics._collector import METRICS
from streamkit.testing import free_port, wait_until
from tests.apps.metered import POISONED_EVERY, make_app, order_list
from tests.scrape import Scrape, parse, scrape
from tests.workers import ROOT

pytestmark = pytest.mark.timeout(60)

ORDERS = 500


def read(registry: CollectorRegistry) -> Scrape:
    return parse(generate_latest(registry).decode())


async def test_open_metrics_exports_a_worker_while_the_block_runs(redis_url: str) -> None:
    app, orders = make_app(redis_url=redis_url)
    registry = CollectorRegistry()
    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        async with open_metrics(worker, registry=registry, refresh_interval=60) as metrics:
            timing = [TIMING.on]
            await orders.send_many(order_list(ORDERS))

            async def all_acknowledged() -> bool:
                await metrics.refresh()
                current = read(registry)
                return (
                    current.total("streamkit_events_processed_total") == 2 * ORDERS
                    and current.total("streamkit_partition_pending") == 0
                )

            await wait_until(all_acknowledged, what="every order acknowledged", within=30)
            scraped = read(registry)
            assert scraped.by_partition(
                "streamkit_partition_lag", processor="tally"
            ) == dict.fromkeys(range(4), 0)
            poisoned = ORDERS // POISONED_EVERY
            assert scraped.total("streamkit_dead_letters_total", processor="audit") == poisoned
            # Sent after the metrics were on: every event's latency is in.
            for processor in ("tally", "audit"):
                assert (
                    scraped.total("streamkit_end_to_end_latency_seconds_count", processor=processor)
                    == ORDERS
                )
            # Every event handed out is timed once, the failed ones included.
            assert scraped.total("streamkit_event_duration_seconds_count", processor="audit") == (
                ORDERS
            )
            assert scraped.total("streamkit_batch_duration_seconds_count", processor="audit") == 0
            assert scraped.total("streamkit_partitions_owned") == 8
            assert "Metrics of metered" in repr(metrics)
            # One registry holds the metrics of one worker.
            with pytest.raises(ConfigError, match="exports streamkit's metrics already"):
                async with open_metrics(worker, registry=registry):
                    pass
        timing.append(TIMING.on)
        assert timing == [True, False]
        assert not any(name.startswith("streamkit_") for name in read(registry).names)
        await worker.stop()


async def test_the_metrics_port_setting_serves_them_from_run_worker(redis_url: str) -> None:
    port = free_port()
    app, orders = make_app(redis_url=redis_url, metrics_port=port, metrics_refresh_interval=0.1)
    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        assert worker.metrics_url == f"http://127.0.0.1:{port}"
        await orders.send_many(order_list(10))
        found: list[Scrape] = []

        async def counted() -> bool:
            found[:] = [await scrape(f"{worker.metrics_url}/metrics")]
            return found[0].total("streamkit_events_processed_total", processor="tally") == 10

        await wait_until(counted, what="10 orders counted", within=30)
        assert found[0].total("streamkit_partitions_owned", processor="audit") == 4
        await worker.stop()


def test_worker_i_of_processes_serves_on_the_port_plus_i() -> None:
    settings = Settings.from_env({})
    assert metrics_settings(settings, None, None, {}) is settings
    assert metrics_settings(settings, 9100, None, {}).metrics_port == 9100
    index = {"STREAMKIT_WORKER_INDEX": "2"}
    assert metrics_settings(settings, 9100, "0.0.0.0", index).metrics_port == 9102
    assert metrics_settings(settings, 9100, "0.0.0.0", index).metrics_host == "0.0.0.0"
    # Any free port stays any free port; no port, no endpoint.
    assert metrics_settings(settings, 0, None, index).metrics_port == 0
    assert metrics_settings(settings, None, None, index).metrics_port is None
    from_env = Settings.from_env({"STREAMKIT_METRICS_PORT": "9200"})
    assert metrics_settings(from_env, None, None, index).metrics_port == 9202


HIDE_PROMETHEUS = "import sys; sys.modules['prometheus_client'] = None; "


def test_without_the_extra_the_import_says_what_to_install() -> None:
    result = subprocess.run(
        [sys.executable, "-c", HIDE_PROMETHEUS + "import streamkit.metrics"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "pip install '/path/to/streamkit[metrics]'" in result.stderr.splitlines()[-1]


async def test_without_the_extra_the_worker_refuses_a_metrics_port(redis_url: str) -> None:
    command = HIDE_PROMETHEUS + "from streamkit._cli import main; main()"
    result = await trio.run_process(
        [sys.executable, "-c", command, "worker", "tests.apps.metered:app", "--metrics-port", "0"],
        cwd=ROOT,
        env={**os.environ, "STREAMKIT_REDIS_URL": redis_url},
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert "metrics_port: streamkit.metrics needs prometheus-client" in stderr
    assert "Traceback" not in stderr


def test_every_metric_is_documented_with_its_type_and_labels() -> None:
    page = (ROOT / "docs" / "observability.md").read_text()
    rows = {
        name: (kind, labels)
        for name, kind, labels in re.findall(
            r"^\| `(streamkit_\w+)` \| (\w+) \|([\w, ]*)\|", page, re.MULTILINE
        )
    }
    for spec in METRICS:
        assert spec.name in rows, f"{spec.name} is not in docs/observability.md"
        kind, labels = rows[spec.name]
        assert kind == spec.kind, spec.name
        assert [label.strip() for label in labels.split(",") if label.strip()] == list(
            spec.labels
        ), spec.name
    assert set(rows) == {spec.name for spec in METRICS}
