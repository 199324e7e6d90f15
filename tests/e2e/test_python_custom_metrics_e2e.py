"""Custom metrics (`pb_utils.MetricFamily` / `Metric`) through a real server: a python model
defines a counter, a gauge and a histogram, tritonclient drives it, and /metrics serves them
under the model's names and labels."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
LABELS = 'source="custom_metrics_model"'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("custom_metrics_repo")
    shutil.copytree(MODELS / "custom_metrics_model", repo / "custom_metrics_model")
    process = start_server([repo], tmp_path_factory.mktemp("custom_metrics_server"))
    yield process
    process.stop()


def ask(server: ServerProcess, action: str, value: float = 0.0) -> Any:
    client = httpclient.InferenceServerClient(server.url)
    inputs = [
        httpclient.InferInput("ACTION", [1], "BYTES"),
        httpclient.InferInput("VALUE", [1], "FP32"),
    ]
    inputs[0].set_data_from_numpy(np.array([action.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([value], dtype=np.float32))
    result = client.infer("custom_metrics_model", inputs)
    return json.loads(result.as_numpy("REPORT")[0])


def scrape(server: ServerProcess) -> str:
    port = server.env["TRITONACTOR_METRICS_PORT"]
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text


def test_model_defined_metrics_are_served(server: ServerProcess) -> None:
    before = scrape(server)
    assert "# HELP test_model_requests requests counted" in before
    assert "# TYPE test_model_requests counter" in before
    assert f"test_model_requests{{{LABELS}}} 0" in before
    assert ask(server, "count", 2.0) == 2.0
    assert ask(server, "count", 3.0) == 5.0
    assert ask(server, "gauge", -1.5) == -1.5
    for value in (0.05, 1.5, 6.0):
        assert ask(server, "observe", value) is None
    served = scrape(server)
    assert f"test_model_requests{{{LABELS}}} 5" in served
    assert f"test_model_level{{{LABELS}}} -1.5" in served
    assert "# TYPE test_model_sizes histogram" in served
    [sizes] = [f for f in text_string_to_metric_families(served) if f.name == "test_model_sizes"]
    samples = {(s.name, s.labels.get("le")): s.value for s in sizes.samples}
    assert all(s.labels["source"] == "custom_metrics_model" for s in sizes.samples)
    buckets = {le: count for (name, le), count in samples.items() if name.endswith("_bucket")}
    assert buckets == {"0.1": 1, "1": 1, "2.5": 2, "+Inf": 3}
    assert samples[("test_model_sizes_count", None)] == 3
    assert samples[("test_model_sizes_sum", None)] == pytest.approx(7.55)


def test_operations_a_kind_does_not_allow_are_refused_in_the_model(
    server: ServerProcess,
) -> None:
    messages = ask(server, "refusals")
    assert all(message is not None for message in messages), messages
    # Triton's words after its prefixes (its "Failed to process the request for model ..."
    # between them left out: docs/python-backend.md)
    assert messages[0] == (
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be "
        "incremented monotonically by non-negative values."
    )
    assert messages[1] == (
        "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set"
    )
    assert messages[2] == (
        "Failed to observe metric value: TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"
    )
    assert messages[3] == (
        "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"
    )
    assert messages[4] == "Failed to create metric. Missing required buckets."
    assert messages[5] == "Error when creating Metric: Bucket Boundaries must be strictly sorted"
    assert messages[6] == "Failed to create metric. Unexpected buckets found."
    assert messages[7] == (
        "Error when creating MetricFamily: Family name already exists with different type"
    )
    # Nothing refused changed a value.
    assert f"test_model_requests{{{LABELS}}} 5" in scrape(server)


def test_metric_of_a_deleted_family_is_refused(server: ServerProcess) -> None:
    message = ask(server, "lifetime")
    assert message.startswith("Failed to set metric value: Invalid metric operation as the ")
    assert "the corresponding 'MetricFamily' has been deleted" in message


def test_a_value_that_is_not_a_number_raises_in_the_model(server: ServerProcess) -> None:
    """A TypeError, as Triton's bindings raise it (it hung the model, and its unload)."""
    refused, level = ask(server, "not_a_number")
    assert refused.startswith("TypeError: increment(): incompatible")
    assert level == 2.5  # (set from a numpy array of one element, as Triton takes it)
    assert ask(server, "count", 0.0) is not None  # the model answers on


def test_a_metric_lasts_as_long_as_its_family(server: ServerProcess) -> None:
    """A `Metric` object dropped and made again is the same metric, as in Triton."""
    assert ask(server, "redefined") == 3.0
    assert 'test_model_requests{route="a"} 3' in scrape(server)


def test_odd_names_and_labels_are_served(server: ServerProcess) -> None:
    """A family named `..._created` keeps its samples; a lone surrogate in a label does not
    fail the scrape (every family's) but is written as `?`."""
    assert ask(server, "odd_names", 7.0) == 7.0
    text = scrape(server)
    assert 'test_model_jobs_created{source="custom_metrics_model"} 7' in text
    assert 'test_model_level{odd="x?"} 1' in text
    assert "nv_inference_request_success" in text
