"""The Prometheus collector of a worker: every metric, read from the pieces at scrape time.

Nothing here runs per event. The pieces keep plain counters and histograms (see
``streamkit._meter``), their ``statistics()``, and the readings refreshed from Redis
in the background (see :mod:`._readings`); :meth:`WorkerCollector.collect` turns
them into metric families when Prometheus scrapes. It reads in the Trio thread (the
endpoint is served there), so it sees no half-made update.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import attrs
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from .._errors import NotConnected
from .._redis import redis_statistics

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from .._meter import Histogram
    from ._readings import Readings
    from ._source import Worker

__all__ = ["METRICS", "MetricSpec", "WorkerCollector"]

Kind = Literal["counter", "gauge", "histogram", "summary"]


@attrs.frozen
class MetricSpec:
    """One exported metric: its name (as it appears in a scrape, counters with
    ``_total``), type, labels and meaning."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str


P = ("processor",)
PP = ("processor", "partition")

# Every metric a worker exports, a row each: name, kind, labels, help.
_ROWS: tuple[tuple[str, Kind, tuple[str, ...], str], ...] = (
    # -- events
    ("streamkit_events_processed_total", "counter", PP,
     ("Events acknowledged in Redis after the processor moved past them "
      "(dead-lettered and ignored ones included).")),
    ("streamkit_events_failed_total", "counter", PP,
     ("Events in flight when the processor raised (each failed attempt, retries "
      "included).")),
    ("streamkit_dead_letters_total", "counter", (*PP, "reason"),
     "Events written to the processor's dead-letter stream, by reason."),
    ("streamkit_event_duration_seconds", "histogram", P,
     "Processing time per event of records() and raw(), timed per fetched batch."),
    ("streamkit_batch_duration_seconds", "histogram", P,
     "Processing time per batch of take()."),
    ("streamkit_end_to_end_latency_seconds", "histogram", P,
     ("From the time in an event's entry id (when Redis added it) to the "
      "processor moving past it.")),
    ("streamkit_fetch_duration_seconds", "histogram", P,
     ("Round trip of each fenced read of a partition (XREADGROUP and the "
      "acknowledgements riding with it).")),
    # -- partitions
    ("streamkit_partition_lag", "gauge", PP,
     "Entries of an owned partition not yet delivered to the processor."),
    ("streamkit_partition_pending", "gauge", PP,
     "Entries of an owned partition delivered and not yet acknowledged."),
    ("streamkit_partitions_owned", "gauge", P,
     "Partitions this worker processes now."),
    ("streamkit_partitions_halted", "gauge", P,
     "Owned partitions halted by the exception policy, waiting for `streamkit resume`."),
    ("streamkit_late_events_total", "counter", (*PP, "table"),
     ("Late events of a windowed table (every window they fall in had closed), dropped "
      "or dead-lettered, as the partition's commits counted them; exported by the worker "
      "owning the partition.")),
    ("streamkit_dead_letter_stream_length", "gauge", P,
     "Dead letters waiting in the processor's dead-letter stream."),
    ("streamkit_group_members", "gauge", P,
     "Members of the processor's group (workers running it), as this worker knows."),
    # -- rebalancing and fencing
    ("streamkit_rebalance_duration_seconds", "summary", P,
     ("Rebalances of this worker (assignment changes) and how long each took "
      "until every assigned partition ran.")),
    ("streamkit_rebalance_in_progress", "gauge", P,
     "1 while a rebalance of this worker is under way."),
    ("streamkit_lease_losses_total", "counter", P,
     "Partition leases lost while processing (expired or taken over)."),
    ("streamkit_fenced_out_total", "counter", P,
     "Fenced reads and acknowledgements refused: the lease was no longer this worker's."),
    ("streamkit_data_loss_total", "counter", P,
     ("Times this worker found Redis had lost the processor's data (its consumer groups "
      "or stream metadata vanished): its tables may have lost updates.")),
    # -- redis
    ("streamkit_redis_connections", "gauge", ("pool",),
     "Open connections to Redis, shared (multiplexed) or dedicated (blocking commands)."),
    ("streamkit_redis_connections_lost_total", "counter", (),
     "Connections to Redis lost unexpectedly."),
    ("streamkit_redis_reconnects_total", "counter", (),
     "Connections to Redis opened again after one was lost."),
    # -- jobs
    ("streamkit_jobs_queued", "gauge", ("queue", "priority"),
     "Jobs ready to run, not running, by priority (the whole queue)."),
    ("streamkit_jobs_scheduled", "gauge", ("queue",),
     "Jobs waiting for their time (the whole queue)."),
    ("streamkit_jobs_running", "gauge", ("queue",),
     "Jobs running now, on any worker."),
    ("streamkit_jobs_retrying", "gauge", ("queue",),
     "Jobs whose last try failed, waiting for their next try."),
    ("streamkit_jobs_dead", "gauge", ("queue",),
     "Jobs in the dead-letter queue."),
    ("streamkit_jobs_in_progress", "gauge", ("queue",),
     "Jobs this worker has claimed and not finished."),
    ("streamkit_jobs_finished_total", "counter", ("queue", "job", "outcome"),
     "Tries this worker ended, by outcome: succeeded, retried, dead, aborted."),
    ("streamkit_job_duration_seconds", "histogram", ("queue", "job"),
     "Duration of the tries this worker ran."),
)  # fmt: skip

#: Every metric a worker exports. The docs (observability page) describe each one.
METRICS: tuple[MetricSpec, ...] = tuple(MetricSpec(*row) for row in _ROWS)

_SPECS = {spec.name: spec for spec in METRICS}


