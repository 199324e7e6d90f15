"""Classification through the real server and tritonclient: HTTP JSON, HTTP binary, gRPC unary
and gRPC streams (a decoupled model), batched outputs, more classes asked than the output holds,
outputs with and without labels, and the errors. The expected strings are Triton 2.51's answers
to the same requests."""

from __future__ import annotations

import json
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
SCORES = np.array([0.1, 0.7, 0.2, 0.5], dtype=np.float32)
TOP3 = [b"0.700000:1:dog", b"0.500000:3:bird", b"0.200000:2"]


ENSEMBLE = """
name: "class_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "TOP" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ {
  model_name: "class_scores" model_version: -1
  input_map { key: "FP32" value: "SCORES" }
  output_map { key: "OUT_FP32" value: "TOP" }
} ] }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("classification")
    repo = root / "models"
    for name in ("class_scores", "class_batched", "class_stream"):
        shutil.copytree(MODELS / name, repo / name)
    # A label file that is not there fails the model's load, as in Triton.
    shutil.copytree(MODELS / "class_scores", repo / "label_missing")
    config = (repo / "label_missing" / "config.pbtxt").read_text()
    config = config.replace('"class_scores"', '"label_missing"')
    (repo / "label_missing" / "config.pbtxt").write_text(config.replace("labels.txt", "nope.txt"))
    # A copy whose labels a test rewrites, and an ensemble over class_scores without labels.
    shutil.copytree(MODELS / "class_scores", repo / "class_relabel")
    config = (repo / "class_relabel" / "config.pbtxt").read_text()
    (repo / "class_relabel" / "config.pbtxt").write_text(
        config.replace('"class_scores"', '"class_relabel"')
    )
    (repo / "class_ensemble" / "1").mkdir(parents=True)
    (repo / "class_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    # Explicit mode (all loaded at startup), so that a test can reload a model.
    env = {
        "TRITONACTOR_EXIT_ON_ERROR": "false",
        "TRITONACTOR_MODEL_CONTROL_MODE": "explicit",
        "TRITONACTOR_LOAD_MODEL": "*",
    }
    # Not ready while a model is unavailable: wait until it is live (startup loads come first).
    process = start_server([repo], root, env, wait_ready=False)
    yield process
    process.stop()


def fp32(module: Any, name: str = "FP32", data: np.ndarray = SCORES) -> Any:
    tensor = module.InferInput(name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


def test_http_json_and_binary(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    for binary in (False, True):
        output = httpclient.InferRequestedOutput("OUT_FP32", binary_data=binary, class_count=3)
        result = client.infer("class_scores", [fp32(httpclient)], outputs=[output])
        entry = result.get_output("OUT_FP32")
        assert (entry["datatype"], entry["shape"]) == ("BYTES", [3])
        assert ("data" in entry) is not binary
        assert [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("OUT_FP32")] == (
            TOP3
        )
    client.close()


def test_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    output = grpcclient.InferRequestedOutput("OUT_FP32", class_count=3)
    result = client.infer("class_scores", [fp32(grpcclient)], outputs=[output])
    entry = result.get_output("OUT_FP32")
    assert (entry.datatype, list(entry.shape)) == ("BYTES", [3])
    assert result.as_numpy("OUT_FP32").tolist() == TOP3
    client.close()


def test_more_classes_than_scores_and_an_output_without_labels(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    inputs = [httpclient.InferInput("FP64", [3], "FP64")]
    inputs[0].set_data_from_numpy(np.array([0.1, 0.7, 1 / 3], np.float64))
    output = httpclient.InferRequestedOutput("OUT_FP64", binary_data=False, class_count=10)
    result = client.infer("class_scores", inputs, outputs=[output])
    assert result.get_output("OUT_FP64")["shape"] == [3]
    assert result.as_numpy("OUT_FP64").tolist() == ["0.700000:1", "0.333333:2", "0.100000:0"]
    client.close()


def test_a_batched_output_per_row_beside_an_unclassified_one(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    scores = fp32(grpcclient, "SCORES", np.array([[0.1, 0.4, 0.3, 0.2], [4, 3, 2, 1]], np.float32))
    grid = grpcclient.InferInput("GRID", [2, 2, 3], "INT32")
    grid.set_data_from_numpy(np.arange(12, dtype=np.int32).reshape(2, 2, 3))
    outputs = [
        grpcclient.InferRequestedOutput("PROBS", class_count=2),
        grpcclient.InferRequestedOutput("GRID_OUT"),
    ]
    result = client.infer("class_batched", [scores, grid], outputs=outputs)
    assert result.as_numpy("PROBS").tolist() == [
        [b"0.400000:1:east", b"0.300000:2:south"],
        [b"4.000000:0:north", b"3.000000:1:east"],
    ]
    assert result.as_numpy("GRID_OUT").tolist() == np.arange(12).reshape(2, 2, 3).tolist()
    client.close()


def test_ties_in_triton_order(server: ServerProcess) -> None:
    body = {
        "inputs": [{"name": "INT32", "datatype": "INT32", "shape": [20], "data": [1, 2] * 10}],
        "outputs": [{"name": "OUT_INT32", "parameters": {"classification": 20}}],
    }
    response = httpx.post(f"{server.base}/v2/models/class_scores/infer", json=body)
    assert response.status_code == 200, response.text
    order = [int(s.split(":")[1]) for s in response.json()["outputs"][0]["data"]]
    assert order == [1, 19, 17, 15, 13, 11, 9, 7, 5, 3, 8, 6, 10, 12, 4, 14, 16, 2, 18, 0]


def test_a_decoupled_models_stream_is_classified_response_by_response(
    server: ServerProcess,
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([2], np.int32))
    scores = fp32(grpcclient, "SCORES", np.array([0.1, 0.4, 0.3, 0.2], np.float32))
    output = grpcclient.InferRequestedOutput("PROBS", class_count=1)
    client.async_stream_infer("class_stream", [scores, count], outputs=[output])
    got = []
    for _ in range(2):
        result, error = answers.get(timeout=30)
        assert error is None
        got.append(result.as_numpy("PROBS").tolist())
    client.stop_stream()
    client.close()
    # The second response holds the scores rotated by one.
    assert got == [[b"0.400000:1:b"], [b"0.400000:2:c"]]


@pytest.mark.parametrize("value", [-1, 1.5, "2", True])
def test_a_bad_class_count_over_http(server: ServerProcess, value: Any) -> None:
    before = success_count(server)
    body = {
        "inputs": [{"name": "FP32", "datatype": "FP32", "shape": [2], "data": [0.1, 0.7]}],
        "outputs": [{"name": "OUT_FP32", "parameters": {"classification": value}}],
    }
    response = httpx.post(f"{server.base}/v2/models/class_scores/infer", json=body)
    assert response.status_code == 400
    assert "'classification' parameter" in response.json()["error"]
    assert success_count(server) == before  # refused before it ran


def test_a_bad_class_count_over_grpc(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for parameter, message in (
            ({"int64_param": -1}, "invalid value for 'classification' parameter, expected >= 0"),
            (
                {"string_param": "2"},
                "invalid value type for 'classification' parameter, expected int64_param",
            ),
        ):
            request = service_pb2.ModelInferRequest(model_name="class_scores")
            tensor = request.inputs.add(name="FP32", datatype="FP32", shape=[2])
            tensor.contents.fp32_contents.extend([0.1, 0.7])
            output = request.outputs.add(name="OUT_FP32")
            output.parameters["classification"].CopyFrom(service_pb2.InferParameter(**parameter))
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(request)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == message


@pytest.mark.parametrize(("name", "datatype"), [("BOOL", "BOOL"), ("BYTES", "BYTES")])
def test_an_output_that_cannot_be_ranked(server: ServerProcess, name: str, datatype: str) -> None:
    data = [True, False] if datatype == "BOOL" else ["a", "b"]
    body = {
        "inputs": [{"name": name, "datatype": datatype, "shape": [2], "data": data}],
        "outputs": [{"name": f"OUT_{name}", "parameters": {"classification": 1}}],
    }
    response = httpx.post(f"{server.base}/v2/models/class_scores/infer", json=body)
    assert response.status_code == 400
    assert response.json() == {
        "error": f"class result not available for output due to unsupported type '{datatype}'"
    }
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput(name, [2], datatype)
    tensor.set_data_from_numpy(np.array(data, dtype=np.object_ if datatype == "BYTES" else bool))
    output = grpcclient.InferRequestedOutput(f"OUT_{name}", class_count=1)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("class_scores", [tensor], outputs=[output])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.close()


def test_a_missing_label_file_fails_the_load(server: ServerProcess) -> None:
    index = httpx.post(f"{server.base}/v2/repository/index").json()
    (entry,) = [e for e in index if e["name"] == "label_missing"]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].startswith("failed to open text file for read ")
    assert entry["reason"].endswith("nope.txt: No such file or directory")


def success_count(server: ServerProcess) -> int:
    stats = httpx.get(f"{server.base}/v2/models/class_scores/stats").json()
    return stats["model_stats"][0]["inference_stats"]["success"]["count"]


def classes(server: ServerProcess, model: str, name: str, output: str) -> list[str]:
    body = {
        "inputs": [{"name": name, "datatype": "FP32", "shape": [4], "data": SCORES.tolist()}],
        "outputs": [{"name": output, "parameters": {"classification": 3}}],
    }
    response = httpx.post(f"{server.base}/v2/models/{model}/infer", json=body)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def test_a_reload_after_the_label_file_changed_reads_the_new_labels(server: ServerProcess) -> None:
    top3 = [item.decode() for item in TOP3]
    assert classes(server, "class_relabel", "FP32", "OUT_FP32") == top3
    # The label file is beside config.pbtxt, outside the version folder: it counts all the same.
    (server_repo(server) / "class_relabel" / "labels.txt").write_text("zero\none\ntwo\nthree\n")
    load = httpx.post(f"{server.base}/v2/repository/models/class_relabel/load")
    assert load.status_code == 200, load.text
    assert classes(server, "class_relabel", "FP32", "OUT_FP32") == [
        "0.700000:1:one",
        "0.500000:3:three",
        "0.200000:2:two",
    ]


def test_an_ensemble_output_takes_the_labels_of_its_step(server: ServerProcess) -> None:
    # As Triton: the ensemble's TOP has no label file; the step output mapped to it has one.
    assert classes(server, "class_ensemble", "SCORES", "TOP") == [item.decode() for item in TOP3]


def server_repo(server: ServerProcess) -> Path:
    return Path(server.env["TRITONACTOR_MODEL_REPOSITORY"])


def test_a_label_file_outside_the_model_folder_fails_the_load_and_changes_nothing(
    server: ServerProcess,
) -> None:
    config = httpx.get(f"{server.base}/v2/models/class_batched/config").json()
    config["output"][0]["label_filename"] = "../class_scores/labels.txt"
    load = httpx.post(
        f"{server.base}/v2/repository/models/class_batched/load",
        json={"parameters": {"config": json.dumps(config)}},
    )
    assert load.status_code == 400
    assert (
        "label_filename '../class_scores/labels.txt' of output 'PROBS' is outside the model's "
        "folder" in load.json()["error"]
    )
    # The version that was serving still serves, with its own labels.
    body = {
        "inputs": [
            {"name": "SCORES", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.4, 0.3, 0.2]},
            {"name": "GRID", "datatype": "INT32", "shape": [1, 2, 3], "data": [0] * 6},
        ],
        "outputs": [{"name": "PROBS", "parameters": {"classification": 1}}],
    }
    response = httpx.post(f"{server.base}/v2/models/class_batched/infer", json=body)
    assert response.json()["outputs"][0]["data"] == ["0.400000:1:east"]


def test_an_output_requested_twice_is_classified_as_first_asked(server: ServerProcess) -> None:
    body = {
        "inputs": [{"name": "FP32", "datatype": "FP32", "shape": [4], "data": SCORES.tolist()}],
        "outputs": [
            {"name": "OUT_FP32", "parameters": {"classification": 1}},
            {"name": "OUT_FP32", "parameters": {"classification": 3}},
        ],
    }
    response = httpx.post(f"{server.base}/v2/models/class_scores/infer", json=body)
    assert [o["data"] for o in response.json()["outputs"]] == [["0.700000:1:dog"]]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outputs = [
        grpcclient.InferRequestedOutput("OUT_FP32", class_count=1),
        grpcclient.InferRequestedOutput("OUT_FP32", class_count=3),
    ]
    result = client.infer("class_scores", [fp32(grpcclient)], outputs=outputs)
    assert result.as_numpy("OUT_FP32").tolist() == [b"0.700000:1:dog"]
    client.close()
