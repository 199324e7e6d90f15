"""What an ONNX model declares and a config checked against it: the model's inputs, outputs and
overridable initializers with their element types and shapes, the dims auto-complete takes from
them, the tensors the sequence batcher feeds and takes back, and the load-time validation.

The model's own signature (names, element types, shapes) is read through onnxruntime, so the
`onnx` package is never needed at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from tritonactor._proto.inference import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
)
from tritonactor.backends.checks import check_tensor
from tritonactor.backends.onnxruntime.session import _CPU
from tritonactor.core.errors import invalid_arg

MODEL_FILENAME = "model.onnx"

_CONFIG_TYPE_OF_ONNX: dict[str, DataType] = {
    "tensor(bool)": DataType.TYPE_BOOL,
    "tensor(uint8)": DataType.TYPE_UINT8,
    "tensor(uint16)": DataType.TYPE_UINT16,
    "tensor(uint32)": DataType.TYPE_UINT32,
    "tensor(uint64)": DataType.TYPE_UINT64,
    "tensor(int8)": DataType.TYPE_INT8,
    "tensor(int16)": DataType.TYPE_INT16,
    "tensor(int32)": DataType.TYPE_INT32,
    "tensor(int64)": DataType.TYPE_INT64,
    "tensor(float16)": DataType.TYPE_FP16,
    "tensor(float)": DataType.TYPE_FP32,
    "tensor(double)": DataType.TYPE_FP64,
    "tensor(string)": DataType.TYPE_STRING,
    "tensor(bfloat16)": DataType.TYPE_BF16,
}


# ---------------------------------------------------------------------------------------------
# What the ONNX model declares


@dataclass(frozen=True, slots=True)
class _TensorSpec:
    """One input or output as the ONNX model declares it; a `None` dim is dynamic."""

    name: str
    onnx_type: str
    shape: tuple[int | None, ...]

    @property
    def data_type(self) -> DataType | None:
        return _CONFIG_TYPE_OF_ONNX.get(self.onnx_type)

    @property
    def has_dynamic_batch_dim(self) -> bool:
        return len(self.shape) > 0 and self.shape[0] is None


@dataclass(frozen=True, slots=True)
class _Signature:
    inputs: dict[str, _TensorSpec]
    outputs: dict[str, _TensorSpec]
    # Initializers that are also graph inputs: a config may feed them, a request need not.
    overridable: dict[str, _TensorSpec]

    def batchable(self) -> bool:
        tensors = [*self.inputs.values(), *self.outputs.values()]
        return bool(tensors) and all(t.has_dynamic_batch_dim for t in tensors)


def _spec(arg: Any) -> _TensorSpec:
    # onnxruntime reports a symbolic dim as its name and an unknown one as None.
    shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in (arg.shape or ()))
    return _TensorSpec(arg.name, arg.type, shape)


def _onnx_file(model_path: Path) -> Path:
    """The ONNX file to open: Triton lets `model.onnx` be a folder holding `model.onnx` beside
    its external data files."""
    path = model_path / MODEL_FILENAME if model_path.is_dir() else model_path
    if not path.is_file():
        raise invalid_arg(f"no ONNX model file at {path}")
    return path


def _read_signature(path: Path) -> _Signature:
    options = ort.SessionOptions()
    # Only the signature is wanted: skip optimizing a graph that is thrown away.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=[_CPU])
    except Exception as exc:
        raise invalid_arg(f"cannot read ONNX model {path}: {exc}") from None
    return _Signature(
        inputs={a.name: _spec(a) for a in session.get_inputs()},
        outputs={a.name: _spec(a) for a in session.get_outputs()},
        overridable={a.name: _spec(a) for a in session.get_overridable_initializers()},
    )


def _config_type(model: str, spec: _TensorSpec) -> DataType:
    data_type = spec.data_type
    if data_type is None:
        raise invalid_arg(
            f"model '{model}': ONNX tensor '{spec.name}' has type {spec.onnx_type}, "
            "which has no Triton data type"
        )
    return data_type


# ---------------------------------------------------------------------------------------------
# Auto-complete


def _shapes(tensors: Mapping[str, _TensorSpec]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(-1 if d is None else d for d in t.shape) for name, t in tensors.items()}


# ---------------------------------------------------------------------------------------------
# Load-time validation


def _validate_tensor(
    model: str,
    kind: str,
    tensor: ModelInput | ModelOutput,
    spec: _TensorSpec,
    max_batch_size: int,
) -> None:
    if max_batch_size > 0:
        if not spec.shape:
            raise invalid_arg(
                f"model '{model}' has max_batch_size {max_batch_size} but the ONNX model's "
                f"{kind} '{tensor.name}' is a scalar with no batch dimension; "
                "set max_batch_size 0"
            )
        if spec.shape[0] is not None:
            raise invalid_arg(
                f"model '{model}' has max_batch_size {max_batch_size} but the ONNX model's "
                f"{kind} '{tensor.name}' has a fixed first dimension {spec.shape[0]}; "
                "set max_batch_size 0"
            )
    data_type = _config_type(model, spec)
    check_tensor(
        model, kind, tensor, data_type, spec.onnx_type, spec.shape, max_batch_size, "ONNX model"
    )


def _validate(config: ModelConfig, model: str, signature: _Signature) -> None:
    max_batch_size = config.max_batch_size
    if max_batch_size < 0:
        raise invalid_arg(f"model '{model}' has max_batch_size {max_batch_size}; it must be >= 0")
    _validate_states(config, model, signature)
    feedable = {**signature.overridable, **signature.inputs}
    for tensor in config.input:
        spec = feedable.get(tensor.name)
        if spec is None:
            raise invalid_arg(
                f"model '{model}' config input '{tensor.name}' is not an input of the ONNX "
                f"model, whose inputs are {sorted(signature.inputs)}"
            )
        _validate_tensor(model, "input", tensor, spec, max_batch_size)
    fed, _ = _sequence_tensors(config)
    listed = {tensor.name for tensor in config.input} | fed
    missing = [name for name in signature.inputs if name not in listed]
    if missing:
        raise invalid_arg(
            f"model '{model}': the ONNX model's inputs {missing} are missing from the config"
        )
    for tensor in config.output:
        spec = signature.outputs.get(tensor.name)
        if spec is None:
            raise invalid_arg(
                f"model '{model}' config output '{tensor.name}' is not an output of the ONNX "
                f"model, whose outputs are {sorted(signature.outputs)}"
            )
        _validate_tensor(model, "output", tensor, spec, max_batch_size)


def _sequence_tensors(config: ModelConfig) -> tuple[set[str], set[str]]:
    """The inputs the sequence batcher feeds (control and implicit-state inputs) and the state
    outputs it takes back; none without `sequence_batching`."""
    batching = config.sequence_batching
    if batching is None:
        return set(), set()
    fed = {control.name for control in batching.control_input}
    fed |= {state.input_name for state in batching.state}
    return fed, {state.output_name for state in batching.state}


def _validate_states(config: ModelConfig, model: str, signature: _Signature) -> None:
    """Each implicit state must be an input and an output of the graph, of the state's type."""
    batching = config.sequence_batching
    for state in batching.state if batching is not None else ():
        for kind, name, specs in (
            ("input", state.input_name, signature.inputs),
            ("output", state.output_name, signature.outputs),
        ):
            spec = specs.get(name)
            if spec is None:
                raise invalid_arg(
                    f"model '{model}': state {kind} '{name}' is not an {kind} of the ONNX "
                    f"model, whose {kind}s are {sorted(specs)}"
                )
            if _config_type(model, spec) != state.data_type:
                raise invalid_arg(
                    f"model '{model}': state {kind} '{name}' has data type "
                    f"{DataType(state.data_type).name} in the config but {spec.onnx_type} in "
                    "the ONNX model"
                )
