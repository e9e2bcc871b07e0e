"""The pieces' meters: weighted latency histograms and the process-wide timing switch."""

from __future__ import annotations

import pytest

from streamkit._meter import Histogram, ProcessorMeter, Timing, entry_millis


def test_histogram_counts_weighted_observations_in_inclusive_buckets() -> None:
    histogram = Histogram((0.1, 1.0))
    histogram.observe(0.05)
    histogram.observe(0.1, 3)  # on a bound: counted in that bucket ("le")
    histogram.observe(0.5, 2)
    histogram.observe(7.0)
    assert histogram.cumulative() == [(0.1, 4), (1.0, 6), (float("inf"), 7)]
    assert histogram.total == 7
    assert histogram.sum == pytest.approx(0.05 + 0.3 + 1.0 + 7.0)


def test_timing_is_on_while_anyone_enabled_it() -> None:
    timing = Timing()
    seen = [timing.on]
    timing.enable()
    timing.enable()
    timing.disable()
    seen.append(timing.on)
    timing.disable()
    seen.append(timing.on)
    timing.disable()  # one too many: stays off, and the next enable counts
    timing.enable()
    seen.append(timing.on)
    assert seen == [False, True, False, True]


def test_end_to_end_latency_counts_each_event_of_a_batch_with_its_mean() -> None:
    assert entry_millis(b"1700000000123-7") == 1700000000123
    meter = ProcessorMeter()
    # Sent at t = 1000.000 s and 1000.100 s, done at 1001.050 s: 1 s each on average.
    meter.observe_end_to_end(b"1000000-0", b"1000100-3", 4, 1001.050)
    histogram = meter.end_to_end_seconds
    assert histogram.total == 4
    assert histogram.sum == pytest.approx(4.0)
    # A clock behind Redis's never makes a negative latency.
    meter.observe_end_to_end(b"2000000-0", b"2000000-0", 1, 1999.0)
    assert histogram.cumulative()[0] == (histogram.bounds[0], 1)


def test_partition_counters_are_kept_per_partition() -> None:
    meter = ProcessorMeter()
    assert meter.partition(3) is meter.partition(3)
    meter.partition(3).acknowledged += 5
    assert {p: m.acknowledged for p, m in meter.partitions.items()} == {3: 5}
    assert meter.partition(3).processor is meter
