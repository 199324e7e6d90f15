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
    assert messages[0].startswith("Failed to increment metric value: ")
    assert messages[1].startswith("Failed to set metric value: ")
    assert messages[2].startswith("Failed to observe metric value: ")
    assert messages[3].startswith("Failed to get metric value: ")
    assert messages[4] == "Failed to create metric. Missing required buckets."
    assert messages[5].startswith("Error when creating Metric: ")
    assert messages[6] == "Failed to create metric. Unexpected buckets found."
    assert messages[7].startswith("Error when creating MetricFamily: ")
    # Nothing refused changed a value.
    assert f"test_model_requests{{{LABELS}}} 5" in scrape(server)


def test_metric_of_a_deleted_family_is_refused(server: ServerProcess) -> None:
    message = ask(server, "lifetime")
    assert "the corresponding 'MetricFamily' has been deleted" in message
