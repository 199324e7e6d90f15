"""Requests, responses and response senders of `triton_python_backend_utils` (re-exported there).
Runs in the stub process; what needs the server goes through `_pb_runtime.stub`."""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Awaitable
from typing import Any

from tritonactor.backends.python import _pb_runtime as runtime
from tritonactor.backends.python._pb_tensors import (
    Tensor,
    TritonError,
    TritonModelException,
    check_tensors,
)

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
# Triton's pb_utils.MemoryType values (its PreferredMemory's, not TRITONSERVER_MemoryType's).
TRITONSERVER_MEMORY_GPU = 0
TRITONSERVER_MEMORY_CPU = 1


def _parameters_json(parameters: Any) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        json.loads(parameters)  # fail early on a malformed string
        return parameters
    if not isinstance(parameters, dict):
        raise TypeError(f"parameters must be a dict or a JSON string, not {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, bool | int | str | float):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return json.dumps(parameters)


class InferenceResponse:
    """InferenceResponse(output_tensors=[...], error=None, parameters=None)."""

    def __init__(
        self,
        output_tensors: Any = (),
        error: TritonError | str | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = check_tensors(
            output_tensors,
            "InferenceResponse output_tensors",
            "Output tensor for inference response should not be empty.",
        )
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters

    def __repr__(self) -> str:
        return f"InferenceResponse({self._outputs!r}, error={self._error!r})"


class ResponseSender:
    """How a request answers through the server at any time, from any thread:
    send(response=None, flags=0), the last time with flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL.
    A decoupled model may send any number of responses; any other model exactly one (then, if
    it likes, a bare final flag), as Triton checks."""

    def __init__(
        self, key: int, decoupled: bool = True, requested: frozenset[str] = frozenset()
    ) -> None:
        self._key = key
        self._decoupled = decoupled
        # Outputs the client asked for (all the model's, when it named none): the rest are
        # dropped before they travel.
        self._requested = requested
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0
        self._cancelled = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(
                f"send() takes a pb_utils.InferenceResponse, not {type(response).__name__}"
            )
        stub = runtime.require("ResponseSender.send")
        self._account(response is not None, flags)
        stub.send_response(self._key, response, flags, self._requested)

    def _account(self, has_response: bool, flags: int) -> None:
        """Count one response (or final flag) against Triton's rules; raises without counting
        what they refuse."""
        with self._lock:
            if not self._decoupled:
                if has_response and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than "
                        "one response."
                    )
                if not has_response and self._sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete "
                        "final before sending a response."
                    )
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
            self._sent += 1

    def _close(self) -> None:
        """The server ended the request (an execute error, a reschedule): no more sends."""
        with self._lock:
            self._closed = True

    @property
    def _is_closed(self) -> bool:
        return self._closed

    def is_cancelled(self) -> bool:
        """Whether the server cancelled this request (its client went away): asks the server
        each time until the answer is True, which then stays."""
        if not self._cancelled:
            self._cancelled = _ask_cancelled(self._key)
        return self._cancelled

    def __del__(self) -> None:
        # The model let go of a request it never finished: the server fails it rather than let
        # its client wait forever.
        if not getattr(self, "_closed", True) and runtime.stub is not None:
            runtime.stub.sender_dropped(self._key)


class InferenceTrace:
    """The trace of a request, as `request.trace()` gives it: `get_context()` is the W3C trace
    context the server propagates (a JSON string such as '{"traceparent": "00-..."}'), or None
    when the request is not traced. Pass it on as `InferenceRequest(..., trace=...)` and a BLS
    call joins the request's trace."""

    def __init__(self, context: dict[str, str] | None = None, key: int | None = None) -> None:
        self._context = context
        # The request the server knows this trace by (None: no request of this execute).
        self._key = key

    def get_context(self) -> str | None:
        # Compact, as Triton writes it: {"traceparent":"00-..."}.
        return None if self._context is None else json.dumps(self._context, separators=(",", ":"))


