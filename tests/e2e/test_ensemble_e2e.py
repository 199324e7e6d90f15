"""An ensemble served by a real server: an ONNX add/sub step feeding a python step, over HTTP
and gRPC; an ensemble with a cycle is UNAVAILABLE with its reason while the others serve."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import onnx_models
from tests.e2e.conftest import ADD_SUB_FP32_CONFIG as ONNX_CONFIG
from tests.e2e.conftest import write_config
from tests.server_process import ServerProcess, start_server

PYTHON_MODELS = Path(__file__).resolve().parent.parent / "python_models"


# (x + y) * (x - y), and the sum on its own.
ENSEMBLE_CONFIG = """
name: "sum_times_difference"
platform: "ensemble"
max_batch_size: 0
input [
  { name: "X" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "RESULT" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }
]
ensemble_scheduling { step [
  { model_name: "onnx_add_sub" model_version: -1
    input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "Y" } ]
    output_map [ { key: "OUTPUT0" value: "SUM" }, { key: "OUTPUT1" value: "difference" } ] },
  { model_name: "multiply" model_version: -1
    input_map [ { key: "A" value: "SUM" }, { key: "B" value: "difference" } ]
    output_map { key: "PRODUCT" value: "RESULT" } }
] }
"""

CYCLIC_CONFIG = """
name: "cyclic"
platform: "ensemble"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "multiply"
    input_map [ { key: "A" value: "X" }, { key: "B" value: "back" } ]
    output_map { key: "PRODUCT" value: "forth" } },
  { model_name: "multiply"
    input_map [ { key: "A" value: "forth" }, { key: "B" value: "X" } ]
    output_map { key: "PRODUCT" value: "back" } },
  { model_name: "onnx_add_sub"
    input_map [ { key: "INPUT0" value: "forth" }, { key: "INPUT1" value: "back" } ]
    output_map { key: "OUTPUT0" value: "RESULT" } }
] }
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("ensembles") / "models"
    onnx_models.add_sub_model(repo / "onnx_add_sub" / "1" / "model.onnx", "FP32", (4,), batch=False)
    write_config(repo / "onnx_add_sub", ONNX_CONFIG)
    shutil.copytree(PYTHON_MODELS / "multiply", repo / "multiply")
    for name, text in (("sum_times_difference", ENSEMBLE_CONFIG), ("cyclic", CYCLIC_CONFIG)):
        write_config(repo / name, text)
        (repo / name / "1").mkdir()
    server = start_server(
        [repo],
        tmp_path_factory.mktemp("ensemble-server"),
        {"TRITONACTOR_EXIT_ON_ERROR": "false"},
        wait_ready=False,
    )
    yield server
    server.stop()


def inputs(module: type) -> tuple[list, np.ndarray, np.ndarray]:
    x = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    y = np.array([0.5, 1.0, 1.5, 2.0], dtype=np.float32)
    tensors = [module.InferInput(name, [4], "FP32") for name in ("X", "Y")]
    tensors[0].set_data_from_numpy(x)
    tensors[1].set_data_from_numpy(y)
    return tensors, x, y


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_ensemble_composes_its_steps(served: ServerProcess, module: type) -> None:
    client = module.InferenceServerClient(served.url if module is httpclient else served.grpc_url)
    tensors, x, y = inputs(module)
    result = client.infer("sum_times_difference", tensors, request_id="e1")
    np.testing.assert_allclose(result.as_numpy("RESULT"), (x + y) * (x - y))
    np.testing.assert_allclose(result.as_numpy("SUM"), x + y)
    response = result.get_response()
    if module is httpclient:
        assert (response["model_name"], response["model_version"]) == ("sum_times_difference", "1")
        assert response["id"] == "e1"
    else:
        assert (response.model_name, response.model_version) == ("sum_times_difference", "1")
    # Asking for one output returns only that one.
    only = client.infer(
        "sum_times_difference", tensors, outputs=[module.InferRequestedOutput("SUM")]
    )
    assert only.as_numpy("RESULT") is None
    np.testing.assert_allclose(only.as_numpy("SUM"), x + y)


def test_the_ensemble_metadata_is_its_own_config(served: ServerProcess) -> None:
    metadata = httpclient.InferenceServerClient(served.url).get_model_metadata(
        "sum_times_difference"
    )
    assert metadata["platform"] == "ensemble"
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["X", "Y"]
    assert [tensor["name"] for tensor in metadata["outputs"]] == ["RESULT", "SUM"]


def test_the_served_config_is_tritons(served: ServerProcess) -> None:
    """As Triton 2.51 serves an ensemble's config: no instance group or optimization filled
    in, no backend, and its transaction policy written out, false included."""
    config = httpclient.InferenceServerClient(served.url).get_model_config("sum_times_difference")
    assert (config["platform"], config["backend"], config["instance_group"]) == ("ensemble", "", [])
    assert "optimization" not in config
    assert config["model_transaction_policy"] == {"decoupled": False}


def test_a_cyclic_ensemble_is_unavailable_while_the_others_serve(served: ServerProcess) -> None:
    # Models load before the server listens: the index is final here.
    index = httpx.post(f"{served.base}/v2/repository/index", json={}).json()
    states = {entry["name"]: entry for entry in index}
    for name in ("onnx_add_sub", "multiply", "sum_times_difference"):
        assert states[name]["state"] == "READY", states[name]
    assert states["cyclic"]["state"] == "UNAVAILABLE"
    assert states["cyclic"]["reason"] == (  # Triton's words for a cycle
        "output 'RESULT' for ensemble 'cyclic' is not written: at least one of its depending "
        "tensors, 'back', is not connected"
    )
    x = httpclient.InferInput("X", [4], "FP32")
    x.set_data_from_numpy(np.ones(4, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="cyclic"):
        httpclient.InferenceServerClient(served.url).infer("cyclic", [x])
