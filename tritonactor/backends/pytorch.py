"""The PyTorch backend: TorchScript models (`pytorch_libtorch`), one module per instance.

TorchScript files carry no input or output names, so the config must list them; how a config name
binds to a `forward()` argument or to a returned value follows Triton's naming rules (see
docs/pytorch-backend.md). torch is imported on first load, so a server without torch still starts.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from tritonactor._proto.inference import DataType, ModelConfig, ModelInput, ModelOutput
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
    undo_reshape,
)
from tritonactor.core.datatypes import config_to_wire
from tritonactor.core.errors import TritonError, internal, invalid_arg, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor

__all__ = ["PyTorchBackend", "PyTorchInstance", "PyTorchModel"]

log = logging.getLogger(__name__)

PLATFORM = "pytorch_libtorch"
MODEL_FILENAME = "model.pt"

# Config data type -> the torch dtype's attribute name (TYPE_STRING travels as List[str]).
_TORCH_DTYPES: dict[DataType, str] = {
    DataType.TYPE_BOOL: "bool",
    DataType.TYPE_UINT8: "uint8",
    DataType.TYPE_UINT16: "uint16",
    DataType.TYPE_UINT32: "uint32",
    DataType.TYPE_UINT64: "uint64",
    DataType.TYPE_INT8: "int8",
    DataType.TYPE_INT16: "int16",
    DataType.TYPE_INT32: "int32",
    DataType.TYPE_INT64: "int64",
    DataType.TYPE_FP16: "float16",
    DataType.TYPE_FP32: "float32",
    DataType.TYPE_FP64: "float64",
    DataType.TYPE_BF16: "bfloat16",
}

# Triton's `<name>__<index>` convention.
_NAMED_INDEX = re.compile(r"^.+__(\d+)$")

# Model parameters Triton's pytorch backend knows that this one does not act on.
_IGNORED_PARAMETERS = (
    "ENABLE_NVFUSER",
    "ENABLE_JIT_EXECUTOR",
    "ENABLE_JIT_PROFILING",
    "ENABLE_TENSOR_FUSER",
)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise unavailable(
            "the pytorch backend needs torch: pip install 'tritonactor[cpu]'"
        ) from None
    return torch


# ---------------------------------------------------------------------------------------------
# Model parameters


@dataclass(frozen=True, slots=True)
class _Settings:
    inference_mode: bool = True
    disable_optimized_execution: bool = False
    intra_op_threads: int = 0  # 0: leave torch's choice
    inter_op_threads: int = 0
    cache_cleaning: bool = False
    weight_sharing: bool = False


def _bool_parameter(model: str, parameters: Mapping[str, str], key: str, default: bool) -> bool:
    text = parameters.get(key)
    if text is None:
        return default
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise invalid_arg(f"model '{model}' parameter {key} must be true or false, not {text!r}")


def _int_parameter(model: str, parameters: Mapping[str, str], key: str) -> int:
    text = parameters.get(key)
    if text is None:
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise invalid_arg(f"model '{model}' parameter {key} must be an integer >= 0, not {text!r}")
    return value


def _settings(config: ModelConfig, model: str) -> _Settings:
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    for key in _IGNORED_PARAMETERS:
        if key in parameters:
            log.warning("model '%s': parameter %s is not supported and is ignored", model, key)
    return _Settings(
        inference_mode=_bool_parameter(model, parameters, "INFERENCE_MODE", True),
        disable_optimized_execution=_bool_parameter(
            model, parameters, "DISABLE_OPTIMIZED_EXECUTION", False
        ),
        intra_op_threads=_int_parameter(model, parameters, "INTRA_OP_THREAD_COUNT"),
        inter_op_threads=_int_parameter(model, parameters, "INTER_OP_THREAD_COUNT"),
        cache_cleaning=_bool_parameter(model, parameters, "ENABLE_CACHE_CLEANING", False),
        weight_sharing=_bool_parameter(model, parameters, "ENABLE_WEIGHT_SHARING", False),
    )


# ---------------------------------------------------------------------------------------------
# Binding config names to forward() arguments and returned values


@dataclass(frozen=True, slots=True)
class _Argument:
    name: str
    type: str  # as torch prints it: "Tensor", "List[str]", "Optional[Tensor]", ...
    has_default: bool


@dataclass(frozen=True, slots=True)
class _InputPlan:
    name: str  # the config's name
    argument: str  # the forward() argument it feeds ("" when inputs travel in one dict)
    optional: bool
    is_string: bool
    is_bf16: bool
    # The per-item shape the model wants when the config reshapes this input.
    reshape: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class _OutputPlan:
    name: str
    index: int  # position in the returned tuple/list; -1 when the model returns a dict
    datatype: str  # wire name
    torch_dtype: str  # "" for BYTES
    # The per-item shape the client sees when the config reshapes this output.
    dims: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class _Binding:
    inputs: tuple[_InputPlan, ...]
    outputs: dict[str, _OutputPlan]
    # forward() takes a single Dict[str, Tensor]: every input goes in it under its config name.
    dict_argument: str
    # The model returns one value (a Tensor, or a List[str]), not a tuple/list/dict of them.
    single_return: bool
    returns_dict: bool


def _forward_schema(model: str, module: Any) -> tuple[list[_Argument], Any]:
    try:
        schema = module.forward.schema
    except AttributeError:
        raise invalid_arg(
            f"model '{model}': the TorchScript module has no forward() method"
        ) from None
    arguments = [
        _Argument(a.name, str(a.type), a.has_default_value()) for a in schema.arguments[1:]
    ]
    return_type = schema.returns[0].type if len(schema.returns) == 1 else None
    return arguments, return_type


def _named_indices(names: list[str]) -> list[int] | None:
    """The indices of `<name>__<index>` names, or None unless every name follows it."""
    indices = []
    for name in names:
        match = _NAMED_INDEX.match(name)
        if match is None:
            return None
        indices.append(int(match.group(1)))
    return indices


def _bind_inputs(
    model: str, inputs: list[ModelInput], arguments: list[_Argument]
) -> tuple[tuple[_InputPlan, ...], str]:
    names = [t.name for t in inputs]
    shown = [a.name for a in arguments]
    if len(arguments) == 1 and arguments[0].type == "Dict[str, Tensor]":
        for tensor in inputs:
            if tensor.data_type == DataType.TYPE_STRING:
                raise invalid_arg(
                    f"model '{model}' input '{tensor.name}' is TYPE_STRING, but forward() takes "
                    "a Dict[str, Tensor], which holds only tensors"
                )
        return tuple(_input_plan(t, "") for t in inputs), arguments[0].name

    by_name = {a.name: a for a in arguments}
    if all(name in by_name for name in names):
        bound = [by_name[name] for name in names]  # Triton's first rule: the argument names
    else:
        indices = _named_indices(names)
        if indices is None:
            # Triton's last rule: neither convention holds for every input, so the config's
            # order is forward()'s order.
            indices = list(range(len(names)))
            how = "in config order"
        else:
            how = "by their <name>__<index> names"
        if len(set(indices)) != len(indices):
            raise invalid_arg(f"model '{model}': config inputs {names} repeat an index")
        for name, index in zip(names, indices, strict=True):
            if index >= len(arguments):
                raise invalid_arg(
                    f"model '{model}' input '{name}' binds {how} to forward() argument {index}, "
                    f"but forward() takes {len(arguments)} argument(s) {shown}"
                )
        bound = [arguments[index] for index in indices]

    fed = {a.name for a in bound}
    unfed = [a.name for a in arguments if not a.has_default and a.name not in fed]
    if unfed:
        raise invalid_arg(
            f"model '{model}': forward() arguments {unfed} have no default and no config input "
            f"feeds them (config inputs {names}, forward() arguments {shown})"
        )
    plans = []
    for tensor, argument in zip(inputs, bound, strict=True):
        where = f"model '{model}' input '{tensor.name}' (forward() argument '{argument.name}')"
        if tensor.optional and not argument.has_default:
            raise invalid_arg(f"{where} is optional in the config but has no default in forward()")
        if tensor.data_type == DataType.TYPE_STRING:
            if argument.type != "List[str]":
                raise invalid_arg(
                    f"{where} is TYPE_STRING, which the pytorch backend passes as List[str], "
                    f"but forward() declares it {argument.type}"
                )
            _check_string_dims(model, "input", tensor)
        elif argument.type not in ("Tensor", "Optional[Tensor]"):
            raise invalid_arg(
                f"{where} is {DataType(tensor.data_type).name}, passed as a Tensor, but forward() "
                f"declares it {argument.type}"
            )
        plans.append(_input_plan(tensor, argument.name))
    return tuple(plans), ""


def _input_plan(tensor: ModelInput, argument: str) -> _InputPlan:
    return _InputPlan(
        name=tensor.name,
        argument=argument,
        optional=tensor.optional,
        is_string=tensor.data_type == DataType.TYPE_STRING,
        is_bf16=tensor.data_type == DataType.TYPE_BF16,
        reshape=tuple(tensor.reshape.shape) if tensor.reshape is not None else None,
    )


def _check_string_dims(model: str, kind: str, tensor: ModelInput | ModelOutput) -> None:
    # A List[str] has one dimension; more would need a shape the list cannot carry.
    if len(tensor.dims) != 1 or tensor.reshape is not None:
        raise invalid_arg(
            f"model '{model}' {kind} '{tensor.name}' is TYPE_STRING with dims "
            f"{list(tensor.dims)}; the pytorch backend passes strings as one List[str], so "
            "TYPE_STRING tensors must have exactly one dim (plus the batch dim) and no reshape"
        )


def _return_arity(return_type: Any) -> tuple[bool, bool, int | None]:
    """(single value, dict, how many values when known) from forward()'s declared return."""
    if return_type is None:
        return False, False, None
    kind = return_type.kind()
    if kind == "TupleType":
        return False, False, len(return_type.elements())
    if kind == "DictType":
        return False, True, None
    if kind == "ListType" and str(return_type) != "List[str]":
        return False, False, None
    return True, False, 1


