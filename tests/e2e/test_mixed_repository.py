"""One repository mixing model.onnx, model.pt, model.py and model.plan, served behind one
endpoint: every model that can run here serves over HTTP and gRPC; the TensorRT one, which needs
a GPU, is UNAVAILABLE with its reason and takes nothing else down."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import onnx_models, torch_models
from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.server_process import ServerProcess, start_server
from tritonactor.core.devices import gpu_count

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*")

PYTHON_MODELS = Path(__file__).resolve().parent.parent / "python_models"

TORCH_CONFIG = """
name: "torch_add_sub"
platform: "pytorch_libtorch"
max_batch_size: 8
input [
  { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT__1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT__1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("mixed") / "models"
    onnx_models.add_sub_model(repo / "onnx_add_sub" / "1" / "model.onnx")
    write_config(repo / "onnx_add_sub", SIMPLE_CONFIG.format(name="onnx_add_sub", max_batch_size=8))
    torch_models.add_sub_model(repo / "torch_add_sub" / "1" / "model.pt")
    write_config(repo / "torch_add_sub", TORCH_CONFIG)
    shutil.copytree(PYTHON_MODELS / "add_sub", repo / "add_sub")
    # A TensorRT plan found by its file name alone: no config, no platform.
    (repo / "plan_model" / "1").mkdir(parents=True)
    (repo / "plan_model" / "1" / "model.plan").write_bytes(b"not an engine")
    server = start_server(
        [repo],
        tmp_path_factory.mktemp("mixed-server"),
        {"TRITONACTOR_EXIT_ON_ERROR": "false"},
        wait_ready=False,
    )
    yield server
    server.stop()


def int_inputs(module: type, names: tuple[str, str]) -> tuple[list, np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in names]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_every_backend_serves_behind_one_endpoint(mixed: ServerProcess, module: type) -> None:
    url = mixed.url if module is httpclient else mixed.grpc_url
    client = module.InferenceServerClient(url)

    inputs, a, b = int_inputs(module, ("INPUT0", "INPUT1"))
    result = client.infer("onnx_add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)

    inputs, a, b = int_inputs(module, ("INPUT__0", "INPUT__1"))
    result = client.infer("torch_add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)

    x = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    y = np.array([0.5, 0.5, 0.5, 0.5], dtype=np.float32)
    inputs = [module.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    result = client.infer("add_sub", inputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), x + y)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), x - y)


@pytest.mark.skipif(gpu_count() > 0, reason="on a GPU machine the plan is judged by TensorRT")
def test_the_plan_without_a_gpu_is_unavailable_with_its_reason(mixed: ServerProcess) -> None:
    index = httpx.post(f"{mixed.base}/v2/repository/index", json={}).json()
    states = {entry["name"]: entry for entry in index}
    for name in ("onnx_add_sub", "torch_add_sub", "add_sub"):
        assert states[name]["state"] == "READY", states[name]
    plan = states["plan_model"]
    assert plan["state"] == "UNAVAILABLE"
    assert "tensorrt" in plan["reason"] and "GPU" in plan["reason"]
    metadata = httpclient.InferenceServerClient(mixed.url).get_model_metadata("torch_add_sub")
    assert metadata["platform"] == "pytorch_libtorch"
