"""Triton's generate extension: `POST /v2/models/{m}[/versions/{v}]/generate` and
`/generate_stream`. The body is one JSON object: a key that names an input of the model is that
input (a scalar or an array, shaped by the model's metadata), any other key a request parameter;
the reserved key `parameters` holds more of either. The answer is one JSON object per response:
`id` (when set), `model_name`, `model_version`, the response's parameters and its outputs (an
output of one element as a scalar), keys in sorted order. `/generate` answers exactly one
response; `/generate_stream` sends every response of the model (decoupled or not) as a
Server-Sent Event, `data: {...}` and a blank line.

As in Triton 2.51:

- Errors found before the request runs (a bad body, an unknown model, a request that does not
  fit the model) are an `application/json` `{"error": ...}` with the error's status; the JSON
  parser's own errors are 500.
- Once the model answers, the status is set by its first response: 400 when it is an error
  (whatever the error's code) or cannot be written as JSON (FP16, BF16), otherwise 200. A later
  error is one more event (`data: {"error": ...}`).
- `/generate` on a model that sends other than one response answers its first response's status
  (200 when that one succeeded) with the error "generate expects model to produce exactly 1
  response...".
- A client that disconnects before the answer (or, on `/generate_stream`, at any time) cancels
  its request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Generic, TypeVar

import anyio
import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tritonactor.actors import Reply
from tritonactor.actors.loop import on_loop
from tritonactor.actors.mailbox import Mailbox, MailboxClosed
from tritonactor.core.datatypes import BINARY_ONLY, num_elements, to_numpy_dtype
from tritonactor.core.errors import TritonError, internal, invalid_arg
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    ParameterValue,
    ResponseSender,
    Tensor,
)
from tritonactor.frontends.http.errors import JSON
from tritonactor.frontends.http.json_body import encode_json
from tritonactor.frontends.http.limits import DEFAULT_JSON_DEPTH, check_json_depth
from tritonactor.frontends.http.responses import non_finite_values, with_non_finite
from tritonactor.scheduling.router import Router
from tritonactor.scheduling.signature import ModelSignature, TensorSpec

__all__ = ["GenerateRoutes", "decode_generate_request", "encode_generate_response"]

EVENT_STREAM = "text/event-stream; charset=utf-8"
ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)
_INT64 = (-(2**63), 2**63 - 1)
# One answer of the model as the front end receives it: a response, or an error; `final` ends.
Event = tuple[InferenceResponse | None, TritonError | None, bool]
T = TypeVar("T")


class GenerateRoutes:
    """The two endpoints, over the server's router."""

    def __init__(self, router: Router, max_depth: int = DEFAULT_JSON_DEPTH) -> None:
        self.router = router
        self.max_depth = max_depth  # how deep a request's JSON may nest

    async def generate(self, request: Request) -> Response:
        events, infer_request = await self._start(request)

        async def collect() -> tuple[int, list[bytes]]:
            status, bodies = None, []
            async for response, error in _answers(events):
                body, failed = _event_json(response, error)
                if status is None:
                    status = 400 if failed else 200
                bodies.append(body)
            return status or 200, bodies

        answered = await _unless_client_leaves(request, infer_request, collect())
        if answered is None:
            return Response(status_code=499)  # nobody reads it: the client has left
        status, bodies = answered.value
        if len(bodies) != 1:
            bodies = [encode_json({"error": ONE_RESPONSE})]
        return Response(bodies[0], status_code=status, media_type=JSON)

    async def generate_stream(self, request: Request) -> Response:
        events, infer_request = await self._start(request)
        answers = _answers(events)
        # The first answer decides the status; none at all (a bare final flag) is 200. A client
        # that leaves while the model works on it cancels the request.
        waited = await _unless_client_leaves(request, infer_request, anext(answers, None))
        if waited is None:
            return Response(status_code=499)
        first, status = waited.value, 200
        if first is not None:
            first_body, failed = _event_json(*first)
            status = 400 if failed else 200

        async def body() -> AsyncIterator[bytes]:
            try:
                if first is not None:
                    yield _sse(first_body)
                async for response, error in answers:
                    yield _sse(_event_json(response, error)[0])
            except BaseException:
                infer_request.cancel()  # the client left: the model may stop early
                raise

        return StreamingResponse(body(), status_code=status, media_type=EVENT_STREAM)

    async def _start(self, request: Request) -> tuple[Mailbox[Event], InferenceRequest]:
        """Decode the request and submit it: its answers arrive on the returned stream."""
        name = request.path_params["model"]
        version = request.path_params.get("version")
        version = "" if version is None else str(version)
        if self.router.loader is not None:
            await self.router.ensure_loaded(name)
        handle = self.router.resolve(name, version)
        # As Triton reads it: `identity` exactly (uvicorn has trimmed the spaces around it).
        encoding = request.headers.get("content-encoding", "identity")
        if encoding not in ("", "identity"):
            raise invalid_arg("Unsupported content-encoding, only 'identity' is supported.")
        body = await request.body()
        infer_request = decode_generate_request(
            body, handle.signature, name, version, self.max_depth
        )
        events: Mailbox[Event] = Mailbox.for_stream()

        def deliver(
            response: InferenceResponse | None, error: TritonError | None, final: bool
        ) -> None:
            # Runs where the answer comes from (an actor): it must never raise there. A closed
            # stream means the client left: nobody reads the answer.
            with contextlib.suppress(MailboxClosed):
                events.put_nowait((response, error, final))
            if final:
                events.close()

        deliver_on_loop = on_loop(deliver)
        if handle.decoupled:
            sender = ResponseSender(deliver_on_loop)
            infer_request.sender = sender
            reply = self.router.submit(infer_request)
            reply.add_done_callback(lambda done: sender.end_if_failed(done.result))
        else:
            reply = self.router.submit(infer_request)
            reply.add_done_callback(lambda done: deliver_on_loop(*_outcome(done), True))
        return events, infer_request


