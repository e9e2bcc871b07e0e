"""Meters: the counters and latency histograms the pieces keep for ``streamkit.metrics``.

The pieces count with plain integers (per batch, never per event) and
``streamkit.metrics`` reads the counts when Prometheus scrapes. Latencies are timed
only while :data:`TIMING` is on (``streamkit.metrics`` turns it on for as long as it
exports), so a process that exports nothing pays one ``if`` per batch for them.

Nothing here imports prometheus-client: the pieces keep their meters whether or not
the ``metrics`` extra is installed.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import attrs

from ._defaults import DEFAULT_METRICS_REFRESH_INTERVAL

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "DEFAULT_REFRESH_INTERVAL",
    "DURATION_BUCKETS",
    "TIMING",
    "Histogram",
    "JobMeter",
    "PartitionMeter",
    "ProcessorMeter",
    "Timing",
    "entry_millis",
]

#: Seconds between two readings from Redis of what the pieces cannot count themselves
#: (lag, pending, job queue depths): the ``metrics_refresh_interval`` setting.
DEFAULT_REFRESH_INTERVAL = DEFAULT_METRICS_REFRESH_INTERVAL

#: Upper bounds (seconds) of the latency histograms: from a trivial processor's time
#: per event (tens of microseconds) to a backlog's end-to-end latency (minutes).
DURATION_BUCKETS: tuple[float, ...] = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip


class Timing:
    """Whether latencies are timed, process-wide: on while anyone exports metrics.

    ``enable()`` and ``disable()`` nest (each exporter turns it on for its lifetime).
    """

    __slots__ = ("_users", "on")

    def __init__(self) -> None:
        self.on = False
        self._users = 0

    def enable(self) -> None:
        self._users += 1
        self.on = True

    def disable(self) -> None:
        self._users = max(0, self._users - 1)
        self.on = self._users > 0


#: The process-wide switch the pieces look at once per batch.
TIMING = Timing()


class Histogram:
    """A latency histogram that counts observations in fixed buckets, weighted.

    ``observe(seconds, count)`` counts ``count`` observations of ``seconds`` at once:
    a batch of events timed together is one call.
    """

    __slots__ = ("bounds", "counts", "sum", "total")

    def __init__(self, bounds: Sequence[float] = DURATION_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        # One count per bound, plus the +Inf bucket; not cumulative.
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.total = 0

    def observe(self, seconds: float, count: int = 1) -> None:
        # A bucket's bound is inclusive ("le"): bisect_left finds the first bound >= seconds.
        self.counts[bisect.bisect_left(self.bounds, seconds)] += count
        self.sum += seconds * count
        self.total += count

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)`` per bucket, +Inf last."""
        out = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


def entry_millis(entry_id: bytes) -> int:
    """The millisecond timestamp of a stream entry id (``b"1700000000000-3"``)."""
    return int(entry_id.partition(b"-")[0])


@attrs.define(eq=False)
class PartitionMeter:
    """What happened on one partition of one processor, since this process started
    serving it (kept across the partition's moves away and back).

    Attributes:
        processor: the processor's meter (its latency histograms).
        acknowledged: events acknowledged in Redis (the processor moved past them).
        failed: events in flight when the processor raised (each failed attempt).
        dead_lettered: events written to the dead-letter stream, by reason.
    """

    processor: ProcessorMeter
    acknowledged: int = 0
    failed: int = 0
    dead_lettered: dict[str, int] = attrs.field(factory=dict)


@attrs.define(eq=False)
class ProcessorMeter:
    """The meters of one processor in this process (one per fetcher).

    Attributes:
        partitions: per partition served so far, its counters.
        fenced_out: fenced reads and acknowledgements refused (the lease was not ours).
        fetch_seconds: the round trip of each fenced read.
        event_seconds: processing time per event of ``records()`` / ``raw()`` (each
            fetched batch timed as a whole; its events count with its mean).
        batch_seconds: processing time per batch of ``take()``.
        end_to_end_seconds: from an event's entry id timestamp (when Redis added it)
            to the processor moving past it, per batch (its events count with the
            mean of its first and last).
    """

    partitions: dict[int, PartitionMeter] = attrs.field(factory=dict)
    fenced_out: int = 0
    fetch_seconds: Histogram = attrs.field(factory=Histogram)
    event_seconds: Histogram = attrs.field(factory=Histogram)
    batch_seconds: Histogram = attrs.field(factory=Histogram)
    end_to_end_seconds: Histogram = attrs.field(factory=Histogram)

    def partition(self, partition: int) -> PartitionMeter:
        """The counters of ``partition`` (created on first use)."""
        meter = self.partitions.get(partition)
        if meter is None:
            meter = self.partitions[partition] = PartitionMeter(self)
        return meter

    def observe_end_to_end(self, first: bytes, last: bytes, count: int, now: float) -> None:
        """Count ``count`` events from entry ``first`` to ``last`` done at Unix time ``now``."""
        sent = (entry_millis(first) + entry_millis(last)) / 2000
        self.end_to_end_seconds.observe(max(0.0, now - sent), count)


@attrs.define(eq=False)
class JobMeter:
    """What a job worker did: tries ended, by job and outcome, and their durations.

    Attributes:
        finished: ``(job name, outcome) -> tries``, outcome one of ``"succeeded"``,
            ``"retried"`` (failed, to be tried again), ``"dead"`` (to the dead-letter
            queue) and ``"aborted"``.
        durations: per job name, the duration of its tries (timed while
            :data:`TIMING` is on).
    """

    finished: dict[tuple[str, str], int] = attrs.field(factory=dict)
    durations: dict[str, Histogram] = attrs.field(factory=dict)

    def count(self, job: str, outcome: str, seconds: float | None) -> None:
        key = (job, outcome)
        self.finished[key] = self.finished.get(key, 0) + 1
        if seconds is not None:
            histogram = self.durations.get(job)
            if histogram is None:
                histogram = self.durations[job] = Histogram()
            histogram.observe(seconds)
