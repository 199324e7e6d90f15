"""The custom-metrics registry (what `pb_utils.MetricFamily` defines): definitions counted by
name and labels, what each kind allows, and the Prometheus text it is served as."""

from __future__ import annotations

import pytest

from tritonactor.backends.python.metrics import InstanceMetrics
from tritonactor.observability.custom import CustomMetricError, CustomMetrics
from tritonactor.observability.exposition import render


class Collected:
    def __init__(self, metrics: CustomMetrics) -> None:
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        return self.metrics.collect()


def text(metrics: CustomMetrics) -> str:
    return render(Collected(metrics)).decode()  # type: ignore[arg-type]


def test_counter_gauge_and_histogram_are_served_as_triton_does() -> None:
    metrics = CustomMetrics()
    metrics.add_family("requests", "requests counted", "counter")
    metrics.add_metric("requests", {"b": "2", "a": "1"})
    metrics.increment("requests", {"a": "1", "b": "2"}, 3)
    metrics.add_family("level", "a level", "gauge")
    metrics.add_metric("level", {})
    metrics.set("level", {}, -2.5)
    metrics.add_family("sizes", "sizes seen", "histogram")
    metrics.add_metric("sizes", {"k": "v"}, [0.1, 1.0, 2.5])
    for value in (0.05, 1.5, 6.0):
        metrics.observe("sizes", {"k": "v"}, value)
    served = text(metrics)
    assert "# HELP requests requests counted\n# TYPE requests counter\n" in served
    assert 'requests{a="1",b="2"} 3\n' in served
    assert "level -2.5\n" in served
    assert "# TYPE sizes histogram\n" in served
    for bound, count in (("0.1", 1), ("1", 1), ("2.5", 2), ("+Inf", 3)):
        assert f'sizes_bucket{{k="v",le="{bound}"}} {count}\n' in served
    assert 'sizes_count{k="v"} 3\n' in served and 'sizes_sum{k="v"} 7.55\n' in served


def test_each_kind_refuses_what_it_does_not_do() -> None:
    metrics = CustomMetrics()
    metrics.add_family("c", "", "counter")
    metrics.add_metric("c", {})
    metrics.add_family("h", "", "histogram")
    metrics.add_metric("h", {}, [])
    for refused in (
        lambda: metrics.increment("c", {}, -1),
        lambda: metrics.set("c", {}, 1),
        lambda: metrics.observe("c", {}, 1),
        lambda: metrics.value("h", {}),
        lambda: metrics.increment("h", {}, 1),
        lambda: metrics.add_metric("h", {"x": "1"}, [2.0, 1.0]),
        lambda: metrics.add_metric("h", {"x": "2"}, [1.0, 1.0]),
        lambda: metrics.add_family("c", "", "gauge"),
        lambda: metrics.add_family("not a name", "", "gauge"),
        # The server's own families: served twice, Prometheus would refuse the whole scrape.
        lambda: metrics.add_family("nv_inference_count", "", "counter"),
        lambda: metrics.add_family("tritonactor_actor_mailbox_depth", "", "gauge"),
        lambda: metrics.add_metric("nope", {}),
    ):
        with pytest.raises(CustomMetricError):
            refused()
    assert metrics.value("c", {}) == 0.0  # nothing refused changed anything


def test_definitions_are_counted_and_the_first_description_stays() -> None:
    metrics = CustomMetrics()
    metrics.add_family("dup", "first", "counter")
    metrics.add_family("dup", "second", "counter")
    metrics.add_metric("dup", {"l": "1"})
    metrics.add_metric("dup", {"l": "1"})
    metrics.increment("dup", {"l": "1"}, 7.5)
    metrics.remove_metric("dup", {"l": "1"})
    assert metrics.value("dup", {"l": "1"}) == 7.5  # the other definition holds it
    metrics.remove_family("dup")
    assert "# HELP dup first\n" in text(metrics)
    metrics.remove_family("dup")
    assert "dup" not in text(metrics)


def test_an_instance_releases_what_it_defined_when_it_goes() -> None:
    metrics = CustomMetrics()
    instance = InstanceMetrics(metrics)

    def ask(**message: object) -> dict[str, object] | None:
        return instance.handle({"call": 1, "labels": {}, **message})

    assert ask(action="family_add", name="g", description="", kind=1)["error"] is None  # type: ignore[index]
    assert ask(action="metric_add", name="g")["error"] is None  # type: ignore[index]
    assert ask(action="set", name="g", value=4.0)["error"] is None  # type: ignore[index]
    assert ask(action="value", name="g")["value"] == 4.0  # type: ignore[index]
    refused = ask(action="observe", name="g", value=1.0)
    assert refused is not None
    assert refused["error"] == "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"
    # A release is not answered; one the instance never made changes nothing.
    assert instance.handle({"call": None, "action": "family_remove", "name": "other"}) is None
    instance.release_all()
    assert "g" not in text(metrics)
