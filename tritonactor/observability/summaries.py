"""Triton's latency summaries (`--metrics-config summary_latencies=true`): per model version,
the quantiles of each successful request's durations over the last minute, beside the
cumulative counters. Also the other latency settings `--metrics-config` takes.

Triton's Prometheus library keeps a summary's quantiles for a sliding window of 60 seconds in
five age buckets, each estimating the quantiles of what it saw within an error given per
quantile (`summary_quantiles`). Here a summary keeps the values themselves, in five slots of 12
seconds (what is reported covers the last 48 to 60 seconds, as the library's oldest bucket
does), each slot holding at most `KEPT` of them: past that, a uniform sample of what the slot saw
(reservoir sampling), weighted by how much it saw when the quantiles are read. A quantile is the
smallest value with at least that share of the window's requests at or below it (the nearest
rank), as the library reports one of the values it saw; an empty window reads NaN. `_count` and
`_sum` count every observation since the version loaded, as Prometheus summaries do.

Observing is a few list operations on the event loop, per request and per duration, and only
when summaries are on; the quantiles are computed when the metrics are scraped.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# Triton's default quantiles and their allowed errors (the errors only matter to an estimator;
# values here are exact within a slot's sample).
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
)
MAX_AGE_NS = 60 * 1_000_000_000
AGE_BUCKETS = 5
SLOT_NS = MAX_AGE_NS // AGE_BUCKETS
# The values one slot keeps of one duration; past it, a uniform sample of what it saw.
KEPT = 2048


@dataclass(frozen=True, slots=True)
class LatencyOptions:
    """What `--metrics-config` sets about the per-version latency metrics: the duration
    counters (`counter_latencies`, on unless `false`), the summaries (`summary_latencies`, off
    unless `true`) and the summaries' quantiles (`summary_quantiles`)."""

    counters: bool = True
    summaries: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES


def latency_options(
    entries: Iterable[str], complain: Callable[[str], None] | None = None
) -> LatencyOptions:
    """The latency settings of `--metrics-config` entries (`<setting>=<value>`, checked by the
    settings), read as Triton reads them: `counter_latencies=false` given at all turns the
    counters off and `summary_latencies=true` the summaries on (those values exactly); the last
    `summary_quantiles` with a pair that reads wins, a pair that does not told to `complain`
    (the defaults stay when none reads); settings tritonactor does not know are told to
    `complain` and ignored."""
    counters, summaries, quantiles = True, False, DEFAULT_QUANTILES
    for entry in entries:
        setting, _, value = entry.partition("=")
        if setting == "counter_latencies":
            counters = counters and value != "false"
        elif setting == "summary_latencies":
            summaries = summaries or value == "true"
        elif setting == "summary_quantiles":
            parsed = parse_quantiles(value, complain)
            if parsed:
                quantiles = parsed
        elif complain is not None:
            complain(f"--metrics-config setting '{setting}' is not one tritonactor knows: ignored")
    return LatencyOptions(counters, summaries, quantiles)


def parse_quantiles(
    text: str, complain: Callable[[str], None] | None = None
) -> tuple[tuple[float, float], ...]:
    """`<quantile>:<error>` pairs separated by commas (`0.5:0.05,0.9:0.01`); a pair that is
    not one is told to `complain` (a missing `:` in Triton's words) and skipped."""
    pairs: list[tuple[float, float]] = []
    for pair in text.split(","):
        quantile_text, colon, error_text = pair.partition(":")
        problem = ""
        if not colon:
            problem = "No ':' delimiter found. Expected format is <quantile>:<error>"
        else:
            try:
                quantile, error = float(quantile_text), float(error_text)
            except ValueError:
                problem = "Error: not a number"
            else:
                if not (0.0 <= quantile <= 1.0 and 0.0 <= error <= 1.0):
                    problem = "A quantile and its error are between 0 and 1"
        if problem:
            if complain is not None:
                complain(f"Invalid option: [{pair}]. {problem}")
            continue
        pairs.append((quantile, error))
    return tuple(pairs)


class SummarySample:
    """One summary at a scrape: every observation's count and sum (µs), and each quantile's
    value over the window (NaN when it is empty), computed from a copy of the window when first
    read: the engine reads them on a worker thread (`settle`), the copy taken on the loop."""

    __slots__ = ("_asked", "_quantiles", "_window", "count", "total")

    def __init__(
        self,
        count: int,
        total: int,
        asked: Sequence[tuple[float, float]],
        window: list[tuple[list[int], int]],
    ) -> None:
        self.count = count
        self.total = total
        self._asked = tuple(asked)
        self._window = window  # each slot's kept values (a copy) and how many it saw
        self._quantiles: tuple[tuple[float, float], ...] | None = None

    @property
    def quantiles(self) -> tuple[tuple[float, float], ...]:
        """(quantile, value) for each quantile asked."""
        if self._quantiles is None:
            asked = self._asked
            values = _ranked(self._window, asked)
            self._quantiles = tuple(zip((q for q, _ in asked), values, strict=True))
            self._window = []
        return self._quantiles

    def settle(self) -> None:
        """Compute the quantiles now (where the caller can spend the time)."""
        _ = self.quantiles