def _bind_outputs(
    model: str, outputs: list[ModelOutput], return_type: Any
) -> tuple[dict[str, _OutputPlan], bool, bool]:
    single, returns_dict, arity = _return_arity(return_type)
    names = [t.name for t in outputs]
    if returns_dict:
        indices = [-1] * len(names)
    else:
        indices = _named_indices(names)
        how = "by their <name>__<index> names"
        if indices is None:
            indices = list(range(len(names)))
            how = "in config order"
        if len(set(indices)) != len(indices):
            raise invalid_arg(f"model '{model}': config outputs {names} repeat an index")
        for name, index in zip(names, indices, strict=True):
            if arity is not None and index >= arity:
                raise invalid_arg(
                    f"model '{model}' output '{name}' binds {how} to returned value {index}, "
                    f"but forward() returns {arity} value(s) ({return_type})"
                )
    plans = {}
    for tensor, index in zip(outputs, indices, strict=True):
        data_type = DataType(tensor.data_type)
        if data_type == DataType.TYPE_STRING:
            _check_string_dims(model, "output", tensor)
        elif data_type not in _TORCH_DTYPES:
            raise invalid_arg(
                f"model '{model}' output '{tensor.name}' has data type {data_type.name}, "
                "which the pytorch backend cannot return"
            )
        plans[tensor.name] = _OutputPlan(
            name=tensor.name,
            index=index,
            datatype=config_to_wire(data_type.name),
            torch_dtype=_TORCH_DTYPES.get(data_type, ""),
            dims=tuple(tensor.dims) if tensor.reshape is not None else None,
        )
    return plans, single, returns_dict


