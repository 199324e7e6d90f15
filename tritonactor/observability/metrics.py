"""Prometheus metrics with Triton's names, read at scrape time.

Nothing here runs per request: the data plane keeps its plain counters (see
`scheduling/statistics.py`) and a `MetricsCollector` turns a `MetricsSource`'s samples of them
into metric families when Prometheus asks. Triton's families keep Triton's names, types and
labels (so its dashboards and scrape configs carry over); what only an actor design can show is
under `tritonactor_`. docs/metrics.md lists every family."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client.metrics_core import Metric

from tritonactor.observability.custom import CUSTOM_METRICS
from tritonactor.observability.gpu import GpuMetrics
from tritonactor.observability.host import CpuUsage, read_memory
from tritonactor.observability.summaries import LatencyOptions

if TYPE_CHECKING:
    from tritonactor.cache import CacheSample
    from tritonactor.observability.summaries import SummarySample


@dataclass(frozen=True, slots=True)
class HistogramSample:
    """A histogram as kept: `counts[i]` observations fell in bucket i (`<= bounds[i]`, not
    cumulative), the last count above every bound; `total` is their sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float


@dataclass(frozen=True, slots=True)
class CacheCounts:
    """A version's use of the response cache: hits and misses, with their durations summed in
    microseconds (a hit: its lookup; a miss: its lookup and the insertion of its answer)."""

    hits: int
    hit_us: int
    misses: int
    miss_us: int


@dataclass(frozen=True, slots=True)
class VersionSample:
    """One ready model version's numbers at the time of a scrape (durations in microseconds,
    summed over successful requests, as Triton's counters)."""

    model: str
    version: int
    success: int
    failures: Mapping[str, int]  # by Triton's reason: REJECTED, CANCELED, BACKEND, OTHER
    inference_count: int
    execution_count: int
    pending: int
    request_us: int
    queue_us: int
    compute_input_us: int
    compute_infer_us: int
    compute_output_us: int
    batch_executions: Mapping[int, int]  # executes by batch size
    first_response_ms: HistogramSample
    # Only for a version whose config asks for the response cache (as Triton, whether or not
    # the server has one).
    cache: CacheCounts | None = None
    # With `--metrics-config summary_latencies=true`: the latency summaries, by their names in
    # `LatencySummaries` (request, queue, compute_input, ..., cache_miss).
    summaries: Mapping[str, SummarySample] | None = None


@dataclass(frozen=True, slots=True)
class MailboxSample:
    """How many messages wait in one actor's mailbox; `model` and `version` are "" for an actor
    that serves no one model version."""

    actor: str
    model: str
    version: str
    depth: int


class MetricsSource(Protocol):
    """What a server tells its collector at each scrape."""

    def versions(self) -> Iterable[VersionSample]: ...

    def load_seconds(self) -> Mapping[tuple[str, int], float]:
        """How long each ready version took to load."""
        ...

    def journal_events(self) -> Mapping[str, int]:
        """Control-plane events in the journal, by type."""
        ...

    def mailboxes(self) -> Iterable[MailboxSample]: ...


class MetricsCollector:
    """A prometheus_client collector (`collect`) over one server's `MetricsSource`, with the
    machine's CPU and memory (unless `cpu_metrics` is off: --allow-cpu-metrics=false), and its
    GPUs when NVML sees any (unless `gpu_metrics` is off)."""

    def __init__(
        self,
        source: MetricsSource,
        cpu: CpuUsage | None = None,
        gpu: GpuMetrics | None = None,
        *,
        cpu_metrics: bool = True,
        gpu_metrics: bool = True,
        response_cache: Callable[[], CacheSample] | None = None,
        latency: LatencyOptions | None = None,
    ) -> None:
        self._source = source
        # What `--metrics-config` asks of the latency families (the duration counters' being
        # there; the summaries come with the versions' samples when on).
        self._latency = latency if latency is not None else LatencyOptions()
        # The server's response cache, when it has one: its `sample`.
        self._response_cache = response_cache
        self._cpu = cpu if cpu is not None else CpuUsage()
        # May be set after the collector is registered: NVML is slow to start.
        self.gpu = gpu
        self.cpu_metrics = cpu_metrics
        self.gpu_metrics = gpu_metrics

    def collect(self) -> Iterator[Metric]:
        yield from _version_families(list(self._source.versions()), self._latency.counters)
        yield from self._model_load_family()
        if self._response_cache is not None:
            yield from _cache_families(self._response_cache())
        if self.cpu_metrics:
            yield from self._host_families()
        if self.gpu is not None and self.gpu_metrics:
            yield from self.gpu.collect()
        yield from self._actor_families()
        # What models defined while they run (pb_utils.MetricFamily), under their own names.
        yield from CUSTOM_METRICS.collect()

    def _model_load_family(self) -> Iterator[Metric]:
        family = Metric(
            "nv_model_load_duration_secs", "Time to load a model version, in seconds", "gauge"
        )
        for (model, version), seconds in sorted(self._source.load_seconds().items()):
            family.add_sample(family.name, _labels(model, version), seconds)
        yield family

    def _host_families(self) -> Iterator[Metric]:
        utilization = self._cpu.utilization()
        if utilization is not None:
            yield _single(
                "nv_cpu_utilization",
                "CPU utilization of the machine since the last scrape [0.0 - 1.0]",
                utilization,
            )
        memory = read_memory()
        if memory is not None:
            total, used = memory
            yield _single(
                "nv_cpu_memory_total_bytes", "The machine's memory (RAM), in bytes", total
            )
            yield _single(
                "nv_cpu_memory_used_bytes", "The machine's memory (RAM) in use, in bytes", used
            )

    def _actor_families(self) -> Iterator[Metric]:
        mailboxes = Metric(
            "tritonactor_actor_mailbox_depth",
            "Messages waiting in an actor's mailbox",
            "gauge",
        )
        for box in self._source.mailboxes():
            labels = {"actor": box.actor, "model": box.model, "version": box.version}
            mailboxes.add_sample(mailboxes.name, labels, box.depth)
        yield mailboxes
        events = Metric(
            "tritonactor_journal_events_total",
            "Control-plane events in the journal, by type",
            "counter",
        )
        for kind, count in sorted(self._source.journal_events().items()):
            events.add_sample(events.name, {"type": kind}, count)
        yield events


