"""The TensorRT runtime: `tensorrt` and `torch` imported when a plan model loads (or
UNAVAILABLE saying what this machine lacks: a CUDA device, the tensorrt package, torch with
CUDA), an engine deserialized on one GPU with a logger that forwards to `logging`, what the
engine declares read into an `EngineSignature`, and request bytes copied to a device buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonactor.backends.tensorrt.signature import EngineSignature, EngineTensor, ProfileRange
from tritonactor.core.devices import gpu_count
from tritonactor.core.errors import invalid_arg, unavailable

# The logger the backend had as one module, kept so that its log lines read the same.
log = logging.getLogger("tritonactor.backends.tensorrt")

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
# Loading an engine


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


# ---------------------------------------------------------------------------------------------
# What the engine declares, read from it


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
# Device buffers


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
