"""The TensorRT backend: a serialized TensorRT 10 engine (`model.plan`) run through the
name-based tensor API (`set_input_shape`, `set_tensor_address`, `execute_async_v3`).

`tensorrt` and `torch` are imported only when a plan model loads. torch provides the CUDA side:
device selection, one stream per instance, device buffers and the copies to and from them; it is
already in the gpu extra, so no second CUDA binding is needed.

What the engine declares is read once into an `EngineSignature`, a plain description that
auto-complete, load checks and optimization-profile selection work from, so those rules are
testable without TensorRT or a GPU.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonactor._proto.inference import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
)
from tritonactor.backends.autocomplete import complete_batching, complete_tensors
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
    undo_reshape,
    version_file,
)
from tritonactor.backends.checks import check_tensor
from tritonactor.core.datatypes import config_to_wire, to_numpy_dtype
from tritonactor.core.devices import gpu_count
from tritonactor.core.errors import TritonError, internal, invalid_arg, unavailable, unsupported
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor

__all__ = [
    "EngineSignature",
    "EngineTensor",
    "TensorRTBackend",
    "complete_config",
    "config_type",
    "select_profile",
    "unavailable_message",
    "validate_config",
]

log = logging.getLogger(__name__)

PLATFORM = "tensorrt_plan"
MODEL_FILENAME = "model.plan"

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
# Why a plan cannot load here

_NEEDS = (
    "the tensorrt backend needs an NVIDIA GPU and the tensorrt package "
    "(pip install 'tritonactor[gpu]')"
)


def unavailable_message(model: str, problems: Sequence[str]) -> str:
    return f"model '{model}': {_NEEDS}; {' and '.join(problems)}"


def _gpu_runtime(model: str) -> tuple[Any, Any]:
    """The `tensorrt` and `torch` modules, or UNAVAILABLE naming what this machine lacks."""
    problems: list[str] = []
    if gpu_count() == 0:
        problems.append("this machine has no CUDA device")
    trt: Any = None
    try:
        import tensorrt as trt
    except ImportError:
        problems.append("the tensorrt package is not installed")
    except Exception as exc:  # installed, but its CUDA libraries do not load
        problems.append(f"the tensorrt package cannot be imported ({type(exc).__name__}: {exc})")
    if problems:
        raise unavailable(unavailable_message(model, problems))
    try:
        import torch
    except ImportError:
        raise unavailable(
            unavailable_message(model, ["torch, which it uses for CUDA memory, is not installed"])
        ) from None
    if not torch.cuda.is_available():
        raise unavailable(
            unavailable_message(model, [f"torch {torch.__version__} cannot use CUDA here"])
        )
    return trt, torch


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


def _enum_name(value: Any) -> str:
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value).rsplit(".", 1)[-1]


def _describe(engine: Any, trt: Any) -> EngineSignature:
    tensors: list[EngineTensor] = []
    num_profiles = int(engine.num_optimization_profiles)
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        is_shape_tensor = bool(engine.is_shape_inference_io(name))  # TensorRT >= 10
        profiles: tuple[ProfileRange, ...] = ()
        if is_input and not is_shape_tensor:
            profiles = tuple(
                _profile_range(engine.get_tensor_profile_shape(name, p))
                for p in range(num_profiles)
            )
        tensors.append(
            EngineTensor(
                name=name,
                mode="INPUT" if is_input else "OUTPUT",
                dtype=_enum_name(engine.get_tensor_dtype(name)),
                shape=tuple(int(d) for d in engine.get_tensor_shape(name)),
                profiles=profiles,
                is_shape_tensor=is_shape_tensor,
            )
        )
    return EngineSignature.of(tensors, num_profiles)


def _profile_range(shapes: Sequence[Any]) -> ProfileRange:
    low, opt, high = (tuple(int(d) for d in shape) for shape in shapes)
    return low, opt, high


# ---------------------------------------------------------------------------------------------
# Auto-complete


def _tensor_type(model: str, tensor: EngineTensor) -> DataType:
    data_type = config_type(tensor.dtype)
    if data_type is None:
        raise invalid_arg(
            f"model '{model}': TensorRT tensor '{tensor.name}' has type {tensor.dtype}, "
            "which has no Triton data type"
        )
    return data_type


def complete_config(config: ModelConfig, signature: EngineSignature) -> ModelConfig:
    """A copy of `config` with inputs, outputs, types, dims and max_batch_size filled from the
    engine. A config that lists no tensors, on an engine whose every tensor has a dynamic first
    dim, gets max_batch_size from profile 0's largest first dim, and the dynamic batcher."""
    completed = ModelConfig.parse(bytes(config))
    model = completed.name
    if signature.batchable():
        complete_batching(completed, signature.max_batch(0))
    batching = completed.max_batch_size > 0
    for listed, tensors, factory in (
        (completed.input, signature.inputs, ModelInput),
        (completed.output, signature.outputs, ModelOutput),
    ):
        complete_tensors(
            listed,
            {name: tensor.shape for name, tensor in tensors.items()},
            lambda name, tensors=tensors: _tensor_type(model, tensors[name]),
            batching,
            factory,
        )
    if not completed.backend:
        completed.backend = TensorRTBackend.name
    if not completed.platform:
        completed.platform = PLATFORM
    return completed


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