# Triton's per-version counters: name, help, and how a sample gives the value.
_COUNTERS = (
    ("nv_inference_request_success", "Successful inference requests, all batch sizes", "success"),
    ("nv_inference_count", "Inferences performed (a batch of n counts n)", "inference_count"),
    ("nv_inference_exec_count", "Model executions performed", "execution_count"),
    (
        "nv_inference_request_duration_us",
        "Cumulative time of successful requests, from arrival to answer, in microseconds",
        "request_us",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative time successful requests waited in the scheduler, in microseconds",
        "queue_us",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative time successful requests spent handing their inputs to the backend, "
        "in microseconds",
        "compute_input_us",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative time successful requests spent in the model's execute, in microseconds",
        "compute_infer_us",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative time successful requests spent from the execute's end to their answer, "
        "in microseconds",
        "compute_output_us",
    ),
)


# The duration counters, which `--metrics-config counter_latencies=false` leaves out (with
# the response cache's per-version families), as Triton does.
_DURATION_COUNTERS = frozenset(name for name, _, _ in _COUNTERS if name.endswith("_duration_us"))

# Triton's latency summaries (`--metrics-config summary_latencies=true`): name, help, and the
# summary's name in `LatencySummaries`.
_SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "Summary of successful requests' durations, from arrival to answer, in microseconds",
        "request",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of the time successful requests waited in the scheduler, in microseconds",
        "queue",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Summary of the time successful requests spent handing their inputs to the backend, "
        "in microseconds",
        "compute_input",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Summary of the time successful requests spent in the model's execute, in microseconds",
        "compute_infer",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Summary of the time successful requests spent from the execute's end to their answer, "
        "in microseconds",
        "compute_output",
    ),
    (
        "nv_cache_hit_summary_per_model",
        "Summary of response-cache lookup times of the requests it answered, in microseconds",
        "cache_hit",
    ),
    (
        "nv_cache_miss_summary_per_model",
        "Summary of response-cache lookup and insertion times of the requests it missed, "
        "in microseconds",
        "cache_miss",
    ),
)


def _version_families(samples: list[VersionSample], counters: bool = True) -> Iterator[Metric]:
    for name, documentation, attribute in _COUNTERS:
        if not counters and name in _DURATION_COUNTERS:
            continue
        # Triton's counters have no `_total` suffix: the sample is named as the family.
        family = Metric(name, documentation, "counter")
        for sample in samples:
            family.add_sample(
                name, _labels(sample.model, sample.version), getattr(sample, attribute)
            )
        yield family
        if name == "nv_inference_request_success":
            yield _failure_family(samples)
    if counters:
        yield from _version_cache_families(samples)

    pending = Metric(
        "nv_inference_pending_request_count",
        "Requests routed to a model version and not answered yet",
        "gauge",
    )
    for sample in samples:
        pending.add_sample(pending.name, _labels(sample.model, sample.version), sample.pending)
    yield pending
    yield from _summary_families(samples)

    histogram = Metric(
        "nv_inference_first_response_histogram_ms",
        "Time from a request's arrival to its first response, in milliseconds",
        "histogram",
    )
    for sample in samples:
        _add_histogram(histogram, _labels(sample.model, sample.version), sample.first_response_ms)
    yield histogram

    batches = Metric(
        "tritonactor_inference_batch_executions_total",
        "Model executions by batch size",
        "counter",
    )
    for sample in samples:
        for size, count in sorted(sample.batch_executions.items()):
            labels = {**_labels(sample.model, sample.version), "batch_size": str(size)}
            batches.add_sample(batches.name, labels, count)
    yield batches


