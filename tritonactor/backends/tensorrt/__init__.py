"""The TensorRT backend: a serialized TensorRT 10 engine (`model.plan`) run through the
name-based tensor API (`set_input_shape`, `set_tensor_address`, `execute_async_v3`).

`tensorrt` and `torch` are imported only when a plan model loads. torch provides the CUDA side:
device selection, one stream per instance, device buffers and the copies to and from them; it is
already in the gpu extra, so no second CUDA binding is needed.

What the engine declares is read once into an `EngineSignature`, a plain description that
auto-complete, load checks and optimization-profile selection work from, so those rules are
testable without TensorRT or a GPU.

- `signature`: `EngineTensor`, `EngineSignature`, the engine -> config type table, the load-time
  checks and optimization-profile selection;
- `runtime`: importing `tensorrt` and `torch` (or saying what this machine lacks), deserializing
  an engine on a GPU, reading what it declares, device buffers;
- `backend`: `TensorRTBackend` (auto-complete, load), `complete_config` and `TensorRTModel`;
- `instance`: `TensorRTInstance`, the execute path.
"""

from __future__ import annotations

from tritonactor.backends.tensorrt.backend import (
    MODEL_FILENAME,
    PLATFORM,
    TensorRTBackend,
    TensorRTModel,
    complete_config,
)
from tritonactor.backends.tensorrt.instance import TensorRTInstance
from tritonactor.backends.tensorrt.runtime import unavailable_message
from tritonactor.backends.tensorrt.signature import (
    EngineSignature,
    EngineTensor,
    config_type,
    select_profile,
    validate_config,
)

__all__ = [
    "MODEL_FILENAME",
    "PLATFORM",
    "EngineSignature",
    "EngineTensor",
    "TensorRTBackend",
    "TensorRTInstance",
    "TensorRTModel",
    "complete_config",
    "config_type",
    "select_profile",
    "unavailable_message",
    "validate_config",
]