# ---------------------------------------------------------------------------------------------
# The backend


class TensorRTBackend(Backend):
    name = "tensorrt"
    platforms = (PLATFORM,)
    default_model_filename = MODEL_FILENAME

    def auto_complete_config(self, config: ModelConfig, version_dir: Path) -> ModelConfig:
        trt, torch = _gpu_runtime(config.name)
        path = version_file(version_dir, config.default_model_filename or MODEL_FILENAME)
        loaded = _load_engine(config.name, path, trt, torch, device=0)
        return complete_config(config, loaded.signature)

    def load_model(self, context: ModelContext) -> TensorRTModel:
        trt, torch = _gpu_runtime(context.name)
        device = next((g.gpus[0] for g in context.config.instance_group if g.gpus), 0)
        loaded = _load_engine(context.name, context.model_path, trt, torch, device)
        validate_config(context.config, context.name, loaded.signature)
        return TensorRTModel(context, trt, torch, {device: loaded})


@dataclass(slots=True)
class _LoadedEngine:
    logger: Any  # TensorRT keeps only a pointer to it: it must outlive the runtime
    runtime: Any  # must outlive the engine it deserialized
    engine: Any
    signature: EngineSignature


def _load_engine(model: str, path: Path, trt: Any, torch: Any, device: int) -> _LoadedEngine:
    if not path.is_file():
        raise invalid_arg(f"model '{model}': no TensorRT plan file at {path}")
    logger = _logger(trt)
    with torch.cuda.device(device):
        runtime = trt.Runtime(logger)
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        detail = "; ".join(logger.errors) or "TensorRT gave no reason"
        raise invalid_arg(
            f"model '{model}': TensorRT {trt.__version__} cannot deserialize {path} on GPU "
            f"{device} (an engine runs only on the TensorRT version and GPU kind that built "
            f"it): {detail}"
        )
    return _LoadedEngine(logger, runtime, engine, _describe(engine, trt))


def _logger(trt: Any) -> Any:
    """A TensorRT logger that forwards to `logging` and keeps the errors for load messages."""

    class Logger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(msg)
                log.error("TensorRT: %s", msg)
            elif severity == trt.ILogger.Severity.WARNING:
                log.warning("TensorRT: %s", msg)
            else:
                log.debug("TensorRT: %s", msg)

    return Logger()


class TensorRTModel(BackendModel):
    """A validated engine; deserialized once per GPU its instances run on."""

    def __init__(
        self, context: ModelContext, trt: Any, torch: Any, engines: dict[int, _LoadedEngine]
    ) -> None:
        self.context = context
        self._trt = trt
        self._torch = torch
        self._engines = engines
        self._lock = threading.Lock()

    def _engine(self, device: int) -> _LoadedEngine:
        with self._lock:
            loaded = self._engines.get(device)
            if loaded is None:
                loaded = _load_engine(
                    self.context.name, self.context.model_path, self._trt, self._torch, device
                )
                self._engines[device] = loaded
            return loaded

    def create_instance(self, context: InstanceContext) -> TensorRTInstance:
        model = self.context.name
        if context.kind != "KIND_GPU":
            raise invalid_arg(
                f"model '{model}' instance '{context.name}' is {context.kind}; the tensorrt "
                "backend runs only KIND_GPU instances"
            )
        torch = self._torch
        if not 0 <= context.device_id < torch.cuda.device_count():
            raise unavailable(
                f"model '{model}' instance '{context.name}' wants GPU {context.device_id}; "
                f"torch sees {torch.cuda.device_count()}"
            )
        loaded = self._engine(context.device_id)
        group = next(
            (g for g in self.context.config.instance_group if g.name == context.group), None
        )
        allowed = _allowed_profiles(
            model,
            context.group,
            list(group.profile) if group is not None else [],
            loaded.signature.num_profiles,
        )
        with torch.cuda.device(context.device_id):
            execution = loaded.engine.create_execution_context()
            if execution is None:
                raise internal(
                    f"model '{model}' instance '{context.name}': TensorRT could not create an "
                    f"execution context on GPU {context.device_id} (out of GPU memory?)"
                )
            stream = torch.cuda.Stream(device=context.device_id)
        return TensorRTInstance(self.context, loaded, execution, stream, torch, allowed, context)

    def finalize(self) -> None:
        with self._lock:
            self._engines.clear()