class _Slot:
    __slots__ = ("index", "seen", "values")

    def __init__(self, index: int) -> None:
        self.index = index
        self.seen = 0
        self.values: list[int] = []


class WindowedSummary:
    """One duration's summary (microseconds): see the module's docstring. Observed and read on
    one thread (the event loop)."""

    __slots__ = ("_count", "_slots", "_total")

    def __init__(self) -> None:
        self._count = 0
        self._total = 0
        self._slots: deque[_Slot] = deque()

    def observe(self, value_us: int, now_ns: int) -> None:
        """One observation of `value_us`, at `now_ns` (`time.perf_counter_ns`)."""
        self._count += 1
        self._total += value_us
        index = now_ns // SLOT_NS
        slots = self._slots
        if slots and slots[-1].index >= index:
            slot = slots[-1]  # (a time from a thread that read its clock a little earlier)
        else:
            slot = _Slot(index)
            slots.append(slot)
            while slots[0].index <= index - AGE_BUCKETS:
                slots.popleft()
        slot.seen += 1
        values = slot.values
        if len(values) < KEPT:
            values.append(value_us)
        else:
            kept = random.randrange(slot.seen)
            if kept < KEPT:
                values[kept] = value_us

    def sample(self, quantiles: Sequence[tuple[float, float]], now_ns: int) -> SummarySample:
        """The summary as scraped at `now_ns` (its window copied: its quantiles are computed
        when read)."""
        oldest = now_ns // SLOT_NS - AGE_BUCKETS
        window = [
            (list(slot.values), slot.seen)
            for slot in self._slots
            if slot.index > oldest and slot.values
        ]
        return SummarySample(self._count, self._total, quantiles, window)


def _ranked(
    window: list[tuple[list[int], int]], quantiles: Sequence[tuple[float, float]]
) -> list[float]:
    """Each quantile's nearest-rank value over the slots of `window` (each slot's kept values
    and how many it saw), a kept value weighing what its slot saw over what it kept."""
    if not window:
        return [math.nan] * len(quantiles)
    values = np.concatenate([np.asarray(kept, dtype=np.float64) for kept, _ in window])
    weights = np.concatenate([np.full(len(kept), seen / len(kept)) for kept, seen in window])
    order = np.argsort(values, kind="stable")
    values = values[order]
    ranks = np.cumsum(weights[order])
    total = ranks[-1]
    # (a rank is a whole number of requests unless a slot was sampled: a little slack keeps
    # 0.5 of 4 requests at the second, not the third, when the sums round)
    found = np.searchsorted(ranks, [q * total - 1e-9 * total for q, _ in quantiles], side="left")
    return [float(values[min(int(i), len(values) - 1)]) for i in found]


class LatencySummaries:
    """A model version's summaries: request (absent for a version that uses the response
    cache, as in Triton 2.51), queue, compute input, infer and output; and for a version that
    uses the cache, its hits' and misses' durations."""

    __slots__ = (
        "cache_hit",
        "cache_miss",
        "compute_infer",
        "compute_input",
        "compute_output",
        "quantiles",
        "queue",
        "request",
    )

    def __init__(self, quantiles: Sequence[tuple[float, float]], cached: bool = False) -> None:
        self.quantiles = tuple(quantiles)
        self.request = None if cached else WindowedSummary()
        self.queue = WindowedSummary()
        self.compute_input = WindowedSummary()
        self.compute_infer = WindowedSummary()
        self.compute_output = WindowedSummary()
        self.cache_hit = WindowedSummary() if cached else None
        self.cache_miss = WindowedSummary() if cached else None

    def observe(
        self,
        now_ns: int,
        request_ns: int,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """One successful request's durations (ns), observed in microseconds as Triton's."""
        if self.request is not None:
            self.request.observe(request_ns // 1000, now_ns)
        self.queue.observe(queue_ns // 1000, now_ns)
        self.compute_input.observe(compute_input_ns // 1000, now_ns)
        self.compute_infer.observe(compute_infer_ns // 1000, now_ns)
        self.compute_output.observe(compute_output_ns // 1000, now_ns)

    def sample(self, now_ns: int) -> dict[str, SummarySample]:
        """Each summary kept, by its name here (`request`, `queue`, ... `cache_miss`)."""
        found = {}
        for name in self.__slots__:
            summary = getattr(self, name)
            if isinstance(summary, WindowedSummary):
                found[name] = summary.sample(self.quantiles, now_ns)
        return found
