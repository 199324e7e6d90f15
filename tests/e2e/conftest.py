"""Shared end-to-end fixtures: a generated model repository and a real server process."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_models import (
    add_sub_model,
    identity_model,
    save_model,
    string_identity_model,
)
from tests.server_process import ServerProcess, start_server

# Every Triton wire datatype; `identity_<name lowercased>` echoes a [batch, 4] tensor of it.
WIRE_DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
    "BF16",
)

SLOW_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {{ name: "STEPS" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
"""

# Triton's add/sub on FP32 [4] without batching, as the ensembles' step.
ADD_SUB_FP32_CONFIG = """
name: "onnx_add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

# `simple`'s tensors (a format string, as SIMPLE_CONFIG is).
SIMPLE_TENSORS = """input [
  {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
"""

SIMPLE_CONFIG = (
    """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
"""
    + SIMPLE_TENSORS
)


def write_config(model_dir: Path, text: str) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text)


def ensemble_config(name: str, step: str, version: int = -1) -> str:
    """An ensemble of one step: `step`'s add/sub (SIMPLE_CONFIG's tensors; `version` -1: the
    latest)."""
    head = f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
    return (
        head
        + SIMPLE_TENSORS.format()
        + f"""ensemble_scheduling {{ step [ {{
  model_name: "{step}" model_version: {version}
  input_map {{ key: "INPUT0" value: "INPUT0" }} input_map {{ key: "INPUT1" value: "INPUT1" }}
  output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} output_map {{ key: "OUTPUT1" value: "OUTPUT1" }}
}} ] }}
"""
    )


def slow_model(path: Path, size: int = 512) -> Path:
    """Y = sum(A @ W @ ... @ W) with STEPS [size, size] matrix products (an INT64 [1] input):
    a few milliseconds a step on one CPU thread, so a request's STEPS sets how long it runs."""
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    w = (rng.random((size, size), dtype=np.float32) / size).astype(np.float32)
    step = helper.make_graph(
        [
            helper.make_node("Identity", ["going_in"], ["going_out"]),
            helper.make_node("MatMul", ["h_in", "W"], ["h_out"]),
        ],
        "step",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("going_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [size, size]),
        ],
        [
            helper.make_tensor_value_info("going_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [size, size]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Squeeze", ["STEPS"], ["steps"]),
            helper.make_node("Loop", ["steps", "", "A"], ["h"], body=step),
            helper.make_node("ReduceSum", ["h"], ["total"], keepdims=0),
            helper.make_node("Reshape", ["total", "one"], ["Y"]),
        ],
        "slow",
        [helper.make_tensor_value_info("STEPS", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
        initializer=[
            numpy_helper.from_array(a, "A"),
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
        ],
    )
    return save_model(graph, path)


def build_repository(root: Path) -> Path:
    """A Triton repository exercising the foundation: batching and non-batching add/sub, a model
    with no config (auto-complete), BYTES and FP16 identities, several versions, a broken model,
    an identity (no config) for every wire datatype, and a slow model with one and two
    instances."""
    repo = root / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))

    add_sub_model(repo / "simple_nobatch" / "1" / "model.onnx", batch=False)
    write_config(
        repo / "simple_nobatch", SIMPLE_CONFIG.format(name="simple_nobatch", max_batch_size=0)
    )

    add_sub_model(repo / "autocomplete" / "1" / "model.onnx", datatype="FP32")

    string_identity_model(repo / "strings" / "1" / "model.onnx")
    identity_model(repo / "half" / "1" / "model.onnx", "FP16", ["batch", 4])
    # Raw binary requests: one variable dimension to deduce, and a BYTES input of one element.
    identity_model(repo / "variable_fp32" / "1" / "model.onnx", "FP32", ["batch", "n"])
    identity_model(repo / "variable_2d" / "1" / "model.onnx", "FP32", ["batch", "n", "m"])
    string_identity_model(repo / "one_string" / "1" / "model.onnx", ("batch", 1))

    for version in (1, 2, 3):
        add_sub_model(repo / "versioned" / str(version) / "model.onnx")
    write_config(
        repo / "versioned",
        SIMPLE_CONFIG.format(name="versioned", max_batch_size=8)
        + "version_policy { specific { versions: [1, 3] } }\n",
    )

    add_sub_model(repo / "two_instances" / "1" / "model.onnx")
    write_config(
        repo / "two_instances",
        SIMPLE_CONFIG.format(name="two_instances", max_batch_size=8)
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n",
    )

    for datatype in WIRE_DATATYPES:
        path = repo / f"identity_{datatype.lower()}" / "1" / "model.onnx"
        identity_model(path, datatype, ["batch", 4])

    for name, count in (("slow_one", 1), ("slow_two", 2)):
        slow_model(repo / name / "1" / "model.onnx")
        write_config(repo / name, SLOW_CONFIG.format(name=name, count=count))

    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    write_config(repo / "broken", 'name: "broken"\nplatform: "onnxruntime_onnx"\n')
    return repo


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="session")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the read-mostly tests. Not ready by design (it has a broken model), so it
    waits for liveness and then for the good models."""
    process = start_server(
        [repository],
        tmp_path_factory.mktemp("server"),
        {"TRITONACTOR_EXIT_ON_ERROR": "false"},
        wait_ready=False,
    )
    yield process
    process.stop()


def gated_order_repository(root: Path, instances: int = 1) -> tuple[Path, Path]:
    """A repository with the python model `gated_order` (tests/python_models) and `instances`
    instances; returns it and the gate file whose existence lets a "block" request go on."""
    repo, gate = root / "repo", root / "gate"
    shutil.copytree(
        Path(__file__).resolve().parent.parent / "python_models" / "gated_order",
        repo / "gated_order",
    )
    config = repo / "gated_order" / "config.pbtxt"
    text = config.read_text().replace('string_value: ""', f'string_value: "{gate}"')
    config.write_text(text.replace("count: 1", f"count: {instances}"))
    return repo, gate