# ---------------------------------------------------------------------------------------------
# Execution


@dataclass(frozen=True, slots=True)
class _InputPlan:
    name: str
    dtype: np.dtype
    reshape: Shape | None  # the per-item shape the engine wants when the config reshapes


@dataclass(frozen=True, slots=True)
class _OutputPlan:
    name: str
    datatype: str  # wire name
    dtype: np.dtype
    dims: Shape | None  # the per-item shape the client sees when the config reshapes


class TensorRTInstance(BackendInstance):
    """One execution context and CUDA stream on one GPU; runs one request at a time."""

    def __init__(
        self,
        context: ModelContext,
        loaded: _LoadedEngine,
        execution: Any,
        stream: Any,
        torch: Any,
        allowed_profiles: list[int],
        instance: InstanceContext,
    ) -> None:
        config = context.config
        self.model_name = context.name
        self.model_version = str(context.version)
        self._loaded: _LoadedEngine | None = loaded
        self._execution: Any = execution
        self._stream = stream
        self._torch = torch
        self._device = instance.device_id
        self._allowed = allowed_profiles
        self._profile = 0  # a new execution context starts on profile 0
        self._batching = config.max_batch_size > 0
        signature = loaded.signature
        self._inputs = [
            _InputPlan(
                name=t.name,
                dtype=_numpy_dtype(signature.inputs[t.name]),
                reshape=tuple(t.reshape.shape) if t.reshape is not None else None,
            )
            for t in config.input
        ]
        listed = {t.name: t for t in config.output}
        self._outputs: dict[str, _OutputPlan] = {}
        for name, tensor in signature.outputs.items():
            entry = listed.get(name)
            self._outputs[name] = _OutputPlan(
                name=name,
                datatype=config_to_wire(DataType(_tensor_type(context.name, tensor)).name),
                dtype=_numpy_dtype(tensor),
                dims=tuple(entry.dims) if entry is not None and entry.reshape is not None else None,
            )
        self._default_outputs = list(listed) or list(signature.outputs)

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        return [self._execute_one(request) for request in requests]

    def finalize(self) -> None:
        self._execution = None
        self._loaded = None

    def _execute_one(self, request: InferenceRequest) -> Result:
        if self._execution is None or self._loaded is None:
            return unavailable(f"model '{self.model_name}' instance is finalized")
        try:
            feeds = self._feeds(request)
            names = request.requested_output_names or self._default_outputs
            unknown = [name for name in names if name not in self._outputs]
            if unknown:
                raise invalid_arg(
                    f"model '{self.model_name}' has no output {unknown[0]!r}; its outputs are "
                    f"{sorted(self._outputs)}"
                )
            arrays = self._run(self._loaded.signature, feeds)
            outputs = [self._output(name, arrays[name]) for name in names]
        except TritonError as exc:
            return exc
        except Exception as exc:
            return internal(
                f"TensorRT error running model '{self.model_name}' version "
                f"{self.model_version}: {type(exc).__name__}: {exc}"
            )
        return InferenceResponse(
            model_name=self.model_name,
            model_version=self.model_version,
            id=request.id,
            outputs=outputs,
        )

    def _feeds(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        feeds: dict[str, np.ndarray] = {}
        for plan in self._inputs:
            tensor = request.input(plan.name)
            if tensor is None:
                raise invalid_arg(
                    f"model '{self.model_name}' request is missing input '{plan.name}'"
                )
            data = tensor.data
            if data.dtype != plan.dtype:
                raise invalid_arg(
                    f"model '{self.model_name}' input '{plan.name}' has numpy type {data.dtype}; "
                    f"the engine takes {plan.dtype}"
                )
            if plan.reshape is not None:
                lead = data.shape[:1] if self._batching else ()
                try:
                    data = data.reshape(lead + plan.reshape)
                except ValueError:
                    raise invalid_arg(
                        f"model '{self.model_name}' input '{plan.name}' of shape "
                        f"{list(data.shape)} cannot take the config's reshape {list(plan.reshape)}"
                    ) from None
            feeds[plan.name] = np.ascontiguousarray(data)
        return feeds

    def _run(
        self, signature: EngineSignature, feeds: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        torch = self._torch
        execution = self._execution
        shapes = {name: tuple(int(d) for d in data.shape) for name, data in feeds.items()}
        profile = select_profile(self.model_name, shapes, signature, self._profile, self._allowed)
        stream = self._stream
        with torch.cuda.device(self._device), torch.cuda.stream(stream):
            if profile != self._profile:
                if not execution.set_optimization_profile_async(profile, stream.cuda_stream):
                    raise internal(
                        f"model '{self.model_name}': TensorRT could not switch to optimization "
                        f"profile {profile}"
                    )
                self._profile = profile
            keep: list[Any] = []  # device buffers live until the stream is synchronized
            for name, data in feeds.items():
                if not execution.set_input_shape(name, shapes[name]):
                    raise invalid_arg(
                        f"model '{self.model_name}': TensorRT rejects shape {list(shapes[name])} "
                        f"for input '{name}'"
                    )
                buffer, host = _device_bytes(torch, data, self._device)
                keep.append((buffer, host))
                self._bind(name, buffer)
            results: dict[str, tuple[Any, Shape, np.dtype]] = {}
            for name, plan in self._outputs.items():
                shape = tuple(int(d) for d in execution.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise unsupported(
                        f"model '{self.model_name}' output '{name}' has a data-dependent shape "
                        f"{list(shape)}, which the tensorrt backend does not support yet"
                    )
                size = int(np.prod(shape, dtype=np.int64)) * plan.dtype.itemsize
                buffer = torch.empty(max(size, 1), dtype=torch.uint8, device=self._device)
                self._bind(name, buffer)
                results[name] = (buffer[:size], shape, plan.dtype)
            if not execution.execute_async_v3(stream.cuda_stream):
                raise internal(
                    f"model '{self.model_name}': TensorRT execute_async_v3 failed for input "
                    f"shapes {shapes}"
                )
            stream.synchronize()
            arrays = {
                name: buffer.cpu().numpy().view(dtype).reshape(shape)
                for name, (buffer, shape, dtype) in results.items()
            }
        del keep
        return arrays

    def _bind(self, name: str, buffer: Any) -> None:
        if not self._execution.set_tensor_address(name, buffer.data_ptr()):
            raise internal(
                f"model '{self.model_name}': TensorRT refused the device buffer for tensor '{name}'"
            )

    def _output(self, name: str, array: np.ndarray) -> Tensor:
        plan = self._outputs[name]
        array = undo_reshape(self.model_name, name, array, plan.dims, self._batching)
        return Tensor(name=name, datatype=plan.datatype, shape=tuple(array.shape), data=array)


def _numpy_dtype(tensor: EngineTensor) -> np.dtype:
    data_type = config_type(tensor.dtype)
    if data_type is None:
        raise invalid_arg(f"TensorRT tensor '{tensor.name}' has type {tensor.dtype}")
    return to_numpy_dtype(config_to_wire(data_type.name))


def _device_bytes(torch: Any, data: np.ndarray, device: int) -> tuple[Any, Any]:
    """`data`'s bytes in a new buffer on `device`, copied on the current stream from a pinned
    host buffer; both must live until that stream is synchronized."""
    raw = data.reshape(-1).view(np.uint8)
    if raw.size == 0:
        return torch.empty(1, dtype=torch.uint8, device=device), None
    # A copy torch owns: request data is often a read-only view of the wire buffer.
    host = torch.empty(raw.size, dtype=torch.uint8, pin_memory=True)
    host.numpy()[:] = raw
    return host.to(device, non_blocking=True), host