def _bind(model: str, config: ModelConfig, module: Any) -> _Binding:
    if config.max_batch_size < 0:
        raise invalid_arg(
            f"model '{model}' has max_batch_size {config.max_batch_size}; it must be >= 0"
        )
    arguments, return_type = _forward_schema(model, module)
    if not config.output:
        raise invalid_arg(
            f"model '{model}': a TorchScript model does not name its outputs, so the config must "
            'list them (output [ { name: "OUTPUT__0" data_type: ... dims: [...] } ])'
        )
    if not config.input and arguments:
        raise invalid_arg(
            f"model '{model}': a TorchScript model does not name its inputs, so the config must "
            f"list them; forward() takes {[a.name for a in arguments]}"
        )
    for tensor in config.input:
        if tensor.data_type not in _TORCH_DTYPES and tensor.data_type != DataType.TYPE_STRING:
            raise invalid_arg(
                f"model '{model}' input '{tensor.name}' has data type "
                f"{DataType(tensor.data_type).name}, which the pytorch backend cannot pass"
            )
    inputs, dict_argument = _bind_inputs(model, list(config.input), arguments)
    outputs, single, returns_dict = _bind_outputs(model, list(config.output), return_type)
    return _Binding(inputs, outputs, dict_argument, single, returns_dict)


