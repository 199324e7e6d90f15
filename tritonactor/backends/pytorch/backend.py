"""The PyTorch backend and its models: torch imported on first load, a model's TorchScript file
read and its config bound, and each instance's copy of the module loaded onto its device."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.base import Backend, BackendModel, InstanceContext, ModelContext
from tritonactor.backends.pytorch.binding import _bind, _Binding
from tritonactor.backends.pytorch.instance import PyTorchInstance
from tritonactor.backends.pytorch.parameters import _Settings, _settings
from tritonactor.core.errors import invalid_arg, unavailable

# The package's name, as before the split: log lines keep naming the backend the same way.
log = logging.getLogger("tritonactor.backends.pytorch")

PLATFORM = "pytorch_libtorch"
MODEL_FILENAME = "model.pt"


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise unavailable(
            "the pytorch backend needs torch: pip install 'tritonactor[cpu]'"
        ) from None
    return torch


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
