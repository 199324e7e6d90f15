"""The request and response that travel between front ends, schedulers and backends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tritonactor.core.errors import TritonError
    from tritonactor.observability.tracing import RequestTrace

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


class ResponseSender:
    """Where a request of a decoupled model sends its responses: any number of them, the last
    one (or a bare flag) marked final. Safe to call from any thread: `deliver` decides how an
    answer reaches its front end."""

    __slots__ = ("_cancelled", "_deliver", "_final")

    def __init__(
        self, deliver: Callable[[InferenceResponse | None, TritonError | None, bool], None]
    ) -> None:
        self._deliver = deliver
        self._final = False
        self._cancelled = False

    def send(
        self,
        response: InferenceResponse | None = None,
        *,
        error: TritonError | None = None,
        final: bool = False,
    ) -> None:
        if self._final:
            raise RuntimeError("a final response was already sent for this request")
        self._final = final
        self._deliver(response, error, final)

    @property
    def finished(self) -> bool:
        return self._final

    def cancel(self) -> None:
        """The client went away: the model may stop producing responses."""
        self._cancelled = True

    def is_cancelled(self) -> bool:
        return self._cancelled


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
    # Per-request state a scheduler or backend may attach.
    context: dict[str, Any] = field(default_factory=dict)
    # Set when the model is decoupled: its responses go here instead of one reply.
    sender: ResponseSender | None = None
    # Set by the front end when the client gave up on the request (a closed stream, a cancelled
    # call): schedulers drop it if it has not run yet; a backend may stop early.
    cancelled: bool = False
    # Set by the front end when the request is traced; crosses every mailbox with the request
    # (a child request, an ensemble step or a BLS call, gets its parent's `trace.child()`).
    trace: RequestTrace | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.sender is not None:
            self.sender.cancel()

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
