"""Prometheus metrics end to end: a real server, driven by tritonclient, scraped on its metrics
listener and read back with prometheus_client's parser. The counters move by exactly the
requests made; a request refused by validation never reaches a model and is not counted (as in
Triton)."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import write_config
from tests.onnx_models import reshape_model
from tests.server_process import ServerProcess, free_port, start_server

pytestmark = pytest.mark.e2e

# Y = reshape(X, [-1, 4]): a row that is not 4 wide passes validation (dims [-1]) and fails in
# onnxruntime, at execution: a BACKEND failure.
CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ {batching} }}
"""
# Each request waits for a batch far longer than its queue timeout: the batcher rejects it.
REJECTING = (
    "max_queue_delay_microseconds: 5000000 "
    "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1000 }"
)
# One step, `batched`: the ensemble has no instances, its requests count as they are answered.
PIPELINE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "batched"
  input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } } ] }
"""
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
TRITON_FAMILIES = {
    "nv_inference_request_success": "counter",
    "nv_inference_request_failure": "counter",
    "nv_inference_count": "counter",
    "nv_inference_exec_count": "counter",
    "nv_inference_request_duration_us": "counter",
    "nv_inference_queue_duration_us": "counter",
    "nv_inference_compute_input_duration_us": "counter",
    "nv_inference_compute_infer_duration_us": "counter",
    "nv_inference_compute_output_duration_us": "counter",
    "nv_inference_pending_request_count": "gauge",
    "nv_inference_first_response_histogram_ms": "histogram",
    "nv_model_load_duration_secs": "gauge",
    "nv_cpu_utilization": "gauge",
    "nv_cpu_memory_total_bytes": "gauge",
    "nv_cpu_memory_used_bytes": "gauge",
}


@pytest.fixture(scope="module")
def metrics_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("metrics") / "models"
    for name, batching in (("batched", ""), ("rejecting", REJECTING)):
        reshape_model(repo / name / "1" / "model.onnx")
        write_config(repo / name, CONFIG.format(name=name, batching=batching))
    write_config(repo / "pipeline", PIPELINE)
    (repo / "pipeline" / "1").mkdir()
    process = start_server([repo], tmp_path_factory.mktemp("metrics_server"))
    yield process
    process.stop()


def scrape(url: str) -> dict[str, Any]:
    response = httpx.get(url, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def listener_url(server: ServerProcess) -> str:
    return f"http://127.0.0.1:{server.env['TRITONACTOR_METRICS_PORT']}/metrics"


def value(found: dict[str, Any], family: str, suffix: str = "", **labels: str) -> float:
    """The sample of `family` (`suffix`: "_count", "_sum", "_bucket") with these labels."""
    matches = [
        sample.value
        for sample in found[family].samples
        if sample.name.endswith(suffix) and labels.items() <= sample.labels.items()
    ]
    assert len(matches) == 1, (family, suffix, labels, found[family].samples)
    return matches[0]


def inputs(module: Any, rows: int, width: int, wire: str = "FP32") -> list[Any]:
    tensor = module.InferInput("X", [rows, width], wire)
    dtype = np.float64 if wire == "FP64" else np.float32
    tensor.set_data_from_numpy(np.ones((rows, width), dtype=dtype))
    return [tensor]


def test_the_counters_move_by_exactly_the_requests_made(metrics_server: ServerProcess) -> None:
    url = listener_url(metrics_server)
    before = scrape(url)
    http = httpclient.InferenceServerClient(metrics_server.url)
    with grpcclient.InferenceServerClient(metrics_server.grpc_url) as grpc:
        for _ in range(3):
            http.infer("batched", inputs(httpclient, 1, 4))
        grpc.infer("batched", inputs(grpcclient, 2, 4))
        for client, module in ((http, httpclient), (grpc, grpcclient)):
            with pytest.raises(InferenceServerException):
                client.infer("batched", inputs(module, 1, 3))  # fails in onnxruntime
            with pytest.raises(InferenceServerException, match="Request timeout expired"):
                client.infer("rejecting", inputs(module, 1, 4))
        with pytest.raises(InferenceServerException, match="data-type"):
            http.infer("batched", inputs(httpclient, 1, 4, "FP64"))  # validation: not counted
    http.close()
    after = scrape(url)

    def moved(family: str, suffix: str = "", **labels: str) -> float:
        return value(after, family, suffix, **labels) - value(before, family, suffix, **labels)

    batched = {"model": "batched", "version": "1"}
    rejecting = {"model": "rejecting", "version": "1"}
    assert moved("nv_inference_request_success", **batched) == 4
    assert {r: moved("nv_inference_request_failure", reason=r, **batched) for r in REASONS} == {
        "REJECTED": 0,
        "CANCELED": 0,
        "BACKEND": 2,
        "OTHER": 0,
    }
    assert moved("nv_inference_count", **batched) == 5
    assert moved("nv_inference_exec_count", **batched) == 4
    assert moved("nv_inference_request_success", **rejecting) == 0
    assert moved("nv_inference_request_failure", reason="REJECTED", **rejecting) == 2
    assert moved("nv_inference_exec_count", **rejecting) == 0
    for family in (
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
    ):
        assert moved(family, **batched) > 0, family
    for model in (batched, rejecting):
        assert value(after, "nv_inference_pending_request_count", **model) == 0
    # One first response per successful request, each within the histogram's buckets.
    histogram = "nv_inference_first_response_histogram_ms"
    assert moved(histogram, "_count", **batched) == 4
    assert moved(histogram, "_bucket", le="+Inf", **batched) == 4
    assert moved(histogram, "_sum", **batched) > 0
    buckets = [s for s in after[histogram].samples if s.name.endswith("_bucket")]
    assert [s.labels["le"] for s in buckets if s.labels["model"] == "batched"] == [
        "100",
        "500",
        "2000",
        "5000",
        "+Inf",
    ]
    # Sent one at a time, each request is its own batch.
    sizes, sizes_before = _batch_sizes(after, batched), _batch_sizes(before, batched)
    assert {size: count - sizes_before.get(size, 0) for size, count in sizes.items()} == {
        "1": 3,
        "2": 1,
    }


def _batch_sizes(found: dict[str, Any], labels: dict[str, str]) -> dict[str, float]:
    return {
        sample.labels["batch_size"]: sample.value
        for sample in found["tritonactor_inference_batch_executions"].samples
        if labels.items() <= sample.labels.items()
    }


def test_tritons_families_with_tritons_types_and_labels(metrics_server: ServerProcess) -> None:
    found = scrape(listener_url(metrics_server))
    for family, kind in TRITON_FAMILIES.items():
        assert found[family].type == kind, family
    for model in ("batched", "rejecting"):
        labels = {"model": model, "version": "1"}
        assert value(found, "nv_inference_count", **labels) >= 0
        reasons = {
            s.labels["reason"]
            for s in found["nv_inference_request_failure"].samples
            if s.labels["model"] == model
        }
        assert reasons == set(REASONS)
        assert value(found, "nv_model_load_duration_secs", **labels) > 0
        assert value(found, "tritonactor_actor_mailbox_depth", actor="scheduler", **labels) == 0
    assert 0.0 <= value(found, "nv_cpu_utilization") <= 1.0
    assert value(found, "nv_cpu_memory_total_bytes") > value(found, "nv_cpu_memory_used_bytes") > 0
    assert value(found, "tritonactor_journal_events", type="ModelLoaded") >= 2
    assert value(found, "tritonactor_journal_events", type="ServerStarted") >= 1


def test_the_http_port_answers_the_same_families(metrics_server: ServerProcess) -> None:
    on_http = httpx.get(f"{metrics_server.base}/metrics", timeout=30)
    if on_http.status_code == 404:
        pytest.skip("frontends/http/app.py does not mount metrics_route yet")
    listener = scrape(listener_url(metrics_server))
    found = {f.name: f for f in text_string_to_metric_families(on_http.text)}
    assert set(found) == set(listener)


def test_the_listener_answers_only_get_metrics(metrics_server: ServerProcess) -> None:
    base = listener_url(metrics_server).removesuffix("/metrics")
    assert httpx.get(f"{base}/v2/health/live").status_code == 404
    assert httpx.post(f"{base}/metrics").status_code == 405


def _empty_repository(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    repo.mkdir()
    return repo


def test_port_zero_listens_where_the_os_chose(tmp_path: Path) -> None:
    server = start_server(
        [_empty_repository(tmp_path)], tmp_path, {"TRITONACTOR_METRICS_PORT": "0"}
    )
    try:
        deadline = time.monotonic() + 10
        while not (found := re.search(r"Started Metrics Service at \S+:(\d+)", server.log())):
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        port = int(found.group(1))
        assert port != 0
        assert "nv_cpu_utilization" in scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.stop()


def test_metrics_disabled_means_no_listener(tmp_path: Path) -> None:
    port = free_port()
    env = {"TRITONACTOR_ALLOW_METRICS": "false", "TRITONACTOR_METRICS_PORT": str(port)}
    server = start_server([_empty_repository(tmp_path)], tmp_path, env)
    try:
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        assert httpx.get(f"{server.base}/metrics").status_code == 404
        assert "metrics listening" not in server.log()
    finally:
        server.stop()


def test_an_ensemble_counts_its_own_requests(metrics_server: ServerProcess) -> None:
    url = listener_url(metrics_server)
    labels = {"model": "pipeline", "version": "1"}
    before = scrape(url)
    http = httpclient.InferenceServerClient(metrics_server.url)
    for rows in (1, 2):
        tensor = httpclient.InferInput("IN", [rows, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((rows, 4), dtype=np.float32))
        http.infer("pipeline", [tensor])
    tensor = httpclient.InferInput("IN", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException):
        http.infer("pipeline", [tensor])  # its step fails in onnxruntime
    after = scrape(url)

    def moved(family: str, suffix: str = "", **extra: str) -> float:
        return value(after, family, suffix, **labels, **extra) - value(
            before, family, suffix, **labels, **extra
        )

    assert moved("nv_inference_request_success") == 2
    assert moved("nv_inference_exec_count") == 2
    assert moved("nv_inference_count") == 3  # batch sizes 1 + 2
    assert moved("nv_inference_request_duration_us") > 0
    assert moved("nv_inference_first_response_histogram_ms", "_count") == 2
    # As Triton's: the ensemble's compute times are its successful steps' (the failed one
    # adds nothing), each counter rounded down to a microsecond on its own
    for family in (
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
    ):
        step = value(after, family, model="batched") - value(before, family, model="batched")
        assert abs(moved(family) - step) <= 1, family
    assert moved("nv_inference_compute_infer_duration_us") > 0
    assert moved("nv_inference_request_failure", reason="OTHER") == 1
