"""The response cache end to end: a real server started with `TRITONACTOR_CACHE_CONFIG`
(`--cache-config local,size=N`), the real tritonclient over HTTP and gRPC, the statistics
extension and /metrics read back. What is compared with Triton 2.51 (hits counted as successes
without compute, an ensemble cached at its top level, the configs refused, the `nv_cache_*`
families) is in docs/response-cache.md."""

from __future__ import annotations

import queue
import shutil
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
from tests.onnx_models import add_sub_model, string_identity_model
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

CACHE_SIZE = 1_048_576

ADD_SUB = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {batch}
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
]
"""
CACHED = "response_cache { enable: true }\n"

STRINGS = """
name: "cached_strings"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
response_cache { enable: true }
"""

ENSEMBLE = """
name: "cached_ensemble"
platform: "ensemble"
max_batch_size: 0
input [
  { name: "X" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "step" model_version: -1
    input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "Y" } ]
    output_map { key: "OUTPUT0" value: "SUM" } }
] }
response_cache { enable: true }
"""

# An ensemble over a decoupled python model is decoupled (Triton's rule): no cache for it.
DECOUPLED_STEP = """
name: "refused_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" model_version: -1
    input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } }
] }
response_cache { enable: true }
"""

# Answers INPUT0 with a response parameter of INPUT0[0] bytes (review finding 1: parameters
# are charged like outputs).
PARAMETERS = """
name: "parameters"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
response_cache { enable: true }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
PARAMETERS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            answers.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", data.copy())],
                    parameters={"blob": "x" * int(data[0])},
                )
            )
        return answers