def _outcome(
    reply: Reply[InferenceResponse],
) -> tuple[InferenceResponse | None, TritonError | None]:
    try:
        return reply.result(), None
    except TritonError as error:
        return None, error
    except Exception as error:
        return None, internal(f"{type(error).__name__}: {error}")


async def _answers(
    events: Mailbox[Event],
) -> AsyncIterator[tuple[InferenceResponse | None, TritonError | None]]:
    """The model's answers (a bare final flag is none); once done with, what the model sends
    later is dropped."""
    try:
        async for response, error, _final in events:
            if response is not None or error is not None:
                yield response, error
    finally:
        events.leave()


@dataclasses.dataclass(frozen=True, slots=True)
class _Got(Generic[T]):
    value: T


async def _unless_client_leaves(
    request: Request, infer_request: InferenceRequest, waiting: Awaitable[T]
) -> _Got[T] | None:
    """What `waiting` gives, or None when the client disconnects first: the request is then
    cancelled (the model may stop early). The ASGI server does not cancel a handler whose
    client left, so the connection is watched here."""
    got: list[_Got[T]] = []
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            infer_request.cancel()
            group.cancel_scope.cancel()

        group.start_soon(watch)
        try:
            got.append(_Got(await waiting))
        except BaseException:
            infer_request.cancel()
            raise
        group.cancel_scope.cancel()
    return got[0] if got else None


