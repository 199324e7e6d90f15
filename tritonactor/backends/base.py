"""The backend API, mirroring Triton's lifecycle:

    backend init -> model init -> instance init -> execute(requests)... -> finalize

A backend is found by name in the registry. Every method may block: the instance actor calls
them off the event loop (a backend whose `execute` is `async def` is awaited on the loop instead,
and one that sets `BackendInstance.may_run_on_loop` has its short executes run on the loop).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

import numpy as np

from tritonactor._proto.inference import ModelConfig, ModelInput, ModelOutput
from tritonactor.core.errors import TritonError, internal
from tritonactor.core.paths import inside
from tritonactor.core.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from tritonactor.actors import Reply


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


def version_file(version_dir: Path, filename: str) -> Path:
    """The model file `filename` of a version folder, joined as Triton joins it (a leading `/`
    stays inside the folder); a name that climbs out of the model folder is refused. The load
    has checked the names a caller's config changes for symlinks leaving the folder
    (docs/confinement.md)."""
    return inside(
        version_dir.parent,
        f"{version_dir.name}/{filename.lstrip('/')}",
        what=f"default_model_filename '{filename}'",
        trust_links=True,
    )


# Runs a request on any loaded model through the server's router (what BLS calls).
InferFunction = Callable[[InferenceRequest], Awaitable[InferenceResponse]]
# Queues a request on any loaded model and returns its reply at once (`Router.submit`): the
# responses of a decoupled model come through the request's `sender` (a streamed BLS call).
SubmitFunction = Callable[[InferenceRequest], "Reply[InferenceResponse]"]


class ModelControl(Protocol):
    """What a model may do to other models (Triton's BLS model loading: `pb_utils.load_model`,
    `unload_model`, `is_model_ready`). Awaited on the event loop."""

    async def load(
        self, name: str, config: str = "", files: Mapping[str, bytes] | None = None
    ) -> None: ...

    async def unload(self, name: str, unload_dependents: bool = False) -> None: ...

    async def ready(self, name: str, version: str = "") -> bool: ...


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
    # Set by the server: the same, streamed (call it on the event loop).
    submit: SubmitFunction | None = field(default=None, compare=False)
    # Set by the server: loads and unloads of other models.
    control: ModelControl | None = field(default=None, compare=False)


class InstanceDied(Exception):
    """Raised by `execute` when the instance itself is gone (its process died). The requests of
    that batch fail with the reason; the server marks the model UNAVAILABLE and starts a new
    instance in its place."""


def model_reshape(
    tensor: ModelInput | ModelOutput, model_rank: int, batching: bool
) -> tuple[int, ...] | None:
    """The per-item shape a model file wants for a config tensor, None when it is the config's
    `dims`: the config's `reshape`, or, for a scalar of a model that does not batch (a rank-0
    tensor, which a config gives as dims [1], as Triton's backends take it), the empty shape."""
    if tensor.reshape is not None:
        return tuple(tensor.reshape.shape)
    if not batching and model_rank == 0 and tuple(tensor.dims) == (1,):
        return ()
    return None


def reshaped(
    data: np.ndarray, source: tuple[int, ...], target: tuple[int, ...], batching: bool
) -> np.ndarray:
    """`data`, whose config shape is `source`, in the config shape `target` (after the batch
    dimension, when the model batches), as Triton's `reshape` moves a tensor: each -1 of
    `target` takes, in order, the size of `data`'s variable dimensions (-1 in `source`).
    ValueError when the sizes do not fit."""
    lead = data.shape[:1] if batching else ()
    item = data.shape[len(lead) :]
    sizes = iter([size for dim, size in zip(source, item, strict=False) if dim == -1])
    return data.reshape(lead + tuple(next(sizes, -1) if dim == -1 else dim for dim in target))


