"""Triton's latency summaries (`--metrics-config summary_latencies=true`): the sliding window,
the nearest-rank quantiles, the bounded sample of a busy slot, the settings as Triton reads
them, and what a version's statistics observe."""

from __future__ import annotations

import io
import math
import pickle

import pytest

from tests.unit.test_statistics import OK, TIMES, admitted, batched, infer
from tritonactor.core.errors import internal
from tritonactor.engine import wire
from tritonactor.observability.summaries import (
    DEFAULT_QUANTILES,
    KEPT,
    SLOT_NS,
    LatencyOptions,
    LatencySummaries,
    WindowedSummary,
    latency_options,
    parse_quantiles,
)
from tritonactor.scheduling.statistics import VersionStatistics

QUANTILES = ((0.0, 0.0), (0.5, 0.05), (0.9, 0.01), (0.99, 0.001), (0.999, 0.001), (1.0, 0.0))
T0 = 1_000 * SLOT_NS  # a slot's start


def values(summary: WindowedSummary, now_ns: int, quantiles=QUANTILES) -> list[float]:
    return [value for _, value in summary.sample(quantiles, now_ns).quantiles]


def test_quantiles_are_nearest_ranks_of_what_was_observed() -> None:
    summary = WindowedSummary()
    for value in (57, 3, 100, 42, 8, 99, 1, 70, 23, 64):  # ten values, not in order
        summary.observe(value, T0)
    # nearest rank: the smallest value with at least q of the ten at or below it
    assert values(summary, T0) == [1, 42, 99, 100, 100, 100]
    sample = summary.sample(QUANTILES, T0)
    assert (sample.count, sample.total) == (10, 467)
    assert [q for q, _ in sample.quantiles] == [q for q, _ in QUANTILES]


def test_an_even_count_splits_at_the_lower_middle() -> None:
    summary = WindowedSummary()
    for value in (10, 20, 30, 40):
        summary.observe(value, T0)
    assert values(summary, T0, ((0.5, 0.05), (0.75, 0.01))) == [20, 30]