class PreferredMemory:
    """Where a BLS response's tensors should be (tritonactor's are always in CPU memory)."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


def _integer(value: Any, what: str) -> int:
    """`value` as an int, as Triton's bindings convert it: whatever has `__index__` or
    `__int__` (a bool, numpy's integers, booleans and floats but a Python float); TypeError
    otherwise."""
    if value is None or isinstance(value, float | str | bytes):
        raise TypeError(f"InferenceRequest {what} has the wrong type: {type(value).__name__}")
    try:
        return operator.index(value)
    except TypeError:
        if not hasattr(type(value), "__int__"):
            raise TypeError(
                f"InferenceRequest {what} has the wrong type: {type(value).__name__}"
            ) from None
        return int(value)


def _check(value: Any, kind: type | tuple[type, ...], what: str) -> None:
    if value is None or (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
        raise TypeError(f"InferenceRequest {what} has the wrong type: {type(value).__name__}")


class InferenceRequest:
    """A request the model receives in execute(), or one it builds to call another model (BLS):
    InferenceRequest(model_name=..., inputs=[...], requested_output_names=[...]) then .exec() or
    await .async_exec() (decoupled=True: an iterator of the responses)."""

    def __init__(
        self,
        model_name: str = "",
        inputs: Any = (),
        requested_output_names: Any = (),
        model_version: int = -1,
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        _check(model_name, str, "model_name")
        _check(request_id, str, "request_id")
        model_version = _integer(model_version, "model_version")
        # Triton's bindings take a uint32: anything an int can be made of (a bool, numpy's)
        flags = _integer(flags, "flags")
        if not 0 <= flags <= UINT32_MAX:
            raise TypeError(f"InferenceRequest flags must be a uint32, got {flags}")
        _check(timeout, int, "timeout")
        if correlation_id is None:  # as Triton's bindings refuse it
            raise TypeError("InferenceRequest correlation_id has the wrong type: NoneType")
        if not isinstance(correlation_id, int | str):  # numpy's too: Triton's check and words
            raise TritonModelException("Correlation ID must be integer or string")
        if isinstance(correlation_id, bool):
            correlation_id = int(correlation_id)  # True is 1, as in Triton
        if isinstance(correlation_id, int) and not 0 <= correlation_id <= UINT64_MAX:
            # pybind11's words where Triton's bindings cannot take the number (a uint64).
            raise RuntimeError(
                "Unable to cast Python instance to C++ type (#define "
                "PYBIND11_DETAILED_ERROR_MESSAGES or compile in debug mode for details)"
            )
        if requested_output_names is None or isinstance(requested_output_names, str):
            raise TypeError("InferenceRequest requested_output_names must be a list of str")
        requested = list(requested_output_names)
        for name in requested:
            _check(name, str, "requested_output_names")
        self._model_name = model_name
        self._inputs = check_tensors(inputs, "InferenceRequest inputs")
        self._requested = requested
        self._model_version = model_version
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory
        self._parameters = _parameters_json(parameters)
        self._sender: ResponseSender | None = None
        # Set on the requests execute() receives: how the server knows this request.
        self._key: int | None = None
        self._cancelled = False
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace()

    @classmethod
    def _received(
        cls,
        entry: dict[str, Any],
        inputs: list[Tensor],
        sender: ResponseSender,
        trace: InferenceTrace,
    ) -> InferenceRequest:
        """A request execute() receives, from the server's entry for it (see
        `backends.python.wire.request_entry`): the server built it, so nothing is checked."""
        self = cls.__new__(cls)
        self._model_name = entry["model_name"]
        self._inputs = inputs
        self._requested = entry["outputs"]
        self._model_version = entry["model_version"]
        self._request_id = entry["id"]
        self._correlation_id = entry["correlation_id"]
        self._flags = entry["flags"]
        self._timeout = entry.get("timeout", 0)
        self._preferred_memory = None
        parameters = entry["parameters"]
        # A client's parameters as Triton's server writes them: compact JSON.
        # (UTF-8 as it came, as Triton writes the text)
        self._parameters = (
            json.dumps(parameters, separators=(",", ":"), ensure_ascii=False)
            if parameters
            else "{}"
        )
        self._sender = sender
        self._key = entry["key"]
        self._cancelled = False
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._trace = trace
        return self

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        _check(flags, int, "flags")
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> set[str]:
        """The outputs the client asked for; every output of the model when it named none (a
        set, as Triton gives it)."""
        return set(self._requested)

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> ResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "Unable to get the response sender: only a request given to execute() has one"
            )
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: once execute returns, the server runs this
        request again (a model with `sequence_batching { iterative_sequence: true }` only)."""
        _check(flags, int, "release flags")
        self._release_flags = flags

    def is_cancelled(self) -> bool:
        """Whether the server cancelled this request (its client went away); always False for a
        request the model built itself (BLS)."""
        if not self._cancelled:
            self._cancelled = _ask_cancelled(self._key)
        return self._cancelled

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on `model_name` through the server and wait for the answer; an
        error comes back as a response whose has_error() is true. With decoupled=True: an
        iterator of every response, the last one empty when the model ended with a bare final
        flag (as Triton's)."""
        _check(decoupled, bool, "decoupled")
        return runtime.require("InferenceRequest.exec").bls(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """exec(), awaited on the model's event loop without blocking it. With decoupled=True
        the iterator may also be walked with `async for`."""
        _check(decoupled, bool, "decoupled")
        return runtime.require("InferenceRequest.async_exec").bls_async(self, decoupled)


def _ask_cancelled(key: int | None) -> bool:
    if key is None or runtime.stub is None:
        return False
    return bool(runtime.stub.is_cancelled(key))
