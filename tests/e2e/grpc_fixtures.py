"""Model repositories and servers for the gRPC end-to-end tests.

`grpc_server` serves a healthy repository (every model loads, so it is ready and health says
SERVING); `grpc_broken_server` serves one with a model that cannot load (NOT_SERVING).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_models import add_sub_model, identity_model, save_model, string_identity_model
from tests.server_process import ServerProcess, start_server

SIMPLE_CONFIG = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""

# One identity config for every type: INPUT0 -> OUTPUT0, dims as given.
IDENTITY_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: {data_type} dims: {dims} }} ]
output [ {{ name: "OUTPUT0" data_type: {data_type} dims: {dims} }} ]
"""


SLOW_CONFIG = """
name: "slow"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def slow_model(path: Path, products: int = 8, size: int = 384) -> Path:
    """Y = X + sum((X * A) @ W @ ... @ W), `products` matrix products of [size, size] on one thread:
    some tens of milliseconds a request, so that requests queue up behind each other."""
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    w = (rng.random((size, size), dtype=np.float32) / size).astype(np.float32)
    # Scaling A by X first keeps onnxruntime from folding the whole graph into a constant.
    nodes = [helper.make_node("Mul", ["A", "X"], ["h"])]
    nodes += [
        helper.make_node("MatMul", ["h" if i == 0 else f"h{i - 1}", "W"], [f"h{i}"])
        for i in range(products)
    ]
    nodes += [
        helper.make_node("ReduceSum", [f"h{products - 1}"], ["total"], keepdims=0),
        helper.make_node("Reshape", ["total", "one"], ["flat"]),
        helper.make_node("Add", ["X", "flat"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
        initializer=[
            numpy_helper.from_array(a, "A"),
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
        ],
    )
    return save_model(graph, path)


def _write_config(model_dir: Path, text: str) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text)


def build_grpc_repository(root: Path) -> Path:
    """simple (INT32 add/sub, batch <= 8), decoupled (the same, decoupled), strings (BYTES
    identity), half (FP16 identity, [batch, 4]), big (FP32 identity of any length, no batching:
    for large messages) and slow (tens of milliseconds a request)."""
    repo = root / "grpc_models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    _write_config(repo / "simple", SIMPLE_CONFIG)

    string_identity_model(repo / "strings" / "1" / "model.onnx")
    _write_config(
        repo / "strings",
        IDENTITY_CONFIG.format(
            name="strings", max_batch_size=8, data_type="TYPE_STRING", dims="[ -1 ]"
        ),
    )

    identity_model(repo / "half" / "1" / "model.onnx", "FP16", ["batch", 4])
    _write_config(
        repo / "half",
        IDENTITY_CONFIG.format(name="half", max_batch_size=8, data_type="TYPE_FP16", dims="[ 4 ]"),
    )

    identity_model(repo / "big" / "1" / "model.onnx", "FP32", [None])
    _write_config(
        repo / "big",
        IDENTITY_CONFIG.format(name="big", max_batch_size=0, data_type="TYPE_FP32", dims="[ -1 ]"),
    )

    slow_model(repo / "slow" / "1" / "model.onnx")
    _write_config(repo / "slow", SLOW_CONFIG)

    # A decoupled model that happens to answer each request once: enough to prove which
    # front ends accept decoupled models.
    add_sub_model(repo / "decoupled" / "1" / "model.onnx")
    _write_config(
        repo / "decoupled",
        SIMPLE_CONFIG.replace('name: "simple"', 'name: "decoupled"')
        + "model_transaction_policy { decoupled: true }\n",
    )
    return repo


def build_broken_repository(root: Path) -> Path:
    """simple beside a model whose file is not ONNX: the server stays live but never ready."""
    repo = root / "grpc_broken_models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    _write_config(repo / "simple", SIMPLE_CONFIG)
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    _write_config(repo / "broken", 'name: "broken"\nplatform: "onnxruntime_onnx"\n')
    return repo


@pytest.fixture(scope="session")
def grpc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("grpc")
    process = start_server([build_grpc_repository(root)], root)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def grpc_broken_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("grpc_broken")
    process = start_server(
        [build_broken_repository(root)],
        root,
        {"TRITONACTOR_EXIT_ON_ERROR": "false"},
        wait_ready=False,
    )
    yield process
    process.stop()
