"""Small ONNX models for tests, written with `onnx.helper`.

Every builder writes one model file and returns its path. Shapes are sequences whose entries are an
int (a fixed dim), a str (a symbolic dim, e.g. "batch") or None (an unnamed dynamic dim). Element
types are given by their Triton wire names ("FP32", "INT32", "BYTES"...), see `onnx_type`.

    add_sub_model(tmp_path / "simple/1/model.onnx")             # OUTPUT0 = a + b, OUTPUT1 = a - b
    identity_model(path, "FP16", ["batch", 4])
    string_identity_model(path)
    add_constant_model(path / "model.onnx", [1, 2, 3], external_data=True)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "IR_VERSION",
    "OPSET",
    "Dim",
    "add_constant_model",
    "add_sub_model",
    "identity_model",
    "onnx_type",
    "save_model",
    "string_identity_model",
]

# What onnxruntime 1.18+ reads; kept low so any supported onnxruntime can load the files.
OPSET = 17
IR_VERSION = 8

Dim = int | str | None

_ONNX_TYPES: dict[str, int] = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
    "BF16": TensorProto.BFLOAT16,
}


def onnx_type(datatype: str | int) -> int:
    """The `onnx.TensorProto` element type for a Triton wire name ("FP32" -> FLOAT);
    an int is taken as already being one."""
    if isinstance(datatype, int):
        return datatype
    return _ONNX_TYPES[datatype]


def save_model(graph: onnx.GraphProto, path: Path | str, *, external_data: bool = False) -> Path:
    """Wrap `graph` in a model at OPSET / IR_VERSION, check it, write it to `path` (creating
    folders). With `external_data`, initializers go to `weights.bin` beside the model file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="tritonactor-tests",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    if external_data:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="weights.bin",
            size_threshold=0,
        )
    else:
        onnx.save_model(model, str(path))
    return path


def add_sub_model(
    path: Path | str,
    datatype: str | int = "INT32",
    dims: Sequence[Dim] = (16,),
    *,
    batch: bool = True,
    inputs: tuple[str, str] = ("INPUT0", "INPUT1"),
    outputs: tuple[str, str] = ("OUTPUT0", "OUTPUT1"),
) -> Path:
    """Triton's classic `simple` model: outputs[0] = a + b, outputs[1] = a - b.

    Every tensor has shape `dims`, behind a dynamic "batch" dim when `batch` is true. Dynamic
    `dims` with `batch=False` make a model whose two inputs can disagree in length, which
    onnxruntime rejects at run time (a handy way to fail one request)."""
    element = onnx_type(datatype)
    shape = ["batch", *dims] if batch else list(dims)
    a, b = inputs
    total, difference = outputs
    graph = helper.make_graph(
        [
            helper.make_node("Add", [a, b], [total]),
            helper.make_node("Sub", [a, b], [difference]),
        ],
        "add_sub",
        [helper.make_tensor_value_info(name, element, shape) for name in inputs],
        [helper.make_tensor_value_info(name, element, shape) for name in outputs],
    )
    return save_model(graph, path)


def identity_model(
    path: Path | str,
    datatype: str | int,
    shape: Sequence[Dim],
    *,
    input_name: str = "INPUT0",
    output_name: str = "OUTPUT0",
) -> Path:
    """output = input, both of `datatype` and `shape` (the full ONNX shape, batch dim included)."""
    element = onnx_type(datatype)
    graph = helper.make_graph(
        [helper.make_node("Identity", [input_name], [output_name])],
        "identity",
        [helper.make_tensor_value_info(input_name, element, list(shape))],
        [helper.make_tensor_value_info(output_name, element, list(shape))],
    )
    return save_model(graph, path)


def string_identity_model(
    path: Path | str,
    shape: Sequence[Dim] = ("batch", "n"),
    *,
    input_name: str = "INPUT0",
    output_name: str = "OUTPUT0",
) -> Path:
    """A string (Triton BYTES / TYPE_STRING) identity; by default batchable with a variable
    second dim, so auto-complete gives max_batch_size 4 and dims [-1]."""
    return identity_model(path, "BYTES", shape, input_name=input_name, output_name=output_name)


def add_constant_model(
    path: Path | str,
    constant: Sequence[float],
    *,
    batch: bool = True,
    external_data: bool = False,
    input_name: str = "INPUT0",
    output_name: str = "OUTPUT0",
) -> Path:
    """FP32 output = input + `constant` (an initializer of shape [len(constant)]).

    With `external_data` the constant lives in `weights.bin` beside the model file: write it to
    `<version>/model.onnx/model.onnx` to build Triton's "model.onnx is a folder" layout."""
    values = np.asarray(constant, dtype=np.float32)
    shape: list[Dim] = ["batch", len(values)] if batch else [len(values)]
    graph = helper.make_graph(
        [helper.make_node("Add", [input_name, "constant"], [output_name])],
        "add_constant",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(values, "constant")],
    )
    return save_model(graph, path, external_data=external_data)


def reshape_model(path: Path | str) -> Path:
    """FP32 Y = reshape(X, [-1, 4]), X of shape [batch, n]: a row that is not 4 wide passes the
    config's dims [-1] and fails in onnxruntime, at execution."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X", "shape"], ["Y"])],
        "reshape",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", None])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(np.array([-1, 4], dtype=np.int64), "shape")],
    )
    return save_model(graph, path)