# ---------------------------------------------------------------------------------------------
# The backend


class PyTorchBackend(Backend):
    name = "pytorch"
    platforms = (PLATFORM,)
    default_model_filename = MODEL_FILENAME

    def __init__(self) -> None:
        # torch's thread pools are process-wide: the first model that sizes one decides.
        self._threads_lock = threading.Lock()
        self._intra_op_threads: tuple[str, int] | None = None
        self._inter_op_threads: tuple[str, int] | None = None

    def auto_complete_config(self, config: ModelConfig, version_dir: Path) -> ModelConfig:
        """Only the platform: a TorchScript file has no input or output names to complete."""
        if config.platform:
            return config
        completed = ModelConfig.parse(bytes(config))
        completed.platform = PLATFORM
        return completed

    def load_model(self, context: ModelContext) -> PyTorchModel:
        torch = _import_torch()
        settings = _settings(context.config, context.name)
        path = context.model_path
        if not path.is_file():
            raise invalid_arg(f"no TorchScript model file at {path}")
        module = _load_module(torch, context.name, path, "cpu")
        binding = _bind(context.name, context.config, module)
        self._apply_threads(torch, context.name, settings)
        return PyTorchModel(context, torch, path, binding, settings, module)

    def _apply_threads(self, torch: Any, model: str, settings: _Settings) -> None:
        with self._threads_lock:
            if settings.intra_op_threads:
                if self._intra_op_threads is None:
                    torch.set_num_threads(settings.intra_op_threads)
                    self._intra_op_threads = (model, settings.intra_op_threads)
                elif self._intra_op_threads[1] != settings.intra_op_threads:
                    _warn_threads(
                        model,
                        "INTRA_OP_THREAD_COUNT",
                        settings.intra_op_threads,
                        self._intra_op_threads,
                    )
            if settings.inter_op_threads:
                if self._inter_op_threads is None:
                    try:
                        torch.set_num_interop_threads(settings.inter_op_threads)
                    except RuntimeError as exc:  # once torch has run inter-op work, it is fixed
                        log.warning(
                            "model '%s': INTER_OP_THREAD_COUNT %d not applied: %s",
                            model,
                            settings.inter_op_threads,
                            exc,
                        )
                    self._inter_op_threads = (model, settings.inter_op_threads)
                elif self._inter_op_threads[1] != settings.inter_op_threads:
                    _warn_threads(
                        model,
                        "INTER_OP_THREAD_COUNT",
                        settings.inter_op_threads,
                        self._inter_op_threads,
                    )


def _warn_threads(model: str, key: str, wanted: int, applied: tuple[str, int]) -> None:
    log.warning(
        "model '%s' asks for %s %d, but torch's thread pools are process-wide and model '%s' "
        "already set %d; keeping %d",
        model,
        key,
        wanted,
        applied[0],
        applied[1],
        applied[1],
    )


def _load_module(torch: Any, model: str, path: Path, device: Any) -> Any:
    try:
        module = torch.jit.load(str(path), map_location=device)
    except Exception as exc:
        raise invalid_arg(f"model '{model}': cannot load TorchScript model {path}: {exc}") from None
    module.eval()
    return module


def _device(torch: Any, model: str, context: InstanceContext) -> Any:
    kind = context.kind
    if kind == "KIND_AUTO":
        kind = "KIND_GPU" if torch.cuda.is_available() else "KIND_CPU"
    if kind == "KIND_GPU":
        if not torch.cuda.is_available():
            raise unavailable(
                f"model '{model}' instance '{context.name}': KIND_GPU needs CUDA, but this torch "
                f"({torch.__version__}) sees no CUDA device (install a CUDA build of torch, or "
                "use KIND_CPU)"
            )
        count = torch.cuda.device_count()
        if context.device_id >= count:
            raise unavailable(
                f"model '{model}' instance '{context.name}': GPU {context.device_id} asked for, "
                f"but torch sees {count} CUDA device(s)"
            )
        return torch.device("cuda", context.device_id)
    # KIND_CPU, and KIND_MODEL: the model places its own work; inputs start on the CPU.
    return torch.device("cpu")