def _sse(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def _event_json(
    response: InferenceResponse | None, error: TritonError | None
) -> tuple[bytes, bool]:
    """The JSON of one answer, and whether it is an error. As in Triton, an error the model
    answers and an output JSON cannot carry are both errors of the request (400)."""
    if error is None and response is not None:
        try:
            return encode_json(encode_generate_response(response)), False
        except TritonError as failed:
            error = failed
    assert error is not None
    return encode_json({"error": error.message}), True


# --- the response ------------------------------------------------------------------------------


def encode_generate_response(response: InferenceResponse) -> dict[str, Any]:
    """The JSON object of one response: reserved keys, then parameters, then outputs (the first
    of a name wins), in sorted key order."""
    fields: dict[str, Any] = {}
    if response.id:
        fields["id"] = response.id
    fields["model_name"] = response.model_name
    fields["model_version"] = response.model_version
    for key, value in response.parameters.items():
        fields.setdefault(key, value)
    for tensor in response.outputs:
        if tensor.name not in fields:
            fields[tensor.name] = _output_value(tensor)
    return {key: fields[key] for key in sorted(fields)}


def _output_value(tensor: Tensor) -> Any:
    if tensor.datatype in BINARY_ONLY:
        raise invalid_arg(
            f"sending {tensor.datatype} data via JSON is not supported. Please use the binary "
            "data format for output"
        )
    flat = np.asarray(tensor.data).reshape(-1)
    if flat.size != num_elements(tensor.shape):
        raise internal(f"output tensor shape does not match size of output for '{tensor.name}'")
    if tensor.datatype == "BYTES":
        values: list[Any] = [
            item.decode(errors="replace") if isinstance(item, bytes | bytearray) else str(item)
            for item in flat.tolist()
        ]
    elif flat.dtype.kind == "f" and not np.isfinite(flat).all():
        # NaN and the infinities as Triton writes them (orjson would write null)
        doubles = flat.astype(np.float64)  # (the finite ones as tolist() writes them)
        if flat.size == 1:
            return orjson.Fragment(non_finite_values(doubles)[0])
        return with_non_finite(doubles)
    else:
        values = flat.tolist()
    return values[0] if len(values) == 1 else values


# --- the request -------------------------------------------------------------------------------


def decode_generate_request(
    body: bytes,
    signature: ModelSignature,
    model_name: str,
    model_version: str,
    max_depth: int = DEFAULT_JSON_DEPTH,
) -> InferenceRequest:
    """The inference request a generate body asks for: its keys in order, each an input of the
    model or a parameter (Triton's messages and codes); JSON nested deeper than `max_depth` is
    refused before it is parsed."""
    check_json_depth(body, max_depth)
    try:
        document = json.loads(body, object_pairs_hook=_Pairs)
    except (ValueError, UnicodeDecodeError) as error:
        raise internal(f"failed to parse the request JSON buffer: {error}") from None
    if not isinstance(document, _Pairs):
        raise internal("attempt to get members for non-object")
    request_id = ""
    for key, value in document:
        if key == "id":
            if not isinstance(value, str):
                raise internal("Unable to parse 'id': attempt to access JSON non-string as string")
            request_id = value
            break
    request = InferenceRequest(model_name=model_name, model_version=model_version, id=request_id)
    _Converter(signature, request).members(document, top=True)
    return request


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its members in order, duplicates kept (Triton reports a duplicate
    input)."""


class _Converter:
    def __init__(self, signature: ModelSignature, request: InferenceRequest) -> None:
        self.inputs = {spec.name: spec for spec in signature.inputs}
        self.batching = signature.max_batch_size
        self.request = request
        self.prefix = f"[request id: {request.id or '<id_unknown>'}] "

    def members(self, document: _Pairs, top: bool) -> None:
        for key, value in document:
            if top and key == "parameters":
                self.nested(key, value)
            elif key in self.inputs:
                self.input(self.inputs[key], value)
            else:
                self.parameter(key, value)

    def nested(self, key: str, value: Any) -> None:
        if key in self.inputs:
            raise invalid_arg(f"Keyword '{key}' for nested schema also given as input tensor name")
        if not isinstance(value, _Pairs):
            raise internal(
                f"Expected JSON object for keyword: '{key}': attempt to access JSON non-object "
                "as object"
            )
        try:
            self.members(value, top=False)
        except TritonError as error:
            raise TritonError(error.code, f"Converting keyword: '{key}': {error.message}") from None

    def parameter(self, key: str, value: Any) -> None:
        self.request.parameters[key] = _parameter(key, value)

    def input(self, spec: TensorSpec, value: Any) -> None:
        if self.request.input(spec.name) is not None:
            raise invalid_arg(f"{self.prefix}input '{spec.name}' already exists in request")
        count = len(value) if isinstance(value, list) else 1
        leaves = _leaves(value)
        if spec.datatype == "BYTES" and not all(isinstance(v, str) for v in leaves):
            raise internal(
                "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
            )
        shape = _shape(spec.name, spec.shape(self.batching), count)
        data = _tensor_data(spec.name, spec.datatype, leaves, count)
        self.request.inputs.append(Tensor(spec.name, spec.datatype, shape, data.reshape(shape)))


def _parameter(key: str, value: Any) -> ParameterValue:
    if isinstance(value, bool | str | float):
        return value
    if isinstance(value, int):
        # A JSON integer past int64 is a double to Triton's parser.
        return value if _INT64[0] <= value <= _INT64[1] else float(value)
    raise invalid_arg(
        f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
    )


def _leaves(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return [value]
    flat: list[Any] = []
    for item in value:
        flat.extend(_leaves(item))
    return flat


def _shape(name: str, dims: list[int], count: int) -> tuple[int, ...]:
    """Triton's two passes: the fixed dimensions take their share of the `count` elements, the
    innermost variable one the rest, other variable ones 1."""
    shape = list(dims)
    for dim in reversed(shape):
        if dim != -1:
            if dim == 0 or count % dim:
                raise _no_shape(name)
            count //= dim
    for i in reversed(range(len(shape))):
        if shape[i] == -1:
            shape[i] = count
            count = 1
    if count != 1:
        raise _no_shape(name)
    return tuple(shape)


def _no_shape(name: str) -> TritonError:
    return invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")


_KIND_ERRORS = {
    "b": "attempt to access JSON non-boolean as boolean",
    "u": "attempt to access JSON non-unsigned-integer as unsigned-integer",
    "i": "attempt to access JSON non-signed-integer as signed-integer",
    "f": "attempt to access JSON non-number as double",
}


def _tensor_data(name: str, datatype: str, leaves: list[Any], count: int) -> np.ndarray:
    if datatype in BINARY_ONLY:
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}"
        )
    if len(leaves) != count:
        raise internal("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype == "BYTES":
        array = np.empty(len(leaves), dtype=np.object_)
        array[:] = [leaf.encode() for leaf in leaves]
        return array
    dtype = to_numpy_dtype(datatype)
    for leaf in leaves:
        if not _fits_kind(leaf, dtype.kind):
            raise internal(f"Unable to parse 'data': {_KIND_ERRORS[dtype.kind]}")
    if dtype.kind in "iu":
        limits = np.iinfo(dtype)
        if any(not limits.min <= leaf <= limits.max for leaf in leaves):
            raise invalid_arg(
                f"'data' of input '{name}' holds a value outside the {datatype} range "
                f"[{limits.min}, {limits.max}]"
            )
    return np.array(leaves, dtype=dtype)


def _fits_kind(leaf: Any, kind: str) -> bool:
    if kind == "b":
        return isinstance(leaf, bool)
    if isinstance(leaf, bool):
        return False
    if kind == "f":
        return isinstance(leaf, int | float)
    if not isinstance(leaf, int):
        return False
    if kind == "u":
        return 0 <= leaf < 2**64
    return _INT64[0] <= leaf <= _INT64[1]
