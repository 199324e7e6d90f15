"""Implicit state behind the real server: accumulators whose running sum the server keeps
between the requests of a sequence (STATE_OUT of one request is STATE_IN of the next), as
ONNX models built here and as a python model, with max_batch_size 0 and 4, over HTTP and gRPC;
and state configs the server refuses, with their reason in the repository index."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tests.onnx_models import save_model
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"

ONNX_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ {dims} ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 20000000
  control_input [
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [ {{
    input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ {dims} ]
    {initial}
  }} ]
}}
"""

ZERO_INITIAL = 'initial_state: { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true name: "z" }'
FILE_INITIAL = (
    'initial_state: { data_type: TYPE_INT32 dims: [ 3 ] data_file: "start.bin" name: "f" }'
)


def accumulator(path: Path, batching: bool, state_dims: list[int | str]) -> None:
    """OUTPUT_STATE = INPUT_STATE + INPUT * READY (a null row adds nothing), OUTPUT = the same.
    READY and the state are graph inputs the config does not list as inputs."""
    lead: list[int | str] = ["batch"] if batching else []
    value = [*lead, 1]
    state = [*lead, *state_dims]
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT", "READY"], ["GATED"]),
            helper.make_node("Add", ["INPUT_STATE", "GATED"], ["OUTPUT_STATE"]),
            helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"]),
        ],
        "accumulator",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.INT32, value),
            helper.make_tensor_value_info("READY", TensorProto.INT32, value),
            helper.make_tensor_value_info("INPUT_STATE", TensorProto.INT32, state),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, state),
            helper.make_tensor_value_info("OUTPUT_STATE", TensorProto.INT32, state),
        ],
    )
    save_model(graph, path)


def onnx_model(
    repo: Path,
    name: str,
    max_batch_size: int,
    count: int = 1,
    dims: str = "1",
    initial: str = "",
    state_dims: list[int | str] | None = None,
) -> None:
    accumulator(repo / name / "1" / "model.onnx", max_batch_size > 0, state_dims or [1])
    (repo / name / "config.pbtxt").write_text(
        ONNX_CONFIG.format(
            name=name, max_batch_size=max_batch_size, count=count, dims=dims, initial=initial
        )
    )


def python_model(repo: Path, name: str, max_batch_size: int) -> None:
    shutil.copytree(MODELS / "sequence_state", repo / name)
    config = repo / name / "config.pbtxt"
    text = config.read_text().replace('"sequence_state"', f'"{name}"')
    if max_batch_size:
        # Four slots on one instance instead of one slot on each of two.
        text = text.replace("max_batch_size: 0", f"max_batch_size: {max_batch_size}")
        text = text.replace("count: 2", "count: 1")
    config.write_text(text)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("state_repo")
    # max_batch_size 0 gives one slot per instance: two instances serve two sequences at once.
    onnx_model(repo, "onnx_state", 0, count=2)
    onnx_model(repo, "onnx_state_batch", 4)
    onnx_model(
        repo, "onnx_state_initial", 0, count=2, dims="-1", initial=ZERO_INITIAL, state_dims=["n"]
    )
    onnx_model(
        repo, "onnx_state_file", 0, count=1, dims="-1", initial=FILE_INITIAL, state_dims=["n"]
    )
    # Triton reads initial_state data files from the model folder's initial_state/.
    (repo / "onnx_state_file" / "initial_state").mkdir()
    np.array([10, 20, 30], dtype="<i4").tofile(
        repo / "onnx_state_file" / "initial_state" / "start.bin"
    )
    python_model(repo, "python_state", 0)
    python_model(repo, "python_state_batch", 4)
    bad = ONNX_CONFIG.format(name="{name}", max_batch_size=0, count=1, dims="1", initial="")
    for name, broken in (
        ("bad_state_no_input_name", bad.replace('input_name: "INPUT_STATE" ', "")),
        ("bad_state_clash", bad.replace('input_name: "INPUT_STATE"', 'input_name: "INPUT"')),
        ("bad_state_type", bad.replace(" data_type: TYPE_INT32 dims: [ 1 ]\n", " dims: [ 1 ]\n")),
    ):
        accumulator(repo / name / "1" / "model.onnx", False, [1])
        (repo / name / "config.pbtxt").write_text(broken.replace("{name}", name))
    # Not all models load (the bad ones): the server is live, not ready.
    process = start_server(
        [repo],
        tmp_path_factory.mktemp("state_server"),
        {"TRITONACTOR_EXIT_ON_ERROR": "false"},
        wait_ready=False,
    )
    yield process
    process.stop()


