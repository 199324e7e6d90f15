"""A PyTorch model instance and its execute path: a request's tensors passed to `forward()`, the
returned values read back as the config's outputs."""

from __future__ import annotations

import contextlib
from typing import Any

import ml_dtypes
import numpy as np

from tritonactor.backends.base import (
    BackendInstance,
    ModelContext,
    Result,
    reshaped,
    undo_reshape,
)
from tritonactor.backends.pytorch.binding import _Binding, _OutputPlan
from tritonactor.backends.pytorch.parameters import _Settings
from tritonactor.core.errors import TritonError, internal, invalid_arg, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor


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
                data = reshaped(data, plan.dims, plan.reshape, self._batching)
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
            array = undo_reshape(
                self.model_name, name, array, plan.dims, self._batching, plan.reshape
            )
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
