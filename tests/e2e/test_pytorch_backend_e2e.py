"""TorchScript models served by a real server, over tritonclient HTTP and gRPC, beside an ONNX
model in the same repository."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import onnx_models, torch_models
from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.server_process import ServerProcess, start_server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*"),
]

TORCH_CONFIG = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [
  {{ name: "INPUT__0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "INPUT__1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT__1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""

# No platform or backend: the server finds the pytorch backend by the `model.pt` file.
FAILING_CONFIG = """
name: "torch_failing"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""

A = np.arange(32, dtype=np.int32).reshape(2, 16)
B = np.full((2, 16), 3, dtype=np.int32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("torch_repo") / "models"
    torch_models.add_sub_model(repo / "torch_simple" / "1" / "model.pt")
    write_config(repo / "torch_simple", TORCH_CONFIG.format(name="torch_simple", count=2))
    torch_models.failing_model(repo / "torch_failing" / "1" / "model.pt")
    write_config(repo / "torch_failing", FAILING_CONFIG)
    onnx_models.add_sub_model(repo / "onnx_simple" / "1" / "model.onnx")
    write_config(repo / "onnx_simple", SIMPLE_CONFIG.format(name="onnx_simple", max_batch_size=8))
    process = start_server([repo], tmp_path_factory.mktemp("torch_server"))
    yield process
    process.stop()


def http_inputs(names: tuple[str, str]) -> list[httpclient.InferInput]:
    inputs = []
    for name, data in zip(names, (A, B), strict=True):
        tensor = httpclient.InferInput(name, list(data.shape), "INT32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def test_http_infer(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    result = client.infer("torch_simple", http_inputs(("INPUT__0", "INPUT__1")))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), A - B)


def test_grpc_infer(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inputs = []
        for name, data in (("INPUT__0", A), ("INPUT__1", B)):
            tensor = grpcclient.InferInput(name, list(data.shape), "INT32")
            tensor.set_data_from_numpy(data)
            inputs.append(tensor)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT__1")]
        result = client.infer("torch_simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), A - B)
        assert result.as_numpy("OUTPUT__0") is None


def test_metadata_and_config(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    metadata = client.get_model_metadata("torch_simple")
    assert metadata["platform"] == "pytorch_libtorch"
    assert [t["name"] for t in metadata["inputs"]] == ["INPUT__0", "INPUT__1"]
    config = client.get_model_config("torch_failing")
    assert config["backend"] == "pytorch"
    assert config["platform"] == "pytorch_libtorch"


def test_model_error_fails_only_that_request(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)

    def request(values: list[float]) -> httpclient.InferInput:
        tensor = httpclient.InferInput("INPUT__0", [2], "FP32")
        tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
        return tensor

    with pytest.raises(InferenceServerException) as caught:
        client.infer("torch_failing", [request([-1.0, 1.0])])
    assert "negative input" in caught.value.message()
    assert caught.value.status() == "500"
    result = client.infer("torch_failing", [request([1.0, 2.0])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), [1.0, 2.0])


def test_mixed_repository_serves_onnx_and_torchscript(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert index == {"onnx_simple": "READY", "torch_simple": "READY", "torch_failing": "READY"}
    onnx = client.infer("onnx_simple", http_inputs(("INPUT0", "INPUT1")))
    torch = client.infer("torch_simple", http_inputs(("INPUT__0", "INPUT__1")))
    np.testing.assert_array_equal(onnx.as_numpy("OUTPUT0"), torch.as_numpy("OUTPUT__0"))
    np.testing.assert_array_equal(onnx.as_numpy("OUTPUT1"), torch.as_numpy("OUTPUT__1"))
    assert client.get_model_metadata("onnx_simple")["platform"] == "onnxruntime_onnx"


def test_bad_config_fails_the_load_with_the_reason(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    torch_models.add_sub_model(repo / "no_io" / "1" / "model.pt")
    write_config(repo / "no_io", 'name: "no_io"\nplatform: "pytorch_libtorch"\n')
    process = start_server(
        [repo], tmp_path, {"TRITONACTOR_EXIT_ON_ERROR": "false"}, wait_ready=False
    )
    try:
        client = httpclient.InferenceServerClient(process.url)
        for _ in range(100):
            index = client.get_model_repository_index()
            if index and index[0].get("state") == "UNAVAILABLE":
                break
            time.sleep(0.1)
        assert index[0]["state"] == "UNAVAILABLE"
        assert "must list them" in index[0]["reason"]
    finally:
        process.stop()
