"""The TensorRT backend and a loaded model version: auto-completing a config from the engine,
checking and loading it, and a model that deserializes the engine once per GPU its instances run
on and opens one execution context and CUDA stream per instance.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tritonactor._proto.inference import ModelConfig, ModelInput, ModelOutput
from tritonactor.backends.autocomplete import complete_batching, complete_tensors
from tritonactor.backends.base import (
    Backend,
    BackendModel,
    InstanceContext,
    ModelContext,
    version_file,
)
from tritonactor.backends.tensorrt.instance import TensorRTInstance
from tritonactor.backends.tensorrt.runtime import _gpu_runtime, _load_engine, _LoadedEngine
from tritonactor.backends.tensorrt.signature import (
    EngineSignature,
    _allowed_profiles,
    _tensor_type,
    validate_config,
)
from tritonactor.core.errors import internal, invalid_arg, unavailable

PLATFORM = "tensorrt_plan"
MODEL_FILENAME = "model.plan"


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
# Auto-complete


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