MODELS_SERVED = ["onnx_state", "onnx_state_batch", "python_state", "python_state_batch"]


def shape(model: str) -> list[int]:
    return [1, 1] if model.endswith("_batch") else [1]


def http_step(
    client: httpclient.InferenceServerClient, model: str, value: int, sequence_id: int, **flags
) -> list[int]:
    tensor = httpclient.InferInput("INPUT", shape(model), "INT32")
    tensor.set_data_from_numpy(np.full(shape(model), value, dtype=np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, **flags)
    assert result.as_numpy("OUTPUT_STATE") is None  # the state stays in the server
    return result.as_numpy("OUTPUT").reshape(-1).tolist()


def grpc_step(
    client: grpcclient.InferenceServerClient, model: str, value: int, sequence_id: int, **flags
) -> list[int]:
    tensor = grpcclient.InferInput("INPUT", shape(model), "INT32")
    tensor.set_data_from_numpy(np.full(shape(model), value, dtype=np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, **flags)
    assert result.as_numpy("OUTPUT_STATE") is None
    return result.as_numpy("OUTPUT").reshape(-1).tolist()


@pytest.mark.parametrize("model", MODELS_SERVED)
def test_interleaved_sequences_keep_separate_sums_over_http(
    server: ServerProcess, model: str
) -> None:
    client = httpclient.InferenceServerClient(server.url)
    first, second = 7001, 7002
    sums = [
        http_step(client, model, 1, first, sequence_start=True),
        http_step(client, model, 10, second, sequence_start=True),
        http_step(client, model, 2, first),
        http_step(client, model, 20, second),
        http_step(client, model, 3, first),
        http_step(client, model, 30, second),
        # A START restarts the sequence's state.
        http_step(client, model, 5, first, sequence_start=True),
        http_step(client, model, 40, second, sequence_end=True),
        http_step(client, model, 6, first, sequence_end=True),
    ]
    assert sums == [[1], [10], [3], [30], [6], [60], [5], [100], [11]]


@pytest.mark.parametrize("model", MODELS_SERVED)
def test_interleaved_sequences_keep_separate_sums_over_grpc(
    server: ServerProcess, model: str
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        first, second = "seq-a", 8002  # a string and a numeric correlation ID
        sums = [
            grpc_step(client, model, 4, first, sequence_start=True),
            grpc_step(client, model, 40, second, sequence_start=True),
            grpc_step(client, model, 5, first),
            grpc_step(client, model, 50, second, sequence_end=True),
            grpc_step(client, model, 6, first, sequence_end=True),
            # The ended sequence's ID starts afresh.
            grpc_step(client, model, 1, second, sequence_start=True, sequence_end=True),
        ]
        assert sums == [[4], [40], [9], [90], [15], [1]]
    finally:
        client.close()


def test_a_sequence_starts_from_the_configured_initial_state(server: ServerProcess) -> None:
    # The state's dims are [-1]; initial_state gives three zeros (without it: one).
    client = httpclient.InferenceServerClient(server.url)
    model = "onnx_state_initial"
    assert http_step(client, model, 2, 9001, sequence_start=True) == [2, 2, 2]
    assert http_step(client, model, 3, 9001, sequence_end=True) == [5, 5, 5]
    model = "onnx_state_file"
    assert http_step(client, model, 1, 9002, sequence_start=True) == [11, 21, 31]
    assert http_step(client, model, 1, 9002, sequence_end=True) == [12, 22, 32]


def test_bad_state_configs_fail_the_load_with_their_reason(server: ServerProcess) -> None:
    # Models load before the server listens: the index is final here.
    index = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
    states = {entry["name"]: entry for entry in index}
    for name in [*MODELS_SERVED, "onnx_state_initial"]:
        assert states[name]["state"] == "READY", states[name]
    expected = {
        "bad_state_no_input_name": "must specify an input_name",
        "bad_state_clash": "input_name is also a model input",
        "bad_state_type": "must specify a data_type",
    }
    for name, reason in expected.items():
        assert states[name]["state"] == "UNAVAILABLE", states[name]
        assert reason in states[name]["reason"], states[name]