def _family(name: str) -> Metric:
    spec = _SPECS[name]
    labels = list(spec.labels)
    if spec.kind == "counter":
        return CounterMetricFamily(name, spec.help, labels=labels)
    if spec.kind == "gauge":
        return GaugeMetricFamily(name, spec.help, labels=labels)
    if spec.kind == "histogram":
        return HistogramMetricFamily(name, spec.help, labels=labels)
    return SummaryMetricFamily(name, spec.help, labels=labels)


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return [
        ("+Inf" if math.isinf(bound) else repr(bound), count)
        for bound, count in histogram.cumulative()
    ]


@attrs.define(eq=False)
class WorkerCollector(Collector):
    """Collects a worker's metrics (see :data:`METRICS`) for a Prometheus registry."""

    worker: Worker
    readings: Readings

    def describe(self) -> Iterable[Metric]:
        return [_family(spec.name) for spec in METRICS]

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Any] = {spec.name: _family(spec.name) for spec in METRICS}
        self._collect_processors(families)
        self._collect_redis(families)
        self._collect_jobs(families)
        return list(families.values())

    def _collect_processors(self, f: dict[str, Any]) -> None:
        readings = self.readings
        for executor in list(self.worker.executors):
            name = executor.processor.name
            rebalancer = executor.rebalancer.statistics()
            owned = rebalancer.owned
            if executor.fetcher is not None:
                meter = executor.fetcher._meter
                for partition, counts in sorted(meter.partitions.items()):
                    labels = [name, str(partition)]
                    f["streamkit_events_processed_total"].add_metric(labels, counts.acknowledged)
                    f["streamkit_events_failed_total"].add_metric(labels, counts.failed)
                    for reason, n in sorted(counts.dead_lettered.items()):
                        f["streamkit_dead_letters_total"].add_metric([*labels, reason], n)
                for family, histogram in (
                    ("streamkit_event_duration_seconds", meter.event_seconds),
                    ("streamkit_batch_duration_seconds", meter.batch_seconds),
                    ("streamkit_end_to_end_latency_seconds", meter.end_to_end_seconds),
                    ("streamkit_fetch_duration_seconds", meter.fetch_seconds),
                ):
                    f[family].add_metric([name], _buckets(histogram), histogram.sum)
                f["streamkit_fenced_out_total"].add_metric([name], meter.fenced_out)
            losses = self.worker.data_loss
            if losses is not None:
                f["streamkit_data_loss_total"].add_metric([name], losses.losses.get(name, 0))
            for partition, reading in sorted(readings.groups.get(name, {}).items()):
                if partition not in owned:
                    continue  # moved away since the last refresh
                labels = [name, str(partition)]
                if reading.lag is not None:
                    f["streamkit_partition_lag"].add_metric(labels, reading.lag)
                f["streamkit_partition_pending"].add_metric(labels, reading.pending)
            for partition, late in sorted(readings.late.get(name, {}).items()):
                if partition not in owned:
                    continue
                for table, n in sorted(late.items()):
                    f["streamkit_late_events_total"].add_metric([name, str(partition), table], n)
            if name in readings.dead_letters:
                f["streamkit_dead_letter_stream_length"].add_metric(
                    [name], readings.dead_letters[name]
                )
            f["streamkit_partitions_owned"].add_metric([name], len(owned))
            f["streamkit_partitions_halted"].add_metric([name], len(executor.halted.value))
            f["streamkit_group_members"].add_metric(
                [name], executor.membership.statistics().members
            )
            f["streamkit_rebalance_duration_seconds"].add_metric(
                [name], count_value=rebalancer.rebalances, sum_value=rebalancer.rebalance_seconds
            )
            f["streamkit_rebalance_in_progress"].add_metric([name], int(rebalancer.rebalancing))
            f["streamkit_lease_losses_total"].add_metric([name], rebalancer.lost)

    def _collect_redis(self, f: dict[str, Any]) -> None:
        app = self.worker.app
        try:
            redis = app.redis
        except NotConnected:
            return  # not connected (yet, or any more)
        stats = redis_statistics(redis)
        f["streamkit_redis_connections"].add_metric(["shared"], stats.shared_connections)
        f["streamkit_redis_connections"].add_metric(["dedicated"], stats.dedicated_connections)
        f["streamkit_redis_connections_lost_total"].add_metric([], stats.lost)
        f["streamkit_redis_reconnects_total"].add_metric([], stats.reconnects)

    def _collect_jobs(self, f: dict[str, Any]) -> None:
        jobs = self.worker.jobs
        if jobs is None:
            return
        queue = jobs.queue.name
        counts = self.readings.jobs
        if counts is not None:
            for priority, n in counts.queued.items():
                f["streamkit_jobs_queued"].add_metric([queue, priority], n)
            f["streamkit_jobs_scheduled"].add_metric([queue], counts.scheduled)
            f["streamkit_jobs_running"].add_metric([queue], counts.running)
            f["streamkit_jobs_retrying"].add_metric([queue], counts.retrying)
            f["streamkit_jobs_dead"].add_metric([queue], counts.dead)
        f["streamkit_jobs_in_progress"].add_metric([queue], jobs.running_jobs)
        meter = jobs._meter
        for (job, outcome), n in sorted(meter.finished.items()):
            f["streamkit_jobs_finished_total"].add_metric([queue, job, outcome], n)
        for job, histogram in sorted(meter.durations.items()):
            f["streamkit_job_duration_seconds"].add_metric(
                [queue, job], _buckets(histogram), histogram.sum
            )


def sample_names(spec: MetricSpec) -> Iterator[str]:
    """The names of the samples ``spec`` produces in a scrape."""
    if spec.kind == "histogram":
        yield from (f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count")
    elif spec.kind == "summary":
        yield from (f"{spec.name}_sum", f"{spec.name}_count")
    else:
        yield spec.name