def undo_reshape(
    model: str,
    name: str,
    array: np.ndarray,
    dims: tuple[int, ...] | None,
    batching: bool,
    reshape: tuple[int, ...] = (),
) -> np.ndarray:
    """An output as the client sees it: a model output the config `reshape`s (the model makes
    it in `reshape`) goes back to the config's `dims`."""
    if dims is None:
        return array
    try:
        return reshaped(array, reshape, dims, batching)
    except ValueError:
        raise internal(
            f"model '{model}' output '{name}' of shape {list(array.shape)} cannot take the "
            f"config's dims {list(dims)}"
        ) from None


class Reschedule:
    """The result of a request the model released with Triton's RESCHEDULE flag: run it again.
    Only a sequence batcher with `iterative_sequence` takes it back; other schedulers fail it."""

    _instance: Reschedule | None = None

    def __new__(cls) -> Reschedule:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "RESCHEDULE"


RESCHEDULE = Reschedule()


class Deferred:
    """The result of a request that the backend gives after execute returned (a python model
    answering through its response sender from a thread of its own): the instance actor answers
    the request when it is resolved. `resolve` may be called from any thread, once; later calls
    are ignored. The backend must resolve every Deferred it returns (with an error when it can
    no longer answer, e.g. its process died)."""

    __slots__ = ("_callback", "_lock", "_result")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._result: InferenceResponse | TritonError | None = None
        self._callback: Callable[[InferenceResponse | TritonError], None] | None = None

    @property
    def resolved(self) -> bool:
        return self._result is not None

    def resolve(self, result: InferenceResponse | TritonError) -> bool:
        """Give the request its answer; False if it already had one."""
        with self._lock:
            if self._result is not None:
                return False
            self._result = result
            callback = self._callback
        if callback is not None:
            callback(result)
        return True

    def on_resolved(self, callback: Callable[[InferenceResponse | TritonError], None]) -> None:
        """Call `callback(result)` once resolved (at once when it already is), on the thread that
        resolves it."""
        with self._lock:
            result = self._result
            if result is None:
                self._callback = callback
                return
        callback(result)

    def __repr__(self) -> str:
        return f"Deferred({self._result!r})"


# An execute() result per request: a response, or the error that request failed with, or None
# for a request of a decoupled model, which answers through `request.sender` instead, or
# RESCHEDULE for a request the model wants to see again, or a Deferred that the backend
# resolves later.
Result = InferenceResponse | TritonError | Reschedule | Deferred | None


class BackendInstance(ABC):
    """One execution context (an ONNX session, a python process…). Executes one batch at a time."""

    #: Whether a short `execute` may run on the event loop itself: one that only computes (it
    #: never waits on another thread, process or request). The instance actor then runs a batch
    #: there when the previous one took less than a hop to the worker thread costs, and a small
    #: batch's inputs; else on the instance's worker thread.
    may_run_on_loop: bool = False

    @abstractmethod
    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        """Run the requests; return exactly one result per request, in order. May be
        `async def` (then it runs on the event loop and must not block)."""

    def abort_create(self, context: InstanceContext) -> None:  # noqa: B027 - optional hook
        """Cut short a `create_instance(context)` under way on another thread, whose caller was
        cancelled (the server stopping past its exit timeout, the load given up): it should
        then raise soon. By default the creation runs to its end, abandoned."""

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
    #: The server's `--backend-config` settings for this backend (the global ones overlaid by
    #: its own), set by the registry before `initialize`.
    backend_config: Mapping[str, str] = MappingProxyType({})

    def initialize(self) -> None:  # noqa: B027 - optional hook
        """Once, before the first model of this backend loads."""

    def auto_complete_config(self, config: ModelConfig, version_dir: Path) -> ModelConfig:
        """Fill what the config leaves out (inputs, outputs, max_batch_size) from the model file
        in `version_dir`. The default completes nothing."""
        return config

    def check_model(self, context: ModelContext) -> None:  # noqa: B027 - optional hook
        """Raise what `load_model` would refuse about the model's file against its config (a
        config tensor the file lacks...), without serving it: `repository inspect` calls it.
        The default checks nothing."""

    @abstractmethod
    def load_model(self, context: ModelContext) -> BackendModel:
        """Initialize one version of a model; raising (TritonError or any error) fails the load."""

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """At server shutdown."""
