"""The ONNX Runtime backend: one `onnxruntime.InferenceSession` per model instance.

- `signature`: what the ONNX model declares, read through onnxruntime, and the config checked
  against it;
- `session`: the session settings a config asks for and each instance's execution providers;
- `backend`: `OnnxRuntimeBackend` (auto-complete, check, load) and `OnnxRuntimeModel`;
- `instance`: `OnnxRuntimeInstance`, the execute path.
"""

from __future__ import annotations

from tritonactor.backends.onnxruntime.backend import (
    DEFAULT_MAX_BATCH_SIZE,
    PLATFORM,
    OnnxRuntimeBackend,
    OnnxRuntimeModel,
)
from tritonactor.backends.onnxruntime.instance import OnnxRuntimeInstance
from tritonactor.backends.onnxruntime.signature import MODEL_FILENAME

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "MODEL_FILENAME",
    "PLATFORM",
    "OnnxRuntimeBackend",
    "OnnxRuntimeInstance",
    "OnnxRuntimeModel",
]
