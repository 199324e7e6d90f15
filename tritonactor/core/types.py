"""The request and response that travel between front ends, schedulers and backends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# KServe v2 parameter values: what both the HTTP JSON and gRPC InferParameter can carry.
ParameterValue = bool | int | float | str
Parameters = dict[str, ParameterValue]


@dataclass(slots=True)
class Tensor:
    """A named tensor. `data` has the numpy dtype of `datatype` and the shape `shape`;
    BYTES data is an object array of `bytes`."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (e.g. `binary_data`)."""

    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferenceRequest:
    """One inference request, decoded from the wire. `model_version` is "" when the client
    left it to the model's version policy."""

    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: Parameters = field(default_factory=dict)
    # Filled by the router: the version that will serve the request.
    resolved_version: int = 0
    # Per-request state a scheduler or backend may attach (e.g. a trace context).
    context: dict[str, Any] = field(default_factory=dict)

    def input(self, name: str) -> Tensor | None:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        return None

    @property
    def requested_output_names(self) -> list[str]:
        return [output.name for output in self.outputs]


@dataclass(slots=True)
class InferenceResponse:
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: Parameters = field(default_factory=dict)
