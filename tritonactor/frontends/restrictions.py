"""Triton's restricted APIs (`--http-restricted-api`, `--grpc-restricted-protocol`): a category
of endpoints answers only calls that carry a given header with a given value.

The categories and which endpoint belongs to which are Triton's (checked against tritonserver
2.51): `health` (server live/ready, model ready), `metadata` (server and model metadata),
`inference`, `shared-memory`, `model-config`, `model-repository`, `statistics`, `trace`,
`logging`. Over gRPC the header is the key prefixed with `triton-grpc-protocol-`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from tritonactor.core.protocol import RESTRICTED_CATEGORIES

HEALTH = "health"
METADATA = "metadata"
INFERENCE = "inference"
SHARED_MEMORY = "shared-memory"
MODEL_CONFIG = "model-config"
MODEL_REPOSITORY = "model-repository"
STATISTICS = "statistics"
TRACE = "trace"
LOGGING = "logging"

CATEGORIES = RESTRICTED_CATEGORIES

GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


class Restriction(Protocol):
    """One `<api>[,<api>...]:<key>=<value>` of the command line (see the settings)."""

    @property
    def apis(self) -> frozenset[str]: ...

    @property
    def key(self) -> str: ...

    @property
    def value(self) -> str: ...


class Restrictions:
    """Which header (and value) each restricted category needs."""

    __slots__ = ("_needs",)

    def __init__(self, restrictions: Iterable[Restriction], header_prefix: str = "") -> None:
        self._needs: dict[str, tuple[str, str]] = {}
        for restriction in restrictions:
            for api in restriction.apis:
                self._needs[api] = ((header_prefix + restriction.key).lower(), restriction.value)

    def __bool__(self) -> bool:
        return bool(self._needs)

    def restricts(self, category: str) -> bool:
        """Whether calls of `category` need a header."""
        return category in self._needs

    def missing(self, category: str, get_header: Callable[[str], Any]) -> str | None:
        """None when the call may use `category`; else the header it lacks (or has with another
        value). `get_header(name)` looks a header up by its lower-case name."""
        need = self._needs.get(category)
        if need is None:
            return None
        key, value = need
        return None if get_header(key) == value else key


def http_message(key: str) -> str:
    return f"This API is restricted, expecting header '{key}'"


def grpc_message(key: str) -> str:
    return f"This protocol is restricted, expecting header '{key}'"


# gRPC methods of inference.GRPCInferenceService and grpc.health.v1.Health, by category.
GRPC_METHODS: Mapping[str, str] = {
    "/inference.GRPCInferenceService/ServerLive": HEALTH,
    "/inference.GRPCInferenceService/ServerReady": HEALTH,
    "/inference.GRPCInferenceService/ModelReady": HEALTH,
    "/grpc.health.v1.Health/Check": HEALTH,
    "/grpc.health.v1.Health/Watch": HEALTH,
    "/inference.GRPCInferenceService/ServerMetadata": METADATA,
    "/inference.GRPCInferenceService/ModelMetadata": METADATA,
    "/inference.GRPCInferenceService/ModelInfer": INFERENCE,
    "/inference.GRPCInferenceService/ModelStreamInfer": INFERENCE,
    "/inference.GRPCInferenceService/ModelConfig": MODEL_CONFIG,
    "/inference.GRPCInferenceService/ModelStatistics": STATISTICS,
    "/inference.GRPCInferenceService/RepositoryIndex": MODEL_REPOSITORY,
    "/inference.GRPCInferenceService/RepositoryModelLoad": MODEL_REPOSITORY,
    "/inference.GRPCInferenceService/RepositoryModelUnload": MODEL_REPOSITORY,
    "/inference.GRPCInferenceService/SystemSharedMemoryStatus": SHARED_MEMORY,
    "/inference.GRPCInferenceService/SystemSharedMemoryRegister": SHARED_MEMORY,
    "/inference.GRPCInferenceService/SystemSharedMemoryUnregister": SHARED_MEMORY,
    "/inference.GRPCInferenceService/CudaSharedMemoryStatus": SHARED_MEMORY,
    "/inference.GRPCInferenceService/CudaSharedMemoryRegister": SHARED_MEMORY,
    "/inference.GRPCInferenceService/CudaSharedMemoryUnregister": SHARED_MEMORY,
    "/inference.GRPCInferenceService/TraceSetting": TRACE,
    "/inference.GRPCInferenceService/LogSettings": LOGGING,
}
