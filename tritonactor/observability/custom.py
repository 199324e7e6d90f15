"""Custom metrics: families that models define while they run (the python backend's
`pb_utils.MetricFamily` / `Metric`), served on /metrics beside Triton's own, under the names and
labels the model gives them.

One registry per process (`CUSTOM_METRICS`), as Triton's is one per server: the python backend
updates it from its instances' readers (every operation takes its lock), the metrics
collector reads it at scrape time. A family or metric defined twice is the same one, counted:
it goes when the last of its definitions is released."""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

KINDS = ("counter", "gauge", "histogram")
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

LabelKey = tuple[tuple[str, str], ...]


class CustomMetricError(ValueError):
    """An operation the metric (or its family) does not allow; the message says why."""


# The server's own metric families (Triton's and ours) start so.
RESERVED_PREFIXES = ("nv_", "tritonactor_")


@dataclass(slots=True)
class _Metric:
    labels: dict[str, str]
    bounds: tuple[float, ...] = ()  # histogram bucket bounds (upper, inclusive)
    value: float = 0.0  # counter, gauge; a histogram's sum
    counts: list[int] = field(default_factory=list)  # histogram: per bucket, then above all
    references: int = 1


@dataclass(slots=True)
class _Family:
    name: str
    description: str
    kind: str
    metrics: dict[LabelKey, _Metric] = field(default_factory=dict)
    references: int = 1


class CustomMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}

    # -- definitions ------------------------------------------------------------------------

    def add_family(self, name: str, description: str, kind: str) -> None:
        """Define a family, or count one more definition of it (the first description stays);
        the same name with another kind is refused."""
        if kind not in KINDS:
            raise CustomMetricError(f"unknown metric kind '{kind}'")
        if not _NAME.match(name):
            raise CustomMetricError("Invalid metric name")  # (Triton's words, those below too)
        if name.startswith(RESERVED_PREFIXES):
            # Served twice under one name, a family would make Prometheus refuse the scrape.
            raise CustomMetricError(
                f"metric family name '{name}' is the server's: names starting with "
                f"{' or '.join(repr(p) for p in RESERVED_PREFIXES)} are reserved"
            )
        with self._lock:
            family = self._families.get(name)
            if family is None:
                self._families[name] = _Family(name, description, kind)
            elif family.kind != kind:
                raise CustomMetricError("Family name already exists with different type")
            else:
                family.references += 1

    def remove_family(self, name: str, count: int = 1) -> None:
        """Release `count` definitions of the family; it goes with the last."""
        with self._lock:
            family = self._families.get(name)
            if family is not None:
                family.references -= count
                if family.references <= 0:
                    del self._families[name]

    def add_metric(
        self, name: str, labels: Mapping[str, str], buckets: Sequence[float] | None = None
    ) -> None:
        """Define a metric of family `name` (a histogram needs ascending, distinct bucket
        bounds), or count one more definition of it."""
        for label in labels:
            if not _LABEL.match(label):
                raise CustomMetricError("Invalid label name")
        key = _key(labels)
        with self._lock:
            family = self._family(name)
            metric = family.metrics.get(key)
            if metric is not None:
                metric.references += 1
                return
            bounds: tuple[float, ...] = ()
            if family.kind == "histogram":
                bounds = tuple(float(b) for b in buckets or ())
                if any(b >= c for b, c in itertools.pairwise(bounds)):
                    raise CustomMetricError("Bucket Boundaries must be strictly sorted")
            family.metrics[key] = _Metric(
                {str(k): str(v) for k, v in labels.items()}, bounds, counts=[0] * (len(bounds) + 1)
            )

    def remove_metric(self, name: str, labels: Mapping[str, str], count: int = 1) -> None:
        """Release `count` definitions of the metric; it goes with the last."""
        with self._lock:
            family = self._families.get(name)
            metric = None if family is None else family.metrics.get(_key(labels))
            if family is not None and metric is not None:
                metric.references -= count
                if metric.references <= 0:
                    del family.metrics[_key(labels)]

    # -- values -----------------------------------------------------------------------------

    def increment(self, name: str, labels: Mapping[str, str], amount: float) -> None:
        with self._lock:
            family, metric = self._metric(name, labels)
            if family.kind == "histogram":
                raise CustomMetricError(_unsupported(family, "Increment"))
            if family.kind == "counter" and amount < 0:
                raise CustomMetricError(
                    "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                    "non-negative values."
                )
            metric.value += amount

    def set(self, name: str, labels: Mapping[str, str], value: float) -> None:
        with self._lock:
            family, metric = self._metric(name, labels)
            if family.kind != "gauge":
                raise CustomMetricError(_unsupported(family, "Set"))
            metric.value = value

    def observe(self, name: str, labels: Mapping[str, str], value: float) -> None:
        with self._lock:
            family, metric = self._metric(name, labels)
            if family.kind != "histogram":
                raise CustomMetricError(_unsupported(family, "Observe"))
            metric.counts[bisect.bisect_left(metric.bounds, value)] += 1
            metric.value += value

    def value(self, name: str, labels: Mapping[str, str]) -> float:
        with self._lock:
            family, metric = self._metric(name, labels)
            if family.kind == "histogram":
                raise CustomMetricError(_unsupported(family, "Value"))
            return metric.value

    def _family(self, name: str) -> _Family:
        family = self._families.get(name)
        if family is None:
            raise CustomMetricError(f"there is no metric family named '{name}'")
        return family

    def _metric(self, name: str, labels: Mapping[str, str]) -> tuple[_Family, _Metric]:
        family = self._family(name)
        metric = family.metrics.get(_key(labels))
        if metric is None:
            raise CustomMetricError(f"metric family '{name}' has no metric labelled {labels}")
        return family, metric

    # -- scraping ---------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = [
                (f.name, f.description, f.kind, [_copy(m) for m in f.metrics.values()])
                for f in sorted(self._families.values(), key=lambda f: f.name)
            ]
        for name, description, kind, metrics in families:
            if not metrics:
                continue  # a family with no metric is not written, as Triton writes it
            family = Metric(name, description, kind)
            for metric in metrics:
                if kind != "histogram":
                    family.add_sample(name, metric.labels, metric.value)
                    continue
                cumulative = 0
                for bound, count in zip((*metric.bounds, math.inf), metric.counts, strict=True):
                    cumulative += count
                    family.add_sample(
                        f"{name}_bucket", {**metric.labels, "le": _bound(bound)}, cumulative
                    )
                family.add_sample(f"{name}_count", metric.labels, cumulative)
                family.add_sample(f"{name}_sum", metric.labels, metric.value)
            yield family


def _unsupported(family: _Family, operation: str) -> str:
    return f"TRITONSERVER_METRIC_KIND_{family.kind.upper()} does not support {operation}"


def _key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


def _copy(metric: _Metric) -> _Metric:
    return _Metric(dict(metric.labels), metric.bounds, metric.value, list(metric.counts))


def _bound(bound: float) -> str:
    """A bucket bound as Triton writes it: 1, 2.5, +Inf."""
    if math.isinf(bound):
        return "+Inf"
    return format(bound, ".16g")  # (C++'s default float format at 16 digits: 0.3, 1e+16)


# The process's registry: what models define, and what /metrics serves.
CUSTOM_METRICS = CustomMetrics()