def test_the_window_is_the_last_minute_the_counts_are_forever() -> None:
    summary = WindowedSummary()
    summary.observe(1_000, T0)  # slot 0
    summary.observe(5, T0 + 3 * SLOT_NS)  # slot 3
    # both within five slots of the newest
    assert values(summary, T0 + 4 * SLOT_NS + SLOT_NS // 2, ((1.0, 0.0),)) == [1_000]
    # slot 0 has aged out; slot 3 remains
    assert values(summary, T0 + 5 * SLOT_NS, ((1.0, 0.0),)) == [5]
    # nothing observed in the last five slots: NaN, as Triton's library reads an empty window
    late = summary.sample(((0.5, 0.05),), T0 + 8 * SLOT_NS)
    assert math.isnan(late.quantiles[0][1])
    assert (late.count, late.total) == (2, 1_005)
    # an observation ages out the slots behind it
    summary.observe(7, T0 + 9 * SLOT_NS)
    assert values(summary, T0 + 9 * SLOT_NS, ((0.0, 0.0), (1.0, 0.0))) == [7, 7]


def test_a_busy_slot_keeps_a_bounded_sample_weighed_by_what_it_saw() -> None:
    summary = WindowedSummary()
    for _ in range(10):
        summary.observe(1, T0)  # slot 0: ten requests, all kept
    for _ in range(3 * KEPT):
        summary.observe(1_000, T0 + SLOT_NS)  # slot 1: sampled down to KEPT
    kept = sum(len(slot.values) for slot in summary._slots)
    assert kept == 10 + KEPT
    # weighed by what each slot saw, 10 of 6,154 requests took 1 µs: the 0.1 % quantile is
    # 1000 (the weighing) where 10 of 2,058 kept values would have made it 1
    assert values(summary, T0 + SLOT_NS, ((0.001, 0.001), (0.5, 0.05))) == [1, 1_000]
    assert values(summary, T0 + SLOT_NS, ((0.002, 0.001),)) == [1_000]
    assert summary.sample(QUANTILES, T0 + SLOT_NS).count == 10 + 3 * KEPT


def test_a_sampled_slot_still_reads_its_quantiles_closely() -> None:
    summary = WindowedSummary()
    seen = 20 * KEPT
    for value in range(seen):
        summary.observe(value, T0)
    median, p90 = values(summary, T0, ((0.5, 0.05), (0.9, 0.01)))
    assert abs(median - 0.5 * seen) < 0.05 * seen
    assert abs(p90 - 0.9 * seen) < 0.05 * seen


@pytest.mark.parametrize(
    ("entries", "expected", "complaints"),
    [
        ((), LatencyOptions(), []),
        (("summary_latencies=true",), LatencyOptions(summaries=True), []),
        (("summary_latencies=TRUE", "counter_latencies=no"), LatencyOptions(), []),
        (
            ("counter_latencies=false", "counter_latencies=true"),
            LatencyOptions(counters=False),
            [],
        ),
        (
            ("summary_quantiles=0.5:0.05,0.99:0.001",),
            LatencyOptions(quantiles=((0.5, 0.05), (0.99, 0.001))),
            [],
        ),
        (
            ("summary_quantiles=bad,0.7:x,1.5:0.01,0.9:0.01",),
            LatencyOptions(quantiles=((0.9, 0.01),)),
            [
                "Invalid option: [bad]. No ':' delimiter found. Expected format is "
                "<quantile>:<error>",
                "Invalid option: [0.7:x]. Error: not a number",
                "Invalid option: [1.5:0.01]. A quantile and its error are between 0 and 1",
            ],
        ),
        (
            ("summary_quantiles=nothing",),
            LatencyOptions(),
            [
                "Invalid option: [nothing]. No ':' delimiter found. Expected format is "
                "<quantile>:<error>"
            ],
        ),
        (
            ("histogram_latencies=true",),
            LatencyOptions(),
            [
                "--metrics-config setting 'histogram_latencies' is not one tritonactor knows: "
                "ignored"
            ],
        ),
    ],
)
def test_the_settings_read_as_triton_reads_them(
    entries: tuple[str, ...], expected: LatencyOptions, complaints: list[str]
) -> None:
    heard: list[str] = []
    assert latency_options(entries, heard.append) == expected
    assert heard == complaints


def test_the_default_quantiles_are_tritons() -> None:
    assert (
        parse_quantiles("0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001") == DEFAULT_QUANTILES
    )


def test_a_version_observes_each_successful_request_of_a_batch() -> None:
    summaries = LatencySummaries(((1.0, 0.0),))
    stats = VersionStatistics(batching=True, summaries=summaries)
    batch = [infer(batched(2), 900), infer(batched(3), 950), infer(batched(1), 800)]
    results = [OK, internal("no"), OK]
    for item, result in zip(batch, results, strict=True):
        admitted(stats, item, result)
    stats.record_execution(batch, results, TIMES)
    found = summaries.sample(TIMES.answered)
    assert set(found) == {"request", "queue", "compute_input", "compute_infer", "compute_output"}
    # the two that succeeded, in µs (ns // 1000, as Triton observes them)
    assert (found["request"].count, found["request"].total) == (2, 0)
    assert found["compute_infer"].count == 2
    # a copy for a front end (the engine's wire pickles it so) leaves the windows here
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5)
    pickler.dispatch_table = wire._TABLE
    pickler.dump(stats)
    copy = pickle.loads(out.getvalue())
    assert copy.summaries is None
    assert copy.success.count == 2


def test_a_version_using_the_response_cache_has_no_request_summary() -> None:
    summaries = LatencySummaries(DEFAULT_QUANTILES, cached=True)
    stats = VersionStatistics(batching=False, summaries=summaries)
    start = T0
    stats.record_cache_hit(start, start + 2_000, start + 7_000, start + 9_000)
    stats.record_cache_miss(4_000)
    found = summaries.sample(start + 9_000)
    assert set(found) == {
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    assert (found["queue"].count, found["queue"].total) == (1, 2)
    assert (found["cache_hit"].count, found["cache_hit"].total) == (1, 5)
    assert found["cache_miss"].count == 1
    assert found["compute_infer"].count == 0
