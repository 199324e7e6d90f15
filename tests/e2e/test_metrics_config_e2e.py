"""`--metrics-config` end to end, as Triton's: `summary_latencies=true` adds the latency
summaries, `summary_quantiles` chooses their quantiles, `counter_latencies=false` leaves the
duration counters out. Real servers (`tritonactor serve` with its front ends and engine, and a
plain hypercorn with the setting in its variable), real tritonclient requests, the text scraped
and read back with prometheus_client's parser."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import write_config
from tests.e2e.test_metrics_e2e import CONFIG, inputs, listener_url, scrape, value
from tests.onnx_models import reshape_model
from tests.server_process import start_serve, start_server

pytestmark = pytest.mark.e2e

SUMMARIES = (
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)
DURATION_COUNTERS = (
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def repository(root: Path, cached: bool = False) -> Path:
    repo = root / "models"
    for name in ("batched", "idle"):
        reshape_model(repo / name / "1" / "model.onnx")
        write_config(repo / name, CONFIG.format(name=name, batching=""))
    if cached:
        reshape_model(repo / "cached" / "1" / "model.onnx")
        config = CONFIG.format(name="cached", batching="") + "response_cache { enable: true }\n"
        write_config(repo / "cached", config)
    return repo


def quantiles(found: dict, family: str, model: str) -> dict[str, float]:
    return {
        sample.labels["quantile"]: sample.value
        for sample in found[family].samples
        if sample.name == family and sample.labels["model"] == model
    }


def test_serve_keeps_summaries_of_the_quantiles_asked_and_drops_the_counters(
    tmp_path: Path,
) -> None:
    server = start_serve(
        tmp_path,
        {"TRITONACTOR_MODEL_REPOSITORY": str(repository(tmp_path))},
        "--metrics-config",
        "summary_latencies=true",
        "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001,nonsense",
        "--metrics-config",
        "counter_latencies=false",
    )
    try:
        http = httpclient.InferenceServerClient(server.url)
        with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
            for _ in range(4):
                http.infer("batched", inputs(httpclient, 1, 4))
            for _ in range(2):
                grpc.infer("batched", inputs(grpcclient, 1, 4))
            with pytest.raises(InferenceServerException):
                http.infer("batched", inputs(httpclient, 1, 3))  # fails in onnxruntime
        http.close()
        found = scrape(listener_url(server))
    finally:
        server.stop()
    log = server.log()
    assert "Invalid option: [nonsense]. No ':' delimiter found." in log
    for family in SUMMARIES:
        assert found[family].type == "summary"
        # the six that succeeded, not the one that failed
        assert value(found, family, "_count", model="batched") == 6
        observed = quantiles(found, family, "batched")
        assert set(observed) == {"0.5", "0.99"}
        total = value(found, family, "_sum", model="batched")
        # each a duration observed: the median no more than the 99th, which is the largest of
        # six and so no more than their sum
        assert 0 <= observed["0.5"] <= observed["0.99"] <= total
        # a version with no request yet: an empty window
        assert value(found, family, "_count", model="idle") == 0
        assert all(math.isnan(v) for v in quantiles(found, family, "idle").values())
    # the request took at least its execute
    request = quantiles(found, "nv_inference_request_summary_us", "batched")
    infer = quantiles(found, "nv_inference_compute_infer_summary_us", "batched")
    assert request["0.99"] >= infer["0.5"]
    for family in DURATION_COUNTERS:
        assert family not in found
    assert value(found, "nv_inference_request_success", model="batched") == 6
    assert value(found, "nv_inference_request_failure", model="batched", reason="BACKEND") == 1


def test_hypercorn_reads_the_setting_from_its_variable_and_the_cache_keeps_triton_s_split(
    tmp_path: Path,
) -> None:
    env = {
        "TRITONACTOR_METRICS_CONFIG": json.dumps(["summary_latencies=true"]),
        "TRITONACTOR_CACHE_CONFIG": "local,size=1048576",
    }
    server = start_server([repository(tmp_path, cached=True)], tmp_path, env)
    try:
        http = httpclient.InferenceServerClient(server.url)
        for model in ("batched", "cached", "cached"):  # the second "cached" is a hit
            http.infer(model, inputs(httpclient, 1, 4))
        http.close()
        found = scrape(listener_url(server))
    finally:
        server.stop()
    # the counters stay (no counter_latencies=false); the summaries come beside them
    for family in DURATION_COUNTERS:
        assert value(found, family, model="batched") >= 0
    for family in SUMMARIES:
        assert value(found, family, "_count", model="batched") == 1
        assert set(quantiles(found, family, "batched")) == {"0.5", "0.9", "0.95", "0.99", "0.999"}
    # a version using the response cache: as Triton 2.51, no request summary; its queue
    # summary counts the hit and the miss, its compute the miss alone
    request_models = {s.labels["model"] for s in found["nv_inference_request_summary_us"].samples}
    assert "cached" not in request_models
    assert value(found, "nv_inference_queue_summary_us", "_count", model="cached") == 2
    assert value(found, "nv_inference_compute_infer_summary_us", "_count", model="cached") == 1
    assert value(found, "nv_cache_hit_summary_per_model", "_count", model="cached") == 1
    assert value(found, "nv_cache_miss_summary_per_model", "_count", model="cached") == 1
    assert "batched" not in {
        s.labels["model"] for s in found["nv_cache_hit_summary_per_model"].samples
    }


def test_a_metrics_config_entry_without_a_value_stops_the_start(tmp_path: Path) -> None:
    refused = re.escape("has 'summary_latencies': expected '<setting>=<value>' (set by --metrics")
    with pytest.raises(RuntimeError, match=f"(?s)server exited with 2:.*{refused}"):
        start_serve(
            tmp_path,
            {"TRITONACTOR_MODEL_REPOSITORY": str(repository(tmp_path))},
            "--metrics-config",
            "summary_latencies",
            timeout=30,
        )