class PyTorchModel(BackendModel):
    """A validated TorchScript model version; each instance loads its own copy of the module
    onto its device (instances on one device share one with ENABLE_WEIGHT_SHARING)."""

    def __init__(
        self,
        context: ModelContext,
        torch: Any,
        path: Path,
        binding: _Binding,
        settings: _Settings,
        cpu_module: Any,
    ) -> None:
        self.context = context
        self._torch = torch
        self.path = path
        self.binding = binding
        self.settings = settings
        # The copy read to validate the config: the first CPU instance takes it.
        self._spare: Any = cpu_module
        self._shared: dict[str, Any] = {}
        self._lock = threading.Lock()

    def create_instance(self, context: InstanceContext) -> PyTorchInstance:
        torch = self._torch
        device = _device(torch, self.context.name, context)
        kind_model = context.kind == "KIND_MODEL"
        with self._lock:
            key = str(device)
            module = self._shared.get(key) if self.settings.weight_sharing else None
            if module is None:
                if device.type == "cpu" and not kind_model and self._spare is not None:
                    module, self._spare = self._spare, None
                else:
                    # Not wanted on the CPU: free the validation copy rather than hold it.
                    self._spare = None
                    location = None if kind_model else device
                    module = _load_module(torch, self.context.name, self.path, location)
                if self.settings.weight_sharing:
                    self._shared[key] = module
        return PyTorchInstance(self.context, torch, module, device, self.binding, self.settings)

    def finalize(self) -> None:
        self._spare = None
        self._shared.clear()


# ---------------------------------------------------------------------------------------------
# Execution


class PyTorchInstance(BackendInstance):
    """One TorchScript module on one device. The caller runs one `execute` at a time on it."""

    may_run_on_loop = True  # a tiny module runs in less than the thread hop costs

    def __init__(
        self,
        context: ModelContext,
        torch: Any,
        module: Any,
        device: Any,
        binding: _Binding,
        settings: _Settings,
    ) -> None:
        self.model_name = context.name
        self.model_version = str(context.version)
        self._torch = torch
        self._module: Any = module
        self.device = device
        self._binding = binding
        self._settings = settings
        self._batching = context.config.max_batch_size > 0
        self._all_outputs = list(binding.outputs)
        self._dtypes = {
            plan.name: getattr(torch, plan.torch_dtype)
            for plan in binding.outputs.values()
            if plan.torch_dtype
        }
        self._cuda = device.type == "cuda"

    @property
    def module(self) -> Any:
        """The TorchScript module (None once finalized); for inspection, not for running."""
        return self._module

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        results = [self._execute_one(request) for request in requests]
        if self._cuda and self._settings.cache_cleaning:
            self._torch.cuda.empty_cache()
        return results

    def finalize(self) -> None:
        self._module = None
        if self._cuda and self._settings.cache_cleaning:
            self._torch.cuda.empty_cache()

    def _execute_one(self, request: InferenceRequest) -> Result:
        module = self._module
        if module is None:
            return unavailable(f"model '{self.model_name}' instance is finalized")
        try:
            args, kwargs, batch_size = self._arguments(request)
        except TritonError as exc:
            return exc
        except ValueError as exc:  # a reshape the request's shape cannot take
            return invalid_arg(f"model '{self.model_name}': {exc}")
        try:
            with self._grad_mode(), self._optimized_execution():
                result = module(*args, **kwargs)
        except Exception as exc:
            return internal(
                f"PyTorch execute failure running model '{self.model_name}' "
                f"version {self.model_version}: {_first_line(exc)}"
            )
        names = request.requested_output_names or self._all_outputs
        try:
            outputs = [self._output(name, result, batch_size) for name in names]
        except TritonError as exc:
            return exc
        return InferenceResponse(
            model_name=self.model_name,
            model_version=self.model_version,
            id=request.id,
            outputs=outputs,
        )

    def _grad_mode(self) -> Any:
        torch = self._torch
        return torch.inference_mode() if self._settings.inference_mode else torch.no_grad()

    def _optimized_execution(self) -> Any:
        # A thread-local switch in torch, so setting it on this instance's thread is enough.
        if self._settings.disable_optimized_execution:
            return self._torch.jit.optimized_execution(False)
        return contextlib.nullcontext()

    def _arguments(self, request: InferenceRequest) -> tuple[list[Any], dict[str, Any], int | None]:
        batch_size = None
        values: dict[str, Any] = {}
        for plan in self._binding.inputs:
            tensor = request.input(plan.name)
            if tensor is None:
                if plan.optional:
                    continue
                raise invalid_arg(
                    f"model '{self.model_name}' request is missing input '{plan.name}'"
                )
            data = tensor.data
            if self._batching and batch_size is None and data.ndim > 0:
                batch_size = data.shape[0]
            if plan.reshape is not None:
                lead = data.shape[:1] if self._batching else ()
                data = data.reshape(lead + plan.reshape)
            key = plan.name if self._binding.dict_argument else plan.argument
            values[key] = (
                _to_strings(plan.name, data)
                if plan.is_string
                else self._to_torch(data, plan.is_bf16)
            )
        if self._binding.dict_argument:
            return [values], {}, batch_size
        return [], values, batch_size

    def _to_torch(self, data: np.ndarray, is_bf16: bool) -> Any:
        torch = self._torch
        # torch warns on arrays it cannot write to (e.g. views of a request's bytes).
        if not data.flags.writeable or not data.flags.c_contiguous:
            data = np.array(data, order="C", copy=True)
        if is_bf16:
            value = torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
        else:
            value = torch.from_numpy(data)
        if self.device.type != "cpu":
            value = value.to(self.device)
        return value

    def _value(self, name: str, plan: _OutputPlan, result: Any) -> Any:
        binding = self._binding
        if binding.returns_dict or isinstance(result, dict):
            if not isinstance(result, dict) or name not in result:
                given = sorted(result) if isinstance(result, dict) else type(result).__name__
                raise internal(
                    f"model '{self.model_name}' output '{name}': the model returned {given}, "
                    "with no entry of that name"
                )
            return result[name]
        values = (result,) if binding.single_return or _is_single(result) else result
        index = plan.index
        if not 0 <= index < len(values):
            raise internal(
                f"model '{self.model_name}' output '{name}' is returned value {index}, but the "
                f"model returned {len(values)} value(s)"
            )
        return values[index]

    def _output(self, name: str, result: Any, batch_size: int | None) -> Tensor:
        plan = self._binding.outputs[name]
        value = self._value(name, plan, result)
        if plan.datatype == "BYTES":
            array = _from_strings(self.model_name, name, value, batch_size)
        else:
            array = self._to_numpy(name, plan, value)
            array = undo_reshape(self.model_name, name, array, plan.dims, self._batching)
        return Tensor(name=name, datatype=plan.datatype, shape=tuple(array.shape), data=array)

    def _to_numpy(self, name: str, plan: _OutputPlan, value: Any) -> np.ndarray:
        torch = self._torch
        if not isinstance(value, torch.Tensor):
            raise internal(
                f"model '{self.model_name}' output '{name}' should be a {plan.datatype} tensor, "
                f"but the model returned a {type(value).__name__}"
            )
        expected = self._dtypes[name]
        if value.dtype != expected:
            raise internal(
                f"model '{self.model_name}' output '{name}' has data type "
                f"{_dtype_name(value.dtype)} in the model but TYPE_{plan.datatype} in the config"
            )
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return value.numpy()


