"""The ONNX Runtime backend and a loaded model version: auto-completing a config from the ONNX
model, checking and loading it, and opening one `onnxruntime.InferenceSession` per instance.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from tritonactor._proto.inference import ModelConfig, ModelInput, ModelOutput
from tritonactor.backends.autocomplete import complete_batching, complete_tensors
from tritonactor.backends.base import (
    Backend,
    BackendModel,
    InstanceContext,
    ModelContext,
    version_file,
)
from tritonactor.backends.onnxruntime.instance import OnnxRuntimeInstance
from tritonactor.backends.onnxruntime.session import (
    _providers,
    _session_settings,
    _SessionSettings,
)
from tritonactor.backends.onnxruntime.signature import (
    MODEL_FILENAME,
    _config_type,
    _onnx_file,
    _read_signature,
    _sequence_tensors,
    _shapes,
    _Signature,
    _validate,
)
from tritonactor.core.errors import internal, unavailable

PLATFORM = "onnxruntime_onnx"
# Triton's `--backend-config=default-max-batch-size` default.
DEFAULT_MAX_BATCH_SIZE = 4


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
