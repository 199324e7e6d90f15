"""What a TensorRT engine declares and a config checked against it: `EngineTensor` and
`EngineSignature`, the `tensorrt.DataType` -> config type table, the load-time validation, the
optimization profiles an instance group may use and the profile a request's shapes run with.

These work from a plain description of the engine, so the rules are testable without TensorRT or
a GPU; reading a live engine into that description is `runtime`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tritonactor._proto.inference import DataType, ModelConfig, ModelInput, ModelOutput
from tritonactor.backends.checks import check_tensor
from tritonactor.core.datatypes import config_to_wire, to_numpy_dtype
from tritonactor.core.errors import invalid_arg, unsupported

Shape = tuple[int, ...]
# One optimization profile's range for one input: (min, opt, max).
ProfileRange = tuple[Shape, Shape, Shape]

# `tensorrt.DataType` member names -> Triton config types. FP8, INT4 and FP4 have no Triton type.
_CONFIG_TYPE_OF_TRT: dict[str, DataType] = {
    "FLOAT": DataType.TYPE_FP32,
    "HALF": DataType.TYPE_FP16,
    "BF16": DataType.TYPE_BF16,
    "INT8": DataType.TYPE_INT8,
    "INT32": DataType.TYPE_INT32,
    "INT64": DataType.TYPE_INT64,
    "BOOL": DataType.TYPE_BOOL,
    "UINT8": DataType.TYPE_UINT8,
}


def config_type(trt_dtype: str) -> DataType | None:
    """The Triton config type of a `tensorrt.DataType` name ("FLOAT" -> TYPE_FP32)."""
    return _CONFIG_TYPE_OF_TRT.get(trt_dtype)


# ---------------------------------------------------------------------------------------------
# What the engine declares


@dataclass(frozen=True, slots=True)
class EngineTensor:
    """One I/O tensor of an engine. `shape` has -1 for dynamic dims; `profiles` holds an input's
    (min, opt, max) shapes, one per optimization profile (empty for outputs)."""

    name: str
    mode: str  # "INPUT" | "OUTPUT"
    dtype: str  # a tensorrt.DataType name: "FLOAT", "HALF", "INT32"...
    shape: Shape
    profiles: tuple[ProfileRange, ...] = ()
    is_shape_tensor: bool = False

    @property
    def has_dynamic_batch_dim(self) -> bool:
        return len(self.shape) > 0 and self.shape[0] == -1


@dataclass(frozen=True, slots=True)
class EngineSignature:
    inputs: dict[str, EngineTensor]
    outputs: dict[str, EngineTensor]
    num_profiles: int

    @classmethod
    def of(cls, tensors: Sequence[EngineTensor], num_profiles: int = 1) -> EngineSignature:
        return cls(
            inputs={t.name: t for t in tensors if t.mode == "INPUT"},
            outputs={t.name: t for t in tensors if t.mode == "OUTPUT"},
            num_profiles=num_profiles,
        )

    def batchable(self) -> bool:
        tensors = [*self.inputs.values(), *self.outputs.values()]
        return bool(tensors) and all(t.has_dynamic_batch_dim for t in tensors)

    def max_batch(self, profile: int | None = None) -> int:
        """The largest first dim every input accepts in `profile` (in any profile when None)."""
        profiles = range(self.num_profiles) if profile is None else [profile]
        best = 0
        for index in profiles:
            limits = [t.profiles[index][2][0] for t in self.inputs.values() if t.profiles]
            if limits:
                best = max(best, min(limits))
        return best


def _tensor_type(model: str, tensor: EngineTensor) -> DataType:
    data_type = config_type(tensor.dtype)
    if data_type is None:
        raise invalid_arg(
            f"model '{model}': TensorRT tensor '{tensor.name}' has type {tensor.dtype}, "
            "which has no Triton data type"
        )
    return data_type


def _numpy_dtype(tensor: EngineTensor) -> np.dtype:
    data_type = config_type(tensor.dtype)
    if data_type is None:
        raise invalid_arg(f"TensorRT tensor '{tensor.name}' has type {tensor.dtype}")
    return to_numpy_dtype(config_to_wire(data_type.name))


# ---------------------------------------------------------------------------------------------
# Load checks


def _validate_tensor(
    model: str, kind: str, entry: ModelInput | ModelOutput, tensor: EngineTensor, batch: int
) -> None:
    if batch > 0 and not tensor.has_dynamic_batch_dim:
        raise invalid_arg(
            f"model '{model}' has max_batch_size {batch} but the engine's {kind} "
            f"'{tensor.name}' has shape {list(tensor.shape)}, without a dynamic first "
            "dimension; set max_batch_size 0"
        )
    data_type = _tensor_type(model, tensor)
    check_tensor(
        model, kind, entry, data_type, tensor.dtype, tensor.shape, batch, "TensorRT engine"
    )


def validate_config(config: ModelConfig, model: str, signature: EngineSignature) -> None:
    """Raise INVALID_ARG (UNSUPPORTED for engine features this backend lacks) unless the
    config describes the engine."""
    batch = config.max_batch_size
    if batch < 0:
        raise invalid_arg(f"model '{model}' has max_batch_size {batch}; it must be >= 0")
    shape_tensors = [t.name for t in signature.inputs.values() if t.is_shape_tensor]
    shape_tensors += [t.name for t in signature.outputs.values() if t.is_shape_tensor]
    if shape_tensors:
        raise unsupported(
            f"model '{model}': the engine has shape tensors {shape_tensors}, which the "
            "tensorrt backend does not support yet"
        )
    for entry in config.input:
        tensor = signature.inputs.get(entry.name)
        if tensor is None:
            raise invalid_arg(
                f"model '{model}' config input '{entry.name}' is not an input of the TensorRT "
                f"engine, whose inputs are {sorted(signature.inputs)}"
            )
        _validate_tensor(model, "input", entry, tensor, batch)
    listed = {entry.name for entry in config.input}
    missing = [name for name in signature.inputs if name not in listed]
    if missing:
        raise invalid_arg(
            f"model '{model}': the TensorRT engine's inputs {missing} are missing from the config"
        )
    for entry in config.output:
        tensor = signature.outputs.get(entry.name)
        if tensor is None:
            raise invalid_arg(
                f"model '{model}' config output '{entry.name}' is not an output of the TensorRT "
                f"engine, whose outputs are {sorted(signature.outputs)}"
            )
        _validate_tensor(model, "output", entry, tensor, batch)
    if batch > 0 and batch > signature.max_batch():
        raise invalid_arg(
            f"model '{model}' has max_batch_size {batch} but no optimization profile of the "
            f"TensorRT engine accepts a batch above {signature.max_batch()}"
        )
    for group in config.instance_group:
        _allowed_profiles(model, group.name, list(group.profile), signature.num_profiles)


def _allowed_profiles(model: str, group: str, profiles: list[str], count: int) -> list[int]:
    """An instance group's `profile` list as indexes; every profile when it names none."""
    if not profiles:
        return list(range(count))
    indexes: list[int] = []
    for text in profiles:
        try:
            index = int(text)
        except ValueError:
            index = -1
        if not 0 <= index < count:
            raise invalid_arg(
                f"model '{model}' instance group '{group}' names optimization profile "
                f"{text!r}; the TensorRT engine has profiles 0 to {count - 1}"
            )
        indexes.append(index)
    return indexes


# ---------------------------------------------------------------------------------------------
# Optimization profiles


def _fits(shape: Shape, limits: ProfileRange) -> bool:
    low, _, high = limits
    return len(shape) == len(low) and all(
        lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True)
    )


def select_profile(
    model: str,
    shapes: Mapping[str, Shape],
    signature: EngineSignature,
    current: int,
    allowed: Sequence[int],
) -> int:
    """The profile to run `shapes` with: `current` when they fit it (switching costs a stream
    sync), else the first allowed profile they fit. INVALID_ARG naming the ranges if none does."""
    order = [current, *(p for p in allowed if p != current)] if current in allowed else allowed
    for profile in order:
        if all(
            _fits(shapes[name], tensor.profiles[profile])
            for name, tensor in signature.inputs.items()
            if tensor.profiles
        ):
            return profile
    given = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    ranges = "; ".join(
        f"profile {p}: "
        + ", ".join(
            f"{name} {list(t.profiles[p][0])}..{list(t.profiles[p][2])}"
            for name, t in signature.inputs.items()
            if t.profiles
        )
        for p in allowed
    )
    raise invalid_arg(
        f"model '{model}': input shapes {given} fit no optimization profile of the TensorRT "
        f"engine ({ranges})"
    )
