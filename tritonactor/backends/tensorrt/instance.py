"""The execute path of the TensorRT backend: one instance's execution context run on one
request at a time, on its own CUDA stream, with the optimization profile its shapes need, inputs
copied to device buffers and outputs copied back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonactor._proto.inference import DataType
from tritonactor.backends.base import (
    BackendInstance,
    InstanceContext,
    ModelContext,
    Result,
    model_reshape,
    reshaped,
    undo_reshape,
)
from tritonactor.backends.tensorrt.runtime import _device_bytes, _LoadedEngine
from tritonactor.backends.tensorrt.signature import (
    EngineSignature,
    Shape,
    _numpy_dtype,
    _tensor_type,
    select_profile,
)
from tritonactor.core.datatypes import config_to_wire
from tritonactor.core.errors import TritonError, internal, invalid_arg, unavailable, unsupported
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor

# ---------------------------------------------------------------------------------------------
# Execution


@dataclass(frozen=True, slots=True)
class _InputPlan:
    name: str
    dtype: np.dtype
    reshape: Shape | None  # the per-item shape the engine wants when the config reshapes
    dims: Shape = ()  # the input's own (the client's)


@dataclass(frozen=True, slots=True)
class _OutputPlan:
    name: str
    datatype: str  # wire name
    dtype: np.dtype
    dims: Shape | None  # the per-item shape the client sees when the config reshapes
    reshape: Shape = ()  # the engine's


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
                reshape=model_reshape(t, len(signature.inputs[t.name].shape), self._batching),
                dims=tuple(t.dims),
            )
            for t in config.input
        ]
        listed = {t.name: t for t in config.output}
        self._outputs: dict[str, _OutputPlan] = {}
        for name, tensor in signature.outputs.items():
            entry = listed.get(name)
            wanted = (
                model_reshape(entry, len(tensor.shape), self._batching)
                if entry is not None
                else None
            )
            self._outputs[name] = _OutputPlan(
                name=name,
                datatype=config_to_wire(DataType(_tensor_type(context.name, tensor)).name),
                dtype=_numpy_dtype(tensor),
                dims=tuple(entry.dims) if entry is not None and wanted is not None else None,
                reshape=wanted if wanted is not None else (),
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
                try:
                    data = reshaped(data, plan.dims, plan.reshape, self._batching)
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
        array = undo_reshape(self.model_name, name, array, plan.dims, self._batching, plan.reshape)
        return Tensor(name=name, datatype=plan.datatype, shape=tuple(array.shape), data=array)