# Triton's per-version response-cache counters: name, help, and the CacheCounts field.
_CACHE_COUNTERS = (
    ("nv_cache_num_hits_per_model", "Requests answered from the response cache", "hits"),
    (
        "nv_cache_hit_duration_per_model",
        "Cumulative response-cache lookup time of the requests it answered, in microseconds",
        "hit_us",
    ),
    (
        "nv_cache_num_misses_per_model",
        "Requests the response cache missed, whose answers were then offered to it",
        "misses",
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Cumulative response-cache lookup and insertion time of the requests it missed, "
        "in microseconds",
        "miss_us",
    ),
)


def _summary_families(samples: list[VersionSample]) -> Iterator[Metric]:
    """The latency summaries the versions keep (none unless `summary_latencies=true`)."""
    for name, documentation, key in _SUMMARIES:
        family = Metric(name, documentation, "summary")
        for sample in samples:
            summary = sample.summaries.get(key) if sample.summaries is not None else None
            if summary is None:
                continue
            labels = _labels(sample.model, sample.version)
            family.add_sample(f"{name}_count", labels, summary.count)
            family.add_sample(f"{name}_sum", labels, summary.total)
            for quantile, value in summary.quantiles:
                family.add_sample(name, {**labels, "quantile": _bound(quantile)}, value)
        if family.samples:
            yield family


def _version_cache_families(samples: list[VersionSample]) -> Iterator[Metric]:
    cached = [sample for sample in samples if sample.cache is not None]
    if not cached:
        return  # as Triton: no family unless a version asks for the cache
    for name, documentation, attribute in _CACHE_COUNTERS:
        family = Metric(name, documentation, "counter")
        for sample in cached:
            value = getattr(sample.cache, attribute)
            family.add_sample(name, _labels(sample.model, sample.version), value)
        yield family


def _cache_families(sample: CacheSample) -> Iterator[Metric]:
    """The server's response cache as a whole: Triton's gauges, without labels."""
    yield _single(
        "nv_cache_util", "Response cache bytes in use over its size [0.0 - 1.0]", sample.utilization
    )
    for name, documentation, value in (
        ("nv_cache_num_entries", "Responses held in the response cache", sample.entries),
        ("nv_cache_num_hits", "Response cache lookups that found a response", sample.hits),
        ("nv_cache_num_misses", "Response cache lookups that found nothing", sample.misses),
        ("nv_cache_num_lookups", "Response cache lookups", sample.lookups),
        (
            "nv_cache_num_evictions",
            "Responses the response cache evicted to make room",
            sample.evictions,
        ),
        (
            "nv_cache_lookup_duration",
            "Cumulative response cache lookup time (hits and misses), in microseconds",
            sample.lookup_ns // 1000,
        ),
        (
            "nv_cache_insertion_duration",
            "Cumulative response cache insertion time, in microseconds",
            sample.insertion_ns // 1000,
        ),
    ):
        yield _single(name, documentation, value)


def _failure_family(samples: list[VersionSample]) -> Metric:
    family = Metric(
        "nv_inference_request_failure",
        "Failed inference requests, all batch sizes, by reason",
        "counter",
    )
    for sample in samples:
        for reason, count in sample.failures.items():
            labels = {**_labels(sample.model, sample.version), "reason": reason}
            family.add_sample(family.name, labels, count)
    return family


def _add_histogram(family: Metric, labels: dict[str, str], sample: HistogramSample) -> None:
    cumulative = 0
    for bound, count in zip(sample.bounds, sample.counts, strict=False):
        cumulative += count
        family.add_sample(f"{family.name}_bucket", {**labels, "le": _bound(bound)}, cumulative)
    count = sum(sample.counts)
    family.add_sample(f"{family.name}_bucket", {**labels, "le": "+Inf"}, count)
    family.add_sample(f"{family.name}_count", labels, count)
    family.add_sample(f"{family.name}_sum", labels, sample.total)


def _bound(bound: float) -> str:
    # As Triton writes its bucket bounds: "100", not "100.0".
    return str(int(bound)) if bound.is_integer() else repr(bound)


def _labels(model: str, version: int | str) -> dict[str, str]:
    return {"model": model, "version": str(version)}


def _single(name: str, documentation: str, value: float) -> Metric:
    family = Metric(name, documentation, "gauge")
    family.add_sample(name, {}, value)
    return family