def _is_single(result: Any) -> bool:
    return not isinstance(result, tuple | list) or (
        isinstance(result, list) and bool(result) and isinstance(result[0], str)
    )


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _first_line(exc: Exception) -> str:
    # TorchScript errors carry the whole interpreter traceback; the last line says what failed.
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def _to_strings(name: str, data: np.ndarray) -> list[str]:
    strings = []
    for i, item in enumerate(data.reshape(-1)):
        if isinstance(item, str):
            strings.append(item)
            continue
        try:
            strings.append(bytes(item).decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise invalid_arg(
                f"input '{name}' element {i} is not UTF-8 ({exc.reason}); the pytorch backend "
                "passes TYPE_STRING as List[str]"
            ) from None
    return strings


def _from_strings(model: str, name: str, value: Any, batch_size: int | None) -> np.ndarray:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise internal(
            f"model '{model}' output '{name}' is TYPE_STRING, so the model must return a "
            f"List[str] for it, not a {type(value).__name__}"
        )
    array = np.empty(len(value), dtype=np.object_)
    array[:] = [item.encode("utf-8") for item in value]
    if batch_size is None:
        return array
    if batch_size == 0 or len(value) % batch_size:
        raise internal(
            f"model '{model}' output '{name}' holds {len(value)} strings, which do not split "
            f"into the request's batch of {batch_size}"
        )
    return array.reshape(batch_size, len(value) // batch_size)