"""

PYTHON_MODELS = Path(__file__).resolve().parent.parent / "python_models"

LOADED = (
    "cached",
    "plain",
    "cached_strings",
    "step",
    "cached_ensemble",
    "reloaded",
    "parameters",
)


def build(root: Path) -> Path:
    repo = root / "models"
    for name, batch, cached in (
        ("cached", 8, True),
        ("plain", 8, False),
        ("reloaded", 8, True),
        ("step", 0, False),
        ("refused_decoupled", 0, True),
        ("refused_sequence", 8, True),
    ):
        add_sub_model(repo / name / "1" / "model.onnx", "FP32", (4,), batch=batch > 0)
        write_config(repo / name, ADD_SUB.format(name=name, batch=batch) + (CACHED * cached))
    with (repo / "refused_decoupled" / "config.pbtxt").open("a") as config:
        config.write("model_transaction_policy { decoupled: true }\n")
    with (repo / "refused_sequence" / "config.pbtxt").open("a") as config:
        config.write("sequence_batching { }\n")
    string_identity_model(repo / "cached_strings" / "1" / "model.onnx", ("n",))
    write_config(repo / "cached_strings", STRINGS)
    write_config(repo / "cached_ensemble", ENSEMBLE)
    (repo / "cached_ensemble" / "1").mkdir()
    shutil.copytree(PYTHON_MODELS / "repeat", repo / "repeat")
    write_config(repo / "refused_ensemble", DECOUPLED_STEP)
    (repo / "refused_ensemble" / "1").mkdir()
    write_config(repo / "parameters", PARAMETERS)
    (repo / "parameters" / "1").mkdir()
    (repo / "parameters" / "1" / "model.py").write_text(PARAMETERS_MODEL)
    return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("cache"))


ENV = {
    "TRITONACTOR_CACHE_CONFIG": f"local,size={CACHE_SIZE}",
    "TRITONACTOR_MODEL_CONTROL_MODE": "explicit",
    "TRITONACTOR_LOAD_MODEL": ",".join(LOADED),
}


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = start_server([repo], tmp_path_factory.mktemp("cache_server"), ENV)
    yield process
    process.stop()


@pytest.fixture
def http_client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


@pytest.fixture
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        yield client


def add_sub_inputs(module: Any, a: list[float], b: list[float], batch: bool = True) -> list[Any]:
    inputs = []
    for name, values in (("INPUT0", a), ("INPUT1", b)):
        data = np.array([values] if batch else values, dtype=np.float32)
        tensor = module.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def stats(server: ServerProcess, model: str) -> dict[str, Any]:
    answer = httpx.get(f"{server.base}/v2/models/{model}/versions/1/stats", timeout=30).json()
    entry = answer["model_stats"][0]
    counts = {name: d["count"] for name, d in entry["inference_stats"].items()}
    counts["inference_count"] = entry["inference_count"]
    counts["execution_count"] = entry["execution_count"]
    return counts


def changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {key: after[key] - before[key] for key in after if after[key] != before[key]}


def scrape(server: ServerProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.env['TRITONACTOR_METRICS_PORT']}/metrics"
    text = httpx.get(url, timeout=30).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(found: dict[str, Any], family: str, **labels: str) -> float:
    [value] = [s.value for s in found[family].samples if s.labels == labels]
    return value


# -- hits and misses ------------------------------------------------------------------------------


def test_a_repeated_http_request_is_answered_from_the_cache(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    before = stats(server, "cached")
    a, b = [1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]
    first = http_client.infer("cached", add_sub_inputs(httpclient, a, b), request_id="one")
    second = http_client.infer("cached", add_sub_inputs(httpclient, a, b), request_id="two")
    np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), [[2.0, 3.0, 4.0, 5.0]])
    np.testing.assert_array_equal(second.as_numpy("OUTPUT1"), first.as_numpy("OUTPUT1"))
    assert second.get_response()["id"] == "two"
    # As Triton 2.51 counts a miss then a hit: two successes queued, one computed.
    assert changed(before, stats(server, "cached")) == {
        "success": 2,
        "queue": 2,
        "compute_input": 1,
        "compute_infer": 1,
        "compute_output": 1,
        "cache_hit": 1,
        "cache_miss": 1,
        "inference_count": 1,
        "execution_count": 1,
    }


def test_json_requests_hit_too(server: ServerProcess) -> None:
    body = {
        "id": "j1",
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 2, 2]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [0, 1, 0, 1]},
        ],
    }
    url = f"{server.base}/v2/models/cached/infer"
    before = stats(server, "cached")
    first = httpx.post(url, json=body, timeout=30).json()
    second = httpx.post(url, json=body | {"id": "j2"}, timeout=30).json()
    assert second["id"] == "j2"
    assert second["outputs"] == first["outputs"]
    assert second["outputs"][0] == {
        "name": "OUTPUT0",
        "datatype": "FP32",
        "shape": [1, 4],
        "data": [1.0, 2.0, 2.0, 3.0],
    }
    delta = changed(before, stats(server, "cached"))
    assert (delta["cache_hit"], delta["cache_miss"]) == (1, 1)


def test_grpc_hits_the_same_cache(
    server: ServerProcess,
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    before = stats(server, "cached")
    a, b = [5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0]
    http_client.infer("cached", add_sub_inputs(httpclient, a, b))  # stored by an HTTP request
    result = grpc_client.infer("cached", add_sub_inputs(grpcclient, a, b), request_id="g")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [[4.0, 4.0, 4.0, 4.0]])
    assert result.get_response().id == "g"
    statistics = grpc_client.get_inference_statistics("cached", "1").model_stats[0]
    assert statistics.inference_stats.cache_hit.count == before["cache_hit"] + 1
    assert statistics.inference_stats.cache_hit.ns > 0
    assert statistics.inference_stats.cache_miss.count == before["cache_miss"] + 1
    assert statistics.execution_count == before["execution_count"] + 1


def test_a_grpc_stream_gets_its_hits_in_the_stream(
    server: ServerProcess, grpc_client: grpcclient.InferenceServerClient
) -> None:
    before = stats(server, "cached")
    answers: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        inputs = add_sub_inputs(grpcclient, [2.0, 4.0, 6.0, 8.0], [2.0, 2.0, 2.0, 2.0])
        grpc_client.async_stream_infer("cached", inputs, request_id="s1")
        first, error = answers.get(timeout=30)
        assert error is None
        grpc_client.async_stream_infer("cached", inputs, request_id="s2")
        second, error = answers.get(timeout=30)
        assert error is None
    finally:
        grpc_client.stop_stream()
    assert second.get_response().id == "s2"
    np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), first.as_numpy("OUTPUT0"))
    delta = changed(before, stats(server, "cached"))
    assert (delta["cache_hit"], delta["cache_miss"], delta["execution_count"]) == (1, 1, 1)


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_stream_request_whose_data_do_not_fit_its_shape_is_refused_not_run(
    repo: Path, tmp_path: Path, workers: str
) -> None:
    """A caching model's stream request goes through the cache's pre-step and then the router
    (in one process, `--workers 0`, both are the engine's): the data error kept for the
    model's signature is told by both, never let through."""
    server = start_server([repo], tmp_path, ENV, args=("--workers", workers))
    try:
        refused_not_run(server)
    finally:
        server.stop()


def refused_not_run(server: ServerProcess) -> None:
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    before = stats(server, "cached")
    answers: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        inputs = add_sub_inputs(grpcclient, [2.0, 4.0, 6.0, 8.0], [2.0, 2.0, 2.0, 2.0])
        inputs[0]._raw_content = np.zeros(8, dtype=np.float32).tobytes()  # 32 bytes for 4 FP32
        grpc_client.async_stream_infer("cached", inputs, request_id="bad")
        result, error = answers.get(timeout=30)
    finally:
        grpc_client.stop_stream()
    assert result is None and error is not None
    assert "input byte size mismatch for input 'INPUT0'" in error.message()
    assert "Expected 16, got 32" in error.message()
    assert changed(before, stats(server, "cached")) == {}


def test_what_the_model_would_answer_differently_is_a_miss(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    # Triton keys on the inputs' bytes alone and would answer each of these from the first
    # one's entry; here each one runs (docs/response-cache.md).
    a, b = [9.0, 9.0, 9.0, 9.0], [1.0, 2.0, 3.0, 4.0]
    before = stats(server, "cached")
    http_client.infer("cached", add_sub_inputs(httpclient, a, b))
    only_one = [httpclient.InferRequestedOutput("OUTPUT1")]
    answer = http_client.infer("cached", add_sub_inputs(httpclient, a, b), outputs=only_one)
    assert [o["name"] for o in answer.get_response()["outputs"]] == ["OUTPUT1"]
    http_client.infer("cached", add_sub_inputs(httpclient, a, b), parameters={"p": "x"})
    assert changed(before, stats(server, "cached"))["cache_miss"] == 3
    assert stats(server, "cached")["cache_hit"] == before["cache_hit"]
    # Each of them is cached in its own right now.
    answer = http_client.infer("cached", add_sub_inputs(httpclient, a, b), outputs=only_one)
    assert [o["name"] for o in answer.get_response()["outputs"]] == ["OUTPUT1"]
    assert stats(server, "cached")["cache_hit"] == before["cache_hit"] + 1


def test_bytes_inputs_are_keyed_by_their_elements(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    def send(*items: bytes) -> list[bytes]:
        data = np.array(items, dtype=np.object_)
        tensor = httpclient.InferInput("INPUT0", [len(items)], "BYTES")
        tensor.set_data_from_numpy(data)
        return list(http_client.infer("cached_strings", [tensor]).as_numpy("OUTPUT0"))

    before = stats(server, "cached_strings")
    assert send(b"ab", b"c") == [b"ab", b"c"]
    assert send(b"a", b"bc") == [b"a", b"bc"]  # the same bytes on the wire but for the lengths
    assert send(b"ab", b"c") == [b"ab", b"c"]
    assert changed(before, stats(server, "cached_strings")) == {
        "success": 3,
        "queue": 3,
        "compute_input": 2,
        "compute_infer": 2,
        "compute_output": 2,
        "cache_hit": 1,
        "cache_miss": 2,
        "inference_count": 2,
        "execution_count": 2,
    }


@pytest.mark.parametrize("protocol", ["http", "grpc stream"])
def test_large_bytes_requests_hit_too(
    server: ServerProcess,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    protocol: str,
) -> None:
    # 20,000 BYTES elements (past offload's 16,384): their key, their copy into the cache and
    # the hit's answer are worked out off the event loop (tritonactor/core/offload.py). About
    # 200 kB an entry: the 1 MiB cache evicts nothing.
    items = np.array([f"{protocol[0]}{i}".encode() for i in range(20_000)], dtype=np.object_)
    before = stats(server, "cached_strings")
    if protocol == "http":
        tensor = httpclient.InferInput("INPUT0", [len(items)], "BYTES")
        tensor.set_data_from_numpy(items)
        results = [http_client.infer("cached_strings", [tensor]) for _ in range(2)]
    else:
        answers: queue.Queue[Any] = queue.Queue()
        grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            tensor = grpcclient.InferInput("INPUT0", [len(items)], "BYTES")
            tensor.set_data_from_numpy(items)
            results = []
            for request_id in ("l1", "l2"):
                grpc_client.async_stream_infer("cached_strings", [tensor], request_id=request_id)
                result, error = answers.get(timeout=60)
                assert error is None
                results.append(result)
        finally:
            grpc_client.stop_stream()
    for result in results:
        assert list(result.as_numpy("OUTPUT0")) == list(items)
    delta = changed(before, stats(server, "cached_strings"))
    assert (delta["cache_hit"], delta["cache_miss"], delta["execution_count"]) == (1, 1, 1)
    if protocol != "http":
        # The stream's mark on its answer (triton_final_response) is not the model's answer:
        # a hit over HTTP does not carry it.
        tensor = httpclient.InferInput("INPUT0", [len(items)], "BYTES")
        tensor.set_data_from_numpy(items)
        hit = http_client.infer("cached_strings", [tensor]).get_response()
        assert "triton_final_response" not in hit.get("parameters", {})
        assert changed(before, stats(server, "cached_strings"))["cache_hit"] == 2


def test_a_model_that_does_not_ask_for_the_cache_runs_every_request(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    before = stats(server, "plain")
    for _ in range(2):
        http_client.infer("plain", add_sub_inputs(httpclient, [1, 2, 3, 4], [1, 1, 1, 1]))
    assert changed(before, stats(server, "plain"))["execution_count"] == 2
    assert stats(server, "plain")["cache_miss"] == stats(server, "plain")["cache_hit"] == 0


def test_an_ensemble_is_cached_at_its_top_level(
    server: ServerProcess, grpc_client: grpcclient.InferenceServerClient
) -> None:
    before_top, before_step = stats(server, "cached_ensemble"), stats(server, "step")
    inputs = []
    for name, values in (("X", [1.0, 2.0, 3.0, 4.0]), ("Y", [4.0, 3.0, 2.0, 1.0])):
        tensor = grpcclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
        inputs.append(tensor)
    for _ in range(2):
        result = grpc_client.infer("cached_ensemble", inputs)
        np.testing.assert_array_equal(result.as_numpy("SUM"), [5.0, 5.0, 5.0, 5.0])
    # As Triton 2.51: the hit never ran the step; the ensemble counts one execution.
    assert changed(before_step, stats(server, "step"))["execution_count"] == 1
    top = changed(before_top, stats(server, "cached_ensemble"))
    assert (top["success"], top["cache_hit"], top["cache_miss"]) == (2, 1, 1)
    assert top["execution_count"] == top["inference_count"] == 1


def test_a_step_model_changing_drops_the_ensembles_entries(
    server: ServerProcess, repo: Path, grpc_client: grpcclient.InferenceServerClient
) -> None:
    # What the ensemble answered came from the step's old version: once the step has a new
    # one, the ensemble runs again (Triton reloads an ensemble with its steps).
    inputs = []
    for name, values in (("X", [9.0, 9.0, 9.0, 9.0]), ("Y", [1.0, 2.0, 3.0, 4.0])):
        tensor = grpcclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
        inputs.append(tensor)
    grpc_client.infer("cached_ensemble", inputs)
    before = stats(server, "cached_ensemble")
    grpc_client.infer("cached_ensemble", inputs)
    assert changed(before, stats(server, "cached_ensemble"))["cache_hit"] == 1
    shutil.copytree(repo / "step" / "1", repo / "step" / "2")
    try:
        grpc_client.load_model("step")  # version 2 serves the ensemble's step now
        assert grpc_client.is_model_ready("step", "2")
        before = stats(server, "cached_ensemble")
        result = grpc_client.infer("cached_ensemble", inputs)
        np.testing.assert_array_equal(result.as_numpy("SUM"), [10.0, 11.0, 12.0, 13.0])
        ran = changed(before, stats(server, "cached_ensemble"))
        assert (ran.get("cache_hit", 0), ran["cache_miss"], ran["execution_count"]) == (0, 1, 1)
    finally:
        shutil.rmtree(repo / "step" / "2")
        grpc_client.load_model("step")
        assert grpc_client.is_model_ready("step", "1")


# -- metrics --------------------------------------------------------------------------------------


def test_the_cache_metrics(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    before = scrape(server)
    labels = {"model": "cached", "version": "1"}
    hits = sample(before, "nv_cache_num_hits_per_model", **labels)
    misses = sample(before, "nv_cache_num_misses_per_model", **labels)
    entries = sample(before, "nv_cache_num_entries")
    for _ in range(3):
        http_client.infer("cached", add_sub_inputs(httpclient, [7, 7, 7, 7], [0, 1, 2, 3]))
    after = scrape(server)
    assert sample(after, "nv_cache_num_hits_per_model", **labels) == hits + 2
    assert sample(after, "nv_cache_num_misses_per_model", **labels) == misses + 1
    assert sample(after, "nv_cache_hit_duration_per_model", **labels) >= 0
    assert sample(after, "nv_cache_num_entries") == entries + 1
    # Counted by the store on its own, not as hits + misses.
    lookups = sample(after, "nv_cache_num_lookups") - sample(before, "nv_cache_num_lookups")
    assert lookups == 3
    assert 0 < sample(after, "nv_cache_util") < 1
    assert sample(after, "nv_cache_num_evictions") == 0
    for family in ("nv_cache_util", "nv_cache_num_entries", "nv_cache_lookup_duration"):
        assert after[family].type == "gauge"
    assert after["nv_cache_num_hits_per_model"].type == "counter"
    # Only the versions that ask for the cache have the per-model families, as in Triton.
    per_model = {s.labels["model"] for s in after["nv_cache_num_hits_per_model"].samples}
    assert per_model == {"cached", "cached_strings", "cached_ensemble", "reloaded", "parameters"}


def test_response_parameters_are_charged(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    def send(size: float) -> None:
        data = np.array([size], dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(data)
        http_client.infer("parameters", [tensor])

    before = scrape(server)
    send(10_000.0)  # its 10 kB parameter fits: charged
    after = scrape(server)
    grown = (sample(after, "nv_cache_util") - sample(before, "nv_cache_util")) * CACHE_SIZE
    assert grown > 10_000
    assert sample(after, "nv_cache_num_entries") == sample(before, "nv_cache_num_entries") + 1
    stats_before = stats(server, "parameters")
    for _ in range(2):
        send(2_000_000.0)  # 2 MB of parameter: more than the 1 MiB cache, never stored
    ran = changed(stats_before, stats(server, "parameters"))
    assert (ran["execution_count"], ran["cache_miss"], ran.get("cache_hit", 0)) == (2, 2, 0)
    assert sample(scrape(server), "nv_cache_num_entries") == sample(after, "nv_cache_num_entries")


# -- models and the cache -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            "refused_decoupled",
            "Response Cache does not currently support model refused_decoupled with 'decoupled' "
            "transaction policy. Please disable the response cache.",
        ),
        (
            "refused_sequence",
            "Response Cache does not currently support model refused_sequence with sequence "
            "batching scheduler. Please disable the response cache.",
        ),
        (
            "refused_ensemble",
            "Response Cache does not currently support model refused_ensemble with 'decoupled' "
            "transaction policy. Please disable the response cache.",
        ),
    ],
)
def test_decoupled_and_sequence_models_with_the_cache_are_refused(
    server: ServerProcess, grpc_client: grpcclient.InferenceServerClient, model: str, reason: str
) -> None:
    response = httpx.post(f"{server.base}/v2/repository/models/{model}/load", timeout=60)
    assert response.status_code == 400
    assert reason in response.json()["error"]
    with pytest.raises(InferenceServerException, match="Please disable the response cache"):
        grpc_client.load_model(model)
    index = httpx.post(f"{server.base}/v2/repository/index", json={}, timeout=30).json()
    [entry] = [e for e in index if e["name"] == model]
    assert entry["state"] == "UNAVAILABLE" and reason in entry["reason"]


def test_an_unload_or_a_reload_drops_the_versions_entries(
    server: ServerProcess, http_client: httpclient.InferenceServerClient
) -> None:
    def send() -> None:
        http_client.infer("reloaded", add_sub_inputs(httpclient, [3, 3, 3, 3], [1, 1, 1, 1]))

    send()
    stored = sample(scrape(server), "nv_cache_num_entries")
    http_client.unload_model("reloaded")
    assert sample(scrape(server), "nv_cache_num_entries") == stored - 1
    http_client.load_model("reloaded")
    send()
    send()
    # Loaded again, its statistics start afresh: a miss (the old entry is gone), then a hit.
    after = stats(server, "reloaded")
    assert (after["cache_miss"], after["cache_hit"], after["execution_count"]) == (1, 1, 1)


def test_the_server_lists_no_cache_extension(server: ServerProcess) -> None:
    # Triton 2.51's extensions do not name the response cache either.
    extensions = httpx.get(f"{server.base}/v2", timeout=30).json()["extensions"]
    assert not [name for name in extensions if "cache" in name]


# -- servers without a cache, or with a bad one ---------------------------------------------------


def test_without_a_cache_a_model_asking_for_one_runs_every_request(
    repo: Path, tmp_path: Path
) -> None:
    env = {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit", "TRITONACTOR_LOAD_MODEL": "cached"}
    process = start_server([repo], tmp_path, env)
    try:
        with httpclient.InferenceServerClient(process.url) as client:
            for _ in range(2):
                client.infer("cached", add_sub_inputs(httpclient, [1, 2, 3, 4], [1, 1, 1, 1]))
        counts = stats(process, "cached")
        assert (counts["execution_count"], counts["cache_hit"], counts["cache_miss"]) == (2, 0, 0)
        found = scrape(process)
        # As Triton: the model's cache families are there (zero); the cache's own are not.
        assert sample(found, "nv_cache_num_hits_per_model", model="cached", version="1") == 0
        assert "nv_cache_util" not in found
    finally:
        process.stop()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"TRITONACTOR_CACHE_CONFIG": "redis,size=1048576"},
            "TRITONACTOR_CACHE_CONFIG='[\"redis,size=1048576\"]' names the cache 'redis'",
        ),
        ({"TRITONACTOR_CACHE_CONFIG": "local,size=lots"}, "a size that is not a number of bytes"),
        ({"TRITONACTOR_RESPONSE_CACHE_BYTE_SIZE": "100"}, "needs at least 192 bytes"),
        (
            # Triton: "Failed to initialize LocalCache: failed to allocate buffer".
            {"TRITONACTOR_CACHE_CONFIG": "local,size=10000000000000"},
            "is larger than this machine's memory",
        ),
    ],
)
def test_a_bad_cache_setting_stops_the_server_with_a_clear_error(
    repo: Path, tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(RuntimeError, match="server exited") as caught:
        start_server([repo], tmp_path, env)
    assert message in str(caught.value)
