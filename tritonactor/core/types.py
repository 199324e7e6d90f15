"""The request and response that travel between front ends, schedulers and backends."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tritonactor.core.errors import TritonError, internal

# An object's name (a requested output's), read in C.
_NAME = operator.attrgetter("name")


class Trace(Protocol):
    """What a traced request carries through the layers below the front end. The one
    implementation is `observability.tracing.RequestTrace`; core knows nothing of
    OpenTelemetry, so the dependency points one way."""

    def child(self) -> Trace:
        """The trace of a request made on this one's behalf (an ensemble step, a BLS call)."""
        ...

    def carrier(self) -> dict[str, str]:
        """The W3C trace context (`traceparent`...), for a python model that continues it."""
        ...

    def crossing(self) -> tuple[Any, ...]:
        """The trace context as plain values, for an engine in another process that continues
        it."""
        ...

    def describe(self, request: InferenceRequest) -> None: ...

    def routed(
        self, request: InferenceRequest, started: int, error: BaseException | None = None
    ) -> None: ...

    def end(self, error: BaseException | None = None) -> None: ...


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# KServe v2 parameter values: what both the HTTP JSON and gRPC InferParameter can carry.
ParameterValue = bool | int | float | str
Parameters = dict[str, ParameterValue]

# Request parameters the server itself acts on (sequence controls, priority, queue timeout): as
# in Triton, a model does not see them among its request's parameters.
SCHEDULING_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout"}
)

# A request's `context` keys for outputs due in a client's system shared memory. Under
# OUTPUT_BUFFERS, a function of the request that tells a backend able to write an output there
# itself (ONNX Runtime) where each goes, as {output name: writable bytes}: asked right before the
# run, it leaves out places that overlap an input or one another, and those whose region is
# gone. Whatever a backend returns elsewhere is copied there afterwards, as always. Under
# OUTPUTS_IN_PLACE, the bytes the backend wrote so (for the instance: the copy it spared).
OUTPUT_BUFFERS = "output_buffers"
OUTPUTS_IN_PLACE = "outputs_in_place"


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

    __slots__ = ("_cancelled", "_deliver", "_final", "_holds_up")

    def __init__(
        self,
        deliver: Callable[[InferenceResponse | None, TritonError | None, bool], None],
        holds_up: bool = False,
    ) -> None:
        self._deliver = deliver
        self._final = False
        self._cancelled = False
        self._holds_up = holds_up

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

    def end_if_failed(self, outcome: Callable[[], object]) -> None:
        """The request's execute is over (`outcome()` returns, or raises its failure): if it
        failed before the model sent the final response, that failure is the request's last
        answer. Whoever streams a decoupled model's responses calls it from the execute's
        reply, so that a failed execute never leaves its client waiting."""
        if self._final:
            return
        try:
            outcome()
        except Exception as error:
            failure = error if isinstance(error, TritonError) else internal(_describe(error))
        else:
            return
        with contextlib.suppress(RuntimeError):  # a final answer came meanwhile (another thread)
            self.send(error=failure, final=True)

    def cancel(self) -> None:
        """The client went away: the model may stop producing responses."""
        self._cancelled = True

    def holds_up(self) -> bool:
        """Whether a send may wait (for room: an ensemble's `max_inflight_requests`; for the
        process it writes to: a python model's decoupled BLS call). Whoever sends for a
        model's thread from the event loop sends such responses from a thread instead."""
        return self._holds_up

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
    # Per-request state the front end, a scheduler or a backend may attach (never seen by the
    # model).
    context: dict[str, Any] = field(default_factory=dict)
    # Set when the model is decoupled: its responses go here instead of one reply.
    sender: ResponseSender | None = None
    # Set by the front end when the client gave up on the request (a closed stream, a cancelled
    # call): schedulers drop it if it has not run yet; a backend may stop early.
    cancelled: bool = False
    # Parameters for the model alone, kept apart so that the server never acts on them (a
    # `priority` among them is not the request's priority): the headers a front end forwards
    # (--http/--grpc-header-forward-pattern), a BLS call's own parameters.
    headers: dict[str, Any] = field(default_factory=dict)
    # Set by the front end when the request is traced; crosses every mailbox with the request
    # (a child request, an ensemble step or a BLS call, gets its parent's `trace.child()`).
    trace: Trace | None = None
    # Set by whoever must hear of a cancellation that happens here: a front end whose request
    # runs in the engine process tells the engine.
    on_cancel: Callable[[], None] | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.sender is not None:
            self.sender.cancel()
        if self.on_cancel is not None:
            self.on_cancel()

    def input(self, name: str) -> Tensor | None:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        return None

    @property
    def requested_output_names(self) -> list[str]:
        return list(map(_NAME, self.outputs))  # (in C: no comprehension's frame)

    @property
    def model_parameters(self) -> Parameters:
        """The parameters a model sees: the request's, less those the server acts on, and the
        forwarded headers (a header never replaces a parameter of the request)."""
        parameters = self.parameters
        if not SCHEDULING_PARAMETERS.isdisjoint(parameters):
            parameters = {k: v for k, v in parameters.items() if k not in SCHEDULING_PARAMETERS}
        if self.headers:
            parameters = {**self.headers, **parameters}
        return parameters


@dataclass(slots=True)
class InferenceResponse:
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: Parameters = field(default_factory=dict)
