"""An instance's custom metrics on the server's side: the stub's `pb_utils.MetricFamily` /
`Metric` operations applied to the process's registry (`observability.custom`), and the
definitions the instance holds, released when it goes (a model's metrics go with it)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from tritonactor.observability.custom import CUSTOM_METRICS, CustomMetricError, CustomMetrics

_KINDS = {0: "counter", 1: "gauge", 2: "histogram"}  # pb_utils.MetricFamily.COUNTER...


class InstanceMetrics:
    def __init__(self, registry: CustomMetrics = CUSTOM_METRICS) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._families: Counter[str] = Counter()
        self._metrics: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """Apply one operation (from the instance's reader); the answer for the stub, or None when
        it does not wait for one (a release)."""
        action, name = message["action"], message["name"]
        labels = message.get("labels") or {}
        key = (name, tuple(sorted(labels.items())))
        value: float | None = None
        error: str | None = None
        registry = self._registry
        try:
            if action == "family_add":
                kind = _KINDS.get(message["kind"], "")
                registry.add_family(name, message["description"], kind)
                with self._lock:
                    self._families[name] += 1
            elif action == "family_remove":
                if self._release(self._families, name):
                    registry.remove_family(name)
            elif action == "metric_add":
                registry.add_metric(name, labels, message.get("buckets"))
                with self._lock:
                    self._metrics[key] += 1
            elif action == "increment":
                registry.increment(name, labels, float(message["value"]))
            elif action == "set":
                registry.set(name, labels, float(message["value"]))
            elif action == "observe":
                registry.observe(name, labels, float(message["value"]))
            elif action == "value":
                value = registry.value(name, labels)
            else:
                error = f"unknown metric operation '{action}'"
        except CustomMetricError as exc:
            error = str(exc)
        except Exception as exc:  # (a message the stub's checks let by: answered all the same)
            error = f"{type(exc).__name__}: {exc}"
        if message.get("call") is None:
            return None
        return {"op": "metric_result", "call": message["call"], "error": error, "value": value}

    def _release(self, held: Counter[Any], key: Any) -> bool:
        with self._lock:
            if held[key] <= 0:
                return False
            held[key] -= 1
            return True

    def release_all(self) -> None:
        """The instance is gone: whatever it still defined is released."""
        with self._lock:
            metrics, self._metrics = self._metrics, Counter()
            families, self._families = self._families, Counter()
        # (a model that makes a `Metric` a request defines it once a request: released at once)
        for (name, labels), count in metrics.items():
            self._registry.remove_metric(name, dict(labels), count)
        for name, count in families.items():
            self._registry.remove_family(name, count)
