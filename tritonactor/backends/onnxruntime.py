"""The ONNX Runtime backend: one `onnxruntime.InferenceSession` per model instance.

The model's own signature (names, element types, shapes) is read through onnxruntime, so the
`onnx` package is never needed at run time.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort

from tritonactor._proto.inference import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
)
from tritonactor.backends import batching
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
from tritonactor.core.datatypes import config_to_wire, from_numpy_dtype
from tritonactor.core.errors import TritonError, internal, invalid_arg, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeInstance", "OnnxRuntimeModel"]

log = logging.getLogger(__name__)

PLATFORM = "onnxruntime_onnx"
MODEL_FILENAME = "model.onnx"
# Triton's `--backend-config=default-max-batch-size` default.
DEFAULT_MAX_BATCH_SIZE = 4

_CPU = "CPUExecutionProvider"
_CUDA = "CUDAExecutionProvider"
_TENSORRT = "TensorrtExecutionProvider"
_OPENVINO = "OpenVINOExecutionProvider"

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

# Triton's documented `optimization { graph { level } }` values for its onnxruntime backend;
# unset (0) leaves onnxruntime's own default, every optimization.
_GRAPH_LEVELS: dict[int, ort.GraphOptimizationLevel] = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}

# Triton's names for TensorRT accelerator parameters -> the TensorRT provider's option names.
# Parameters already spelled `trt_*` pass through unchanged.
_TENSORRT_OPTIONS: dict[str, str] = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "max_partition_iterations": "trt_max_partition_iterations",
    "minimum_segment_size": "trt_min_subgraph_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}

_BF16_ELEMENT_TYPE = 16  # onnx.TensorProto.BFLOAT16


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


# ---------------------------------------------------------------------------------------------
# Session settings


@dataclass(frozen=True, slots=True)
class _SessionSettings:
    """What the config asks of every session, parsed once at load so mistakes fail the load."""

    intra_op_threads: int
    inter_op_threads: int
    execution_mode: ort.ExecutionMode
    graph_level: ort.GraphOptimizationLevel
    enable_mem_arena: bool
    enable_mem_pattern: bool
    config_entries: tuple[tuple[str, str], ...]
    gpu_accelerators: tuple[tuple[str, dict[str, str]], ...]
    cpu_accelerators: tuple[tuple[str, dict[str, str]], ...]

    def session_options(self) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = self.inter_op_threads
        options.execution_mode = self.execution_mode
        options.graph_optimization_level = self.graph_level
        options.enable_cpu_mem_arena = self.enable_mem_arena
        options.enable_mem_pattern = self.enable_mem_pattern
        for key, value in self.config_entries:
            options.add_session_config_entry(key, value)
        return options


def _int_parameter(model: str, parameters: Mapping[str, str], key: str, default: int) -> int:
    text = parameters.get(key)
    if text is None or text.strip() == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise invalid_arg(
            f"model '{model}' parameter '{key}' must be an integer, not {text!r}"
        ) from None


def _session_settings(config: ModelConfig, model: str) -> _SessionSettings:
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    intra = _int_parameter(model, parameters, "intra_op_thread_count", 0)
    inter = _int_parameter(model, parameters, "inter_op_thread_count", 0)
    if intra < 0 or inter < 0:
        raise invalid_arg(f"model '{model}' thread counts must be >= 0")
    mode = _int_parameter(model, parameters, "execution_mode", 0)
    if mode not in (0, 1):
        raise invalid_arg(
            f"model '{model}' parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), "
            f"not {mode}"
        )
    level = 0
    gpu: tuple[tuple[str, dict[str, str]], ...] = ()
    cpu: tuple[tuple[str, dict[str, str]], ...] = ()
    optimization = config.optimization
    if optimization is not None:
        if optimization.graph is not None:
            level = optimization.graph.level
        accelerators = optimization.execution_accelerators
        if accelerators is not None:
            gpu = tuple(
                (a.name, dict(a.parameters)) for a in accelerators.gpu_execution_accelerator
            )
            cpu = tuple(
                (a.name, dict(a.parameters)) for a in accelerators.cpu_execution_accelerator
            )
    graph_level = _GRAPH_LEVELS.get(level)
    if graph_level is None:
        # Triton loads such a config with every optimization on; so do we, but say so.
        log.warning("model '%s': unknown optimization.graph.level %d; using all", model, level)
        graph_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for name, options in gpu:
        if name == "tensorrt":
            _tensorrt_options(model, options)  # fail the load on a bad parameter
        elif name != "cuda":
            raise invalid_arg(
                f"model '{model}' names unknown gpu_execution_accelerator '{name}'; "
                "this backend knows 'tensorrt' and 'cuda'"
            )
    for name, _ in cpu:
        if name != "openvino":
            raise invalid_arg(
                f"model '{model}' names unknown cpu_execution_accelerator '{name}'; "
                "this backend knows 'openvino'"
            )
    return _SessionSettings(
        intra_op_threads=intra,
        inter_op_threads=inter,
        execution_mode=ort.ExecutionMode.ORT_PARALLEL if mode else ort.ExecutionMode.ORT_SEQUENTIAL,
        graph_level=graph_level,
        enable_mem_arena=_int_parameter(model, parameters, "enable_mem_arena", 1) != 0,
        enable_mem_pattern=_int_parameter(model, parameters, "enable_mem_pattern", 1) != 0,
        config_entries=_config_entries(parameters),
        gpu_accelerators=gpu,
        cpu_accelerators=cpu,
    )


# Unlike onnxruntime's default, idle intra-op threads sleep instead of spinning: spinning
# threads take a core the event loop and the other instances need, for no throughput gain when
# requests arrive one at a time. A model can turn spinning back on with this parameter.
_DEFAULT_ENTRIES = {"session.intra_op.allow_spinning": "0"}


def _config_entries(parameters: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Triton hands `session.*` model parameters to onnxruntime as session config entries."""
    given = {key: value for key, value in parameters.items() if key.startswith("session.")}
    return tuple(sorted({**_DEFAULT_ENTRIES, **given}.items()))


