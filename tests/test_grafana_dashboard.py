"""The Grafana dashboard (``contrib/grafana/streamkit-dashboard.json``): a valid dashboard
model whose every query names metrics, and labels, that a real worker run exports."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from streamkit.testing import free_port
from tests.metered_run import APP, FAST_METRICS, all_done, fill, scrape_when
from tests.workers import start_worker

if TYPE_CHECKING:
    from tests.scrape import Scrape
    from tests.workers import WorkerProcess

pytestmark = pytest.mark.timeout(90)

DASHBOARD = (
    Path(__file__).resolve().parent.parent / "contrib" / "grafana" / "streamkit-dashboard.json"
)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: Labels Prometheus adds to every scraped series, and the histograms' bucket label.
SCRAPE_LABELS = {"instance", "job"}

_SELECTOR = re.compile(r"\b(streamkit_[a-z0-9_]+)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"')
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\((streamkit_[a-z0-9_]+),\s*(\w+)\)")


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: the panels' targets and the template variables' queries."""
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    exprs.extend(
        variable["query"]["query"]
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    )
    return exprs


def balanced(expr: str) -> bool:
    depth = {"(": 0, "{": 0, "[": 0}
    closing = {")": "(", "}": "{", "]": "["}
    for char in re.sub(r'"[^"]*"', '""', expr):
        if char in depth:
            depth[char] += 1
        elif char in closing:
            depth[closing[char]] -= 1
            if depth[closing[char]] < 0:
                return False
    return not any(depth.values())


def test_the_file_is_a_grafana_dashboard_model() -> None:
    dashboard = load()
    assert dashboard["title"] == "streamkit"
    assert dashboard["uid"]
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["time"] == {"from": "now-1h", "to": "now"}
    # Imported into any Grafana: the data source is a variable, not a fixed uid.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("processor", "queue"):
        assert variables[name]["datasource"] == DATASOURCE
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["title"]
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
        if panel["type"] == "row":
            continue
        assert panel["type"] in ("timeseries", "stat"), panel["title"]
        assert panel["datasource"] == DATASOURCE, panel["title"]
        targets = panel["targets"]
        assert targets, panel["title"]
        ref_ids = [target["refId"] for target in targets]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in targets:
            assert target["datasource"] == DATASOURCE
            assert _SELECTOR.search(target["expr"]), target["expr"]
    for expr in queries(dashboard):
        assert balanced(expr), expr


def test_it_shows_lag_throughput_latency_quantiles_and_rebalances() -> None:
    used = {name for expr in queries(load()) for name, _ in _SELECTOR.findall(expr)}
    assert {
        "streamkit_partition_lag",
        "streamkit_events_processed_total",
        "streamkit_end_to_end_latency_seconds_bucket",
        "streamkit_rebalance_duration_seconds_count",
        "streamkit_jobs_queued",
    } <= used
    assert any(expr.startswith("histogram_quantile(0.99") for expr in queries(load()))


def labels_of(scrape: Scrape, name: str) -> set[str]:
    return {label for sample, labels in scrape.samples for label, _ in labels if sample == name}


def check_query(expr: str, scrape: Scrape) -> list[str]:
    """What in ``expr`` the scrape does not have: metric names, labels."""
    problems = []
    names = [name for name, _ in _SELECTOR.findall(expr)]
    known: set[str] = set(SCRAPE_LABELS)
    for name, matchers in _SELECTOR.findall(expr):
        if name not in scrape.names:
            problems.append(f"{name} is not exported")
            continue
        labels = labels_of(scrape, name)
        known |= labels
        problems.extend(
            f"{name} has no label {label!r}"
            for label in _MATCHER.findall(matchers)
            if label not in labels | SCRAPE_LABELS
        )
    for group in _GROUPING.findall(expr):
        problems.extend(
            f"no metric of {names} has the label {label!r}"
            for label in filter(None, (part.strip() for part in group.split(",")))
            if label not in known
        )
    for name, label in _LABEL_VALUES.findall(expr):
        if label not in labels_of(scrape, name):
            problems.append(f"{name} has no label {label!r}")
    return problems


async def test_every_query_names_metrics_and_labels_a_real_worker_exports(
    redis_url: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    orders, jobs = 300, 5
    await fill(redis_url, orders=orders, jobs=jobs)
    port = free_port()
    worker = start_worker(
        redis_url, tmp_path, app=APP, args=("--metrics-port", str(port)), env=FAST_METRICS
    )
    workers.append(worker)
    scrape = await scrape_when(
        f"http://127.0.0.1:{port}/metrics", "everything processed", all_done(orders, jobs)
    )
    problems = {expr: check_query(expr, scrape) for expr in queries(load())}
    assert not {expr: found for expr, found in problems.items() if found}
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log()
