"""`pb_utils.MetricFamily` / `Metric`: custom metrics a model defines, served on the server's
/metrics (see `observability.custom`). Every operation asks the server, which answers from its
registry, so that a refused one raises where the model made it, as in Triton."""

from __future__ import annotations

import enum
import weakref
from typing import Any

from tritonactor.backends.python import _pb_runtime as runtime
from tritonactor.backends.python._pb_tensors import TritonModelException


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_FAMILY_GONE = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
    "been deleted."
)


class MetricFamily:
    """MetricFamily(name, description, kind=MetricFamily.COUNTER | GAUGE | HISTOGRAM). A family
    defined again under the same name is the same family (the first description stays); with
    another kind it is refused."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily name and description must be str")
        if not isinstance(kind, MetricKind):
            raise TypeError(f"MetricFamily kind must be a MetricFamily kind, not {kind!r}")
        self._name = name
        self._kind = kind
        self._defined = False
        _call(
            "Error when creating MetricFamily",
            "family_add",
            name,
            description=description,
            kind=int(kind),
        )
        self._defined = True

    def Metric(  # Triton's name
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        """A metric of this family with these labels (the same labels: the same metric). A
        histogram needs `buckets`, ascending bucket bounds; the others take none."""
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind != MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        elif self._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        return Metric(self, dict(labels or {}), buckets)

    def __del__(self) -> None:
        if getattr(self, "_defined", False) and runtime.stub is not None:
            runtime.stub.metric("family_remove", self._name, wait=False)


class Metric:
    """One metric of a family: increment(value), set(value) (gauges), observe(value)
    (histograms), value() (counters and gauges). It lasts as long as its family, as in Triton:
    a `Metric` object dropped and made again with the same labels is the same metric, its
    value kept."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: Any) -> None:
        self._family = weakref.ref(family)
        self._name = family._name
        self._labels = {str(k): str(v) for k, v in labels.items()}
        arguments: dict[str, Any] = {"labels": self._labels}
        if buckets is not None:
            arguments["buckets"] = [float(b) for b in buckets]
        _call("Error when creating Metric", "metric_add", self._name, **arguments)

    def increment(self, value: float) -> None:
        self._operate("Failed to increment metric value", "increment", value)

    def set(self, value: float) -> None:
        self._operate("Failed to set metric value", "set", value)

    def observe(self, value: float) -> None:
        self._operate("Failed to observe metric value", "observe", value)

    def value(self) -> float:
        return float(self._operate("Failed to get metric value", "value"))

    def _operate(self, failure: str, action: str, *value: float) -> Any:
        arguments = {}
        if value:
            # What Triton's bindings take as a float: anything `float()` reads but text (numpy
            # arrays of one element, Decimal, torch scalars); the rest is a TypeError there
            # too (a None sent on hung the model).
            number = value[0]
            if getattr(number, "size", None) == 1 and hasattr(number, "item"):
                number = number.item()  # a numpy array of one element (numpy 2 refuses float())
            try:
                if number is None or isinstance(number, str | bytes):
                    raise TypeError
                arguments["value"] = float(number)
            except (TypeError, ValueError):
                raise TypeError(
                    f"{action}(): incompatible function arguments: value must be a number, "
                    f"not {type(number).__name__}"
                ) from None
        if self._family() is None:
            raise TritonModelException(f"{failure}: {_FAMILY_GONE}")
        return _call(failure, action, self._name, labels=self._labels, **arguments)


def _call(failure: str, action: str, name: str, **arguments: Any) -> Any:
    stub = runtime.require("pb_utils.MetricFamily")
    try:
        return stub.metric(action, name, **arguments)
    except TritonModelException as exc:
        raise TritonModelException(f"{failure}: {exc}") from None