def _tensorrt_options(model: str, parameters: Mapping[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, value in parameters.items():
        if key == "precision_mode":
            precision = value.upper()
            if precision == "FP16":
                options["trt_fp16_enable"] = True
            elif precision == "INT8":
                options["trt_int8_enable"] = True
            elif precision != "FP32":
                raise invalid_arg(
                    f"model '{model}' TensorRT precision_mode must be FP32, FP16 or INT8, "
                    f"not {value!r}"
                )
        elif key in _TENSORRT_OPTIONS:
            options[_TENSORRT_OPTIONS[key]] = value
        elif key.startswith("trt_"):
            options[key] = value
        else:
            raise invalid_arg(f"model '{model}' has unknown TensorRT accelerator parameter '{key}'")
    return options


def _providers(
    model: str, kind: str, device_id: int, settings: _SessionSettings
) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """The execution providers for an instance, and the one that must end up in the session."""
    available = ort.get_available_providers()
    if kind == "KIND_AUTO":
        kind = "KIND_GPU" if _CUDA in available else "KIND_CPU"
    if kind == "KIND_GPU":
        if _CUDA not in available:
            raise unavailable(
                f"model '{model}': instance group KIND_GPU needs the CUDA execution provider; "
                f"this onnxruntime offers {available} (install onnxruntime-gpu, or use KIND_CPU)"
            )
        providers: list[tuple[str, dict[str, Any]]] = []
        cuda_options: dict[str, Any] = {"device_id": device_id}
        for name, parameters in settings.gpu_accelerators:
            if name == "tensorrt":
                if _TENSORRT not in available:
                    raise unavailable(
                        f"model '{model}' asks for the TensorRT accelerator; "
                        f"this onnxruntime offers {available}"
                    )
                trt = {"device_id": device_id, **_tensorrt_options(model, parameters)}
                providers.append((_TENSORRT, trt))
            else:  # "cuda": its parameters are CUDA provider options
                cuda_options.update(parameters)
        providers.append((_CUDA, cuda_options))
        providers.append((_CPU, {}))
        return providers, _CUDA
    providers = []
    for _, parameters in settings.cpu_accelerators:  # only "openvino" survives validation
        if _OPENVINO not in available:
            raise unavailable(
                f"model '{model}' asks for the OpenVINO accelerator; "
                f"this onnxruntime offers {available}"
            )
        providers.append((_OPENVINO, dict(parameters)))
    providers.append((_CPU, {}))
    return providers, providers[0][0]


# ---------------------------------------------------------------------------------------------
# The backend


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    platforms = (PLATFORM,)
    default_model_filename = MODEL_FILENAME

    def __init__(self, default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        self.default_max_batch_size = default_max_batch_size

    def auto_complete_config(self, config: ModelConfig, version_dir: Path) -> ModelConfig:
        """Fill inputs, outputs, their types and dims, and max_batch_size from the ONNX model,
        as Triton's onnxruntime backend does. Returns a new config; `config` is not changed."""
        completed = ModelConfig.parse(bytes(config))
        model = completed.name
        filename = completed.default_model_filename or MODEL_FILENAME
        path = _onnx_file(version_file(version_dir, filename))
        signature = _read_signature(path)

        if signature.batchable():
            complete_batching(completed, self.default_max_batch_size)
        # With max_batch_size > 0 on a model that cannot batch, the dims below still drop the
        # first dimension; load_model then names the tensor whose first dimension is fixed.
        batching = completed.max_batch_size > 0
        # The sequence batcher feeds control and state inputs and takes the state outputs back:
        # a config does not list them.
        fed, taken = _sequence_tensors(completed)
        inputs = {name: spec for name, spec in signature.inputs.items() if name not in fed}
        outputs = {name: spec for name, spec in signature.outputs.items() if name not in taken}
        for listed, specs, factory in (
            (completed.input, inputs, ModelInput),
            (completed.output, outputs, ModelOutput),
        ):
            complete_tensors(
                listed,
                _shapes(specs),
                lambda name, specs=specs: _config_type(model, specs[name]),
                batching,
                factory,
            )
        return _complete_backend_fields(completed)

    def check_model(self, context: ModelContext) -> None:
        _validate(context.config, context.name, _read_signature(_onnx_file(context.model_path)))

    def load_model(self, context: ModelContext) -> OnnxRuntimeModel:
        path = _onnx_file(context.model_path)
        signature = _read_signature(path)
        _validate(context.config, context.name, signature)
        settings = _session_settings(context.config, context.name)
        return OnnxRuntimeModel(context, path, signature, settings)


def _complete_backend_fields(config: ModelConfig) -> ModelConfig:
    if not config.backend:
        config.backend = OnnxRuntimeBackend.name
    if not config.platform:
        config.platform = PLATFORM
    return config


class OnnxRuntimeModel(BackendModel):
    """A validated ONNX model version; each instance opens its own session on it."""

    def __init__(
        self,
        context: ModelContext,
        path: Path,
        signature: _Signature,
        settings: _SessionSettings,
    ) -> None:
        self.context = context
        self.path = path
        self.signature = signature
        self.settings = settings

    def create_instance(self, context: InstanceContext) -> OnnxRuntimeInstance:
        model = self.context.name
        providers, wanted = _providers(model, context.kind, context.device_id, self.settings)
        try:
            session = ort.InferenceSession(
                str(self.path),
                self.settings.session_options(),
                providers=[name for name, _ in providers],
                provider_options=[options for _, options in providers],
            )
        except Exception as exc:
            raise internal(
                f"model '{model}' instance '{context.name}': onnxruntime cannot create a "
                f"session with {[name for name, _ in providers]}: {exc}"
            ) from None
        # onnxruntime quietly falls back to the CPU when a provider cannot start (no device).
        if wanted not in session.get_providers():
            raise unavailable(
                f"model '{model}' instance '{context.name}' ({context.kind}, device "
                f"{context.device_id}): onnxruntime could not start {wanted}; the session "
                f"has only {session.get_providers()}"
            )
        return OnnxRuntimeInstance(self.context, session, self.signature)


# ---------------------------------------------------------------------------------------------
# Execution


@dataclass(frozen=True, slots=True)
class _InputPlan:
    name: str
    optional: bool
    is_string: bool
    is_bf16: bool
    # The per-item shape the model wants when the config reshapes this input.
    reshape: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class _OutputPlan:
    name: str
    datatype: str
    # The per-item shape the client sees when the config reshapes this output.
    dims: tuple[int, ...] | None


class OnnxRuntimeInstance(BackendInstance):
    """One onnxruntime session. The caller runs one `execute` at a time on it."""

    may_run_on_loop = True  # a tiny graph runs in less than the thread hop costs

    def __init__(
        self, context: ModelContext, session: ort.InferenceSession, signature: _Signature
    ) -> None:
        config = context.config
        self.model_name = context.name
        self.model_version = str(context.version)
        self._session: ort.InferenceSession | None = session
        self._batching = config.max_batch_size > 0
        self._inputs = [
            _InputPlan(
                name=t.name,
                optional=t.optional,
                is_string=t.data_type == DataType.TYPE_STRING,
                is_bf16=t.data_type == DataType.TYPE_BF16,
                reshape=tuple(t.reshape.shape) if t.reshape is not None else None,
            )
            for t in config.input
        ]
        # Control and state inputs, which the sequence batcher adds to each request.
        fed, _ = _sequence_tensors(config)
        self._inputs += [
            _InputPlan(
                name=spec.name,
                optional=True,
                is_string=spec.onnx_type == "tensor(string)",
                is_bf16=spec.onnx_type == "tensor(bfloat16)",
                reshape=None,
            )
            for spec in signature.inputs.values()
            if spec.name in fed
        ]
        self._outputs = {
            t.name: _OutputPlan(
                name=t.name,
                datatype=config_to_wire(DataType(t.data_type).name),
                dims=tuple(t.dims) if t.reshape is not None else None,
            )
            for t in config.output
        }
        self._all_outputs = list(self._outputs)
        # numpy has no bfloat16 onnxruntime understands: such models run through OrtValues.
        self._bf16 = any(p.is_bf16 for p in self._inputs) or any(
            signature.outputs[name].onnx_type == "tensor(bfloat16)" for name in self._outputs
        )

    @property
    def session(self) -> ort.InferenceSession | None:
        """The onnxruntime session (None once finalized); for inspection, not for running."""
        return self._session

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        if not self._batching or len(requests) < 2:
            return [self._execute_one(request) for request in requests]
        results: list[Result] = [None] * len(requests)
        for group in batching.groups(requests):
            members = [requests[index] for index in group]
            answers = self._execute_merged(members) if len(members) > 1 else None
            if answers is None:
                answers = [self._execute_one(request) for request in members]
            for index, answer in zip(group, answers, strict=True):
                results[index] = answer
        return results

    def _execute_merged(self, requests: list[InferenceRequest]) -> list[Result] | None:
        """One session.run for requests of the same shapes; None when that run failed or its
        outputs cannot be split, so that each request runs alone and fails on its own."""
        merged, sizes = batching.merge(requests)
        response = self._execute_one(merged)
        if not isinstance(response, InferenceResponse):
            return None
        try:
            return list(batching.split(response, sizes, requests))
        except TritonError:
            return None

    def finalize(self) -> None:
        self._session = None

    def _execute_one(self, request: InferenceRequest) -> Result:
        session = self._session
        if session is None:
            return unavailable(f"model '{self.model_name}' instance is finalized")
        try:
            feeds = self._feeds(request)
        except TritonError as exc:
            return exc
        except ValueError as exc:  # a reshape the request's shape cannot take
            return invalid_arg(f"model '{self.model_name}': {exc}")
        names = request.requested_output_names or self._all_outputs
        try:
            arrays = self._run(session, names, feeds)
        except TritonError as exc:
            return exc
        except Exception as exc:
            return internal(
                f"onnx runtime error running model '{self.model_name}' "
                f"version {self.model_version}: {exc}"
            )
        try:
            outputs = [self._output(name, array) for name, array in zip(names, arrays, strict=True)]
        except TritonError as exc:
            return exc
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
                if plan.optional:
                    continue
                raise invalid_arg(
                    f"model '{self.model_name}' request is missing input '{plan.name}'"
                )
            data = tensor.data
            if plan.reshape is not None:
                lead = data.shape[:1] if self._batching else ()
                data = data.reshape(lead + plan.reshape)
            if plan.is_string:
                data = _to_onnx_strings(plan.name, data)
            feeds[plan.name] = data
        return feeds

    def _run(
        self, session: ort.InferenceSession, names: list[str], feeds: dict[str, np.ndarray]
    ) -> list[np.ndarray]:
        if not self._bf16:
            return session.run(names, feeds)
        values = {
            name: (
                ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(data).view(np.uint16), _BF16_ELEMENT_TYPE
                )
                if data.dtype == ml_dtypes.bfloat16
                else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(data))
            )
            for name, data in feeds.items()
        }
        return [_ortvalue_to_numpy(value) for value in session.run_with_ort_values(names, values)]

    def _output(self, name: str, array: np.ndarray) -> Tensor:
        plan = self._outputs.get(name)
        if plan is None:
            datatype = from_numpy_dtype(array.dtype)
        else:
            datatype = plan.datatype
            array = undo_reshape(self.model_name, name, array, plan.dims, self._batching)
        if datatype == "BYTES":
            array = _from_onnx_strings(array)
        return Tensor(name=name, datatype=datatype, shape=tuple(array.shape), data=array)


def _to_onnx_strings(name: str, data: np.ndarray) -> np.ndarray:
    # onnxruntime takes string tensors as `str` and would stringify `bytes` as "b'...'".
    flat = data.reshape(-1)
    text = np.empty(flat.shape, dtype=np.object_)
    try:
        for i, item in enumerate(flat):
            text[i] = item.decode("utf-8") if isinstance(item, bytes | bytearray) else str(item)
    except UnicodeDecodeError as exc:
        raise invalid_arg(
            f"input '{name}' element {i} is not UTF-8 ({exc.reason}); ONNX string tensors "
            "hold UTF-8 text"
        ) from None
    return text.reshape(data.shape)


def _from_onnx_strings(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.size, dtype=np.object_)
    for i, item in enumerate(array.reshape(-1)):
        out[i] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out.reshape(array.shape)


def _ortvalue_to_numpy(value: ort.OrtValue) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    # onnxruntime cannot hand bfloat16 to numpy; copy the raw 16-bit words instead.
    if value.device_name().lower() != "cpu":
        raise internal("a bfloat16 output left on the GPU cannot be returned yet")
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype=ml_dtypes.bfloat16)
    words = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.ctypeslib.as_array(words).copy().view(ml_dtypes.bfloat16).reshape(shape)
