"""The backend API, mirroring Triton's lifecycle:

    backend init -> model init -> instance init -> execute(requests)... -> finalize

A backend is found by name in the registry. Every method may block: the instance actor calls
them off the event loop (a backend whose `execute` is `async def` is awaited on the loop instead).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tritonactor._proto.inference import ModelConfig
from tritonactor.core.errors import TritonError, internal
from tritonactor.core.types import InferenceRequest, InferenceResponse


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """Where a model version's files are, before any config decides how to read them."""

    name: str
    model_dir: Path  # <repository>/<model>
    repository: Path


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What a backend is given to initialize one version of a model."""

    name: str
    version: int
    config: ModelConfig
    model_dir: Path  # <repository>/<model>
    version_dir: Path  # <repository>/<model>/<version>
    model_path: Path  # version_dir / (default_model_filename or the backend's default name)


# Runs a request on any loaded model through the server's router (what BLS calls).
InferFunction = Callable[[InferenceRequest], Awaitable[InferenceResponse]]


@dataclass(frozen=True, slots=True)
class InstanceContext:
    """One instance of an `instance_group`: Triton names it `<group name>_<index>`."""

    name: str
    kind: str  # "KIND_CPU" | "KIND_GPU" | "KIND_MODEL"
    device_id: int
    index: int
    group: str = field(default="")
    # Set by the server: lets the instance send requests to other models (Triton's BLS). Await
    # it from the event loop, i.e. from an `async def execute`.
    infer: InferFunction | None = field(default=None, compare=False)


class InstanceDied(Exception):
    """Raised by `execute` when the instance itself is gone (its process died). The requests of
    that batch fail with the reason; the server marks the model UNAVAILABLE and starts a new
    instance in its place."""


def undo_reshape(
    model: str, name: str, array: np.ndarray, dims: tuple[int, ...] | None, batching: bool
) -> np.ndarray:
    """An output as the client sees it: a model output the config `reshape`s goes back to the
    config's `dims` (after the batch dimension, when the model batches)."""
    if dims is None:
        return array
    lead = array.shape[:1] if batching else ()
    try:
        return array.reshape(lead + tuple(dims))
    except ValueError:
        raise internal(
            f"model '{model}' output '{name}' of shape {list(array.shape)} cannot take the "
            f"config's dims {list(dims)}"
        ) from None


# An execute() result per request: a response, or the error that request failed with, or None
# for a request of a decoupled model, which answers through `request.sender` instead.
Result = InferenceResponse | TritonError | None


class BackendInstance(ABC):
    """One execution context (an ONNX session, a python process…). Executes one batch at a time."""

    @abstractmethod
    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        """Run the requests; return exactly one result per request, in order. May be
        `async def` (then it runs on the event loop and must not block)."""

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """Release what the instance holds."""


class BackendModel(ABC):
    """A loaded model version: shared state for its instances."""

    @abstractmethod
    def create_instance(self, context: InstanceContext) -> BackendInstance: ...

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """Release what the model holds after all its instances are finalized."""


class Backend(ABC):
    """A backend (onnxruntime, pytorch, python…): created once per server by the registry."""

    #: Triton's backend name, as written in `backend:`.
    name: str = ""
    #: `platform:` values that select this backend.
    platforms: tuple[str, ...] = ()
    #: The file (or folder) name a version folder holds when the config names none.
    default_model_filename: str = ""

    def initialize(self) -> None:  # noqa: B027 - optional hook
        """Once, before the first model of this backend loads."""

    def auto_complete_config(self, config: ModelConfig, version_dir: Path) -> ModelConfig:
        """Fill what the config leaves out (inputs, outputs, max_batch_size) from the model file
        in `version_dir`. The default completes nothing."""
        return config

    @abstractmethod
    def load_model(self, context: ModelContext) -> BackendModel:
        """Initialize one version of a model; raising (TritonError or any error) fails the load."""

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """At server shutdown."""
