"""The HTTP front end's core handlers (`Routes`): server and model metadata, health, the model
repository (index, load, unload, its event journal), model config and statistics, the trace and
logging extensions, and inference (`/infer`, the JSON-and-binary body or a raw one), answered
as an `InferResponse`. app.py puts them in the route table, each behind the restricted-API guard;
generate.py and shared_memory.py hold the other extensions' handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tritonactor.config.model_config import config_to_json
from tritonactor.control.load_parameters import parse_load_parameters, parse_unload_parameters
from tritonactor.core.errors import ErrorCode, TritonError, invalid_arg, unavailable, unsupported
from tritonactor.core.protocol import NAMED_REPOSITORY
from tritonactor.frontends.classification import encode_off_loop
from tritonactor.frontends.headers import HeaderForwarder
from tritonactor.frontends.http.codec import decode_infer_request
from tritonactor.frontends.http.compression import IDENTITY, deflated, inflated, response_coding
from tritonactor.frontends.http.errors import JSON, error_response, json_response
from tritonactor.frontends.http.infer_target import url_path
from tritonactor.frontends.http.json_body import decode_json
from tritonactor.frontends.http.raw import decode_raw_request
from tritonactor.frontends.http.responses import encode_infer_response
from tritonactor.memory.lease import Lease, answer_holding
from tritonactor.observability.logging import request_logger
from tritonactor.observability.tracing import RequestTrace
from tritonactor.scheduling import statistics
from tritonactor.scheduling.router import ModelHandle
from tritonactor.settings import ControlMode

if TYPE_CHECKING:
    from tritonactor.server import Server


async def _parameters(request: Request, max_depth: int) -> dict[str, Any]:
    """The `parameters` object of a repository request body (empty body: none)."""
    body = await request.body()
    data = decode_json(body, max_depth) if body.strip() else {}
    if not isinstance(data, dict):
        raise invalid_arg("the request body must be a JSON object")
    parameters = data.get("parameters", {})
    if not isinstance(parameters, dict):
        raise invalid_arg("'parameters' must be a JSON object")
    return parameters


def _query_int(
    request: Request, name: str, default: int, *, minimum: int, maximum: int | None = None
) -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise invalid_arg(f"query parameter '{name}' must be an integer {bound}, not {text!r}")
    return value


class InferResponse(Response):
    """An infer response: its body, JSON or JSON followed by binary outputs (`json_length`
    bytes of JSON, sent as `Inference-Header-Content-Length`), in one piece or in several
    (frontends/http/responses.py). Its headers are written down directly rather than worked
    out as starlette's `Response` does for any body."""

    def __init__(
        self,
        body: bytes | tuple[bytes, ...],
        json_length: int | None,
        coding: str | None = None,
    ) -> None:
        self.status_code = 200
        self.pieces = (body,) if isinstance(body, bytes) else body
        self.background = None
        size = sum(map(len, self.pieces))
        if json_length is None:
            self.raw_headers = [(b"content-length", b"%d" % size), _JSON_TYPE]
        else:
            self.raw_headers = [
                (b"inference-header-content-length", b"%d" % json_length),
                (b"content-length", b"%d" % size),
                _BINARY_TYPE,
            ]
        if coding is not None:  # the pieces are compressed (compression.py)
            self.raw_headers.append((b"content-encoding", coding.encode()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        *first, last = self.pieces
        for piece in first:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": last})


_JSON_TYPE = (b"content-type", JSON.encode())
_BINARY_TYPE = (b"content-type", b"application/octet-stream")


def _version(request: Request) -> str:
    version = request.path_params.get("version")
    return "" if version is None else str(version)


class Routes:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.router = server.router
        self.headers = HeaderForwarder(server.settings.http_header_forward_pattern)
        self.max_depth = server.settings.http_max_json_depth
        self.max_input_size = server.settings.http_max_input_size

    async def server_metadata(self, request: Request) -> Response:
        server = self.server
        return json_response(
            {"name": server.name, "version": server.version, "extensions": server.extensions}
        )

    async def live(self, request: Request) -> Response:
        return Response(status_code=200 if self.server.live else 400)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if await self.server.ready() else 400)

    async def repository_index(self, request: Request) -> Response:
        body = await request.body()
        options = decode_json(body, self.max_depth) if body.strip() else {}
        if not isinstance(options, dict):
            raise invalid_arg("the repository index request must be a JSON object")
        ready = options.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid_arg("'ready' in the repository index request must be a boolean")
        entries = []
        for entry in await self.server.index(ready_only=ready):
            # As in Triton, a model that failed before any version was tried has no version,
            # and one with nothing known about it yet has only its name.
            item = {"name": entry.name}
            if entry.version:
                item["version"] = entry.version
            if entry.state:
                item["state"] = entry.state
            if entry.reason:
                item["reason"] = entry.reason
            entries.append(item)
        return json_response(entries)

    async def load_model(self, request: Request) -> Response:
        self._check_explicit()
        name = request.path_params["model"]
        options = parse_load_parameters(
            await _parameters(request, self.max_depth),
            name,
            base64_files=True,
            max_depth=self.max_depth,
        )
        await self.server.load(name, options)
        return Response(status_code=200, media_type=JSON)

    async def unload_model(self, request: Request) -> Response:
        self._check_explicit()
        name = request.path_params["model"]
        options = parse_unload_parameters(await _parameters(request, self.max_depth), model=name)
        await self.server.unload(name, options)
        return Response(status_code=200, media_type=JSON)

    async def named_repository_control(self, request: Request) -> Response:
        raise unsupported(NAMED_REPOSITORY)

    async def repository_events(self, request: Request) -> Response:
        """The journal's history (a tritonactor extension): ?after=<seq>&limit=<n>."""
        after = _query_int(request, "after", 0, minimum=0, maximum=2**63 - 1)
        limit = _query_int(request, "limit", 100, minimum=1, maximum=1000)
        entries = await self.server.events(after, limit)
        return json_response(
            {
                "events": [entry.as_json() for entry in entries],
                "next": entries[-1].seq if entries else after,
            }
        )

    def _check_explicit(self) -> None:
        if self.server.settings.model_control_mode is not ControlMode.EXPLICIT:
            raise unavailable("explicit model load / unload is not allowed if polling is enabled")

    def _handle(self, request: Request) -> ModelHandle:
        return self.router.resolve(request.path_params["model"], _version(request))

    async def model_metadata(self, request: Request) -> Response:
        handle = self._handle(request)
        signature = handle.signature
        batch = signature.max_batch_size
        # A version asked for is the one listed, as Triton lists it; else every ready one.
        asked = "version" in request.path_params
        versions = [handle.version] if asked else self.router.ready_versions(handle.name)
        return json_response(
            {
                "name": handle.name,
                "versions": [str(v) for v in versions],
                "platform": handle.config.platform or handle.config.backend,
                "inputs": [
                    _tensor_metadata(t.name, t.datatype, t.shape(batch)) for t in signature.inputs
                ],
                "outputs": [
                    _tensor_metadata(t.name, t.datatype, t.shape(batch)) for t in signature.outputs
                ],
            }
        )

    async def model_ready(self, request: Request) -> Response:
        try:
            self._handle(request)
        except TritonError as error:
            if error.code is ErrorCode.INVALID_ARG:  # a version no model can have
                raise
            return error_response("Model version not ready", 400)
        return Response(status_code=200)

    async def model_config(self, request: Request) -> Response:
        return json_response(config_to_json(self._handle(request).config))

    async def model_statistics(self, request: Request) -> Response:
        name = request.path_params.get("model", "")
        handles = await self.server.statistics(name, _version(request))
        return json_response({"model_stats": [_model_statistics(h) for h in handles]})

    async def trace_setting(self, request: Request) -> Response:
        """The trace extension: GET the settings in force, POST changes to them (global, or a
        model's override)."""
        model = request.path_params.get("model", "")
        changes = None
        if request.method == "POST":
            body = await request.body()
            changes = decode_json(body, self.max_depth) if body.strip() else {}
            if not isinstance(changes, dict):
                raise invalid_arg("the trace setting request must be a JSON object")
        return json_response(await self.server.trace_extension(model, changes))

    async def infer(self, request: Request) -> Response:
        return await self.answer_infer(
            request.path_params["model"],
            _version(request),
            request.scope["path"],
            request.headers,
            request.body,
        )

    async def answer_infer(
        self,
        name: str,
        version: str,
        path: str,
        headers: Headers,
        body: bytes | Callable[[], Awaitable[bytes]],
    ) -> InferResponse:
        """The answer to an infer request of model `name` (`version`: "" for the default) at
        `path`, with `headers`; its `body` as it came whole, or the way to read it (the request's
        `body`, read once the request is logged and traced, as the direct route reads it). The
        direct route (direct.py) and the infer lane under `tritonactor serve`'s uvicorn
        (infer_lane.py) both answer with it."""
        path = url_path(path)
        with request_logger("HTTP", "POST", path, model=name) as entry:
            tracing = self.server.tracing
            trace = None
            if tracing is not None:
                trace = tracing.start_request(name, version, headers, "HTTP")
            if trace is None:
                response = await self._infer(body, headers, name, version, None)
            else:
                entry.trace = trace
                try:
                    response = await self._infer(body, headers, name, version, trace)
                except BaseException as error:
                    trace.end(error)
                    raise
                trace.end()
            entry.status = response.status_code
            return response

    async def logging(self, request: Request) -> Response:
        """The logging extension: GET the settings in force, POST changes to them."""
        if request.method == "GET":
            return json_response(await self.server.log_settings())
        body = await request.body()
        changes = decode_json(body, self.max_depth) if body.strip() else {}
        if not isinstance(changes, dict):
            raise invalid_arg("the logging request must be a JSON object")
        return json_response(await self.server.log_settings(changes))

    async def _infer(
        self,
        body: bytes | Callable[[], Awaitable[bytes]],
        headers: Headers,
        name: str,
        version: str,
        trace: RequestTrace | None,
    ) -> InferResponse:
        if not isinstance(body, bytes):
            body = await body()
        if self.router.loader is not None:
            await self.router.ensure_loaded(name)
        if self.router.resolve(name, version).decoupled:
            raise unsupported(
                "HTTP end point doesn't support models with decoupled transaction policy"
            )
        # The model first, as Triton: an unknown one is 404 whatever the body.
        coding = headers.get("content-encoding")
        if coding is not None:
            body = await inflated(body, coding, self.max_input_size)
        header_length = _header_length(headers.get("inference-header-content-length"), len(body))
        # The shared-memory regions the request reads and writes: held until it is answered.
        lease = Lease(self.server.shared_memory)
        try:
            if header_length == 0:
                infer_request = self._raw_request(body, name, version)
            else:
                infer_request = decode_infer_request(
                    body,
                    header_length,
                    name,
                    version,
                    shared_memory=lease.read,
                    shared_memory_outputs=lease.reserve,
                    max_depth=self.max_depth,
                )
            if self.headers.enabled:  # (the headers are decoded only then)
                self.headers.forward(infer_request, headers.items())
            if trace is not None:
                infer_request.trace = trace
                trace.describe(infer_request)
            response = await answer_holding(lease, infer_request, self.router.infer(infer_request))
            written = await lease.write_off_loop(response)
            payload, json_length = await encode_off_loop(  # a large ranking: off the loop
                response,
                infer_request,
                lambda: encode_infer_response(response, infer_request, in_shared_memory=written),
            )
        finally:
            lease.release()
        accept = headers.get("accept-encoding")
        if accept is not None:
            coding = response_coding(accept)
            if coding != IDENTITY:
                pieces = (payload,) if isinstance(payload, bytes) else payload
                return InferResponse(await deflated(pieces, coding), json_length, coding)
        return InferResponse(payload, json_length)

    def _raw_request(self, body: bytes, name: str, version: str) -> Any:
        handle = self.router.resolve(name, version)
        inputs = handle.signature.inputs
        if len(inputs) != 1:
            raise invalid_arg(
                f"[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
                f"deduced but got {len(inputs)} inputs in '{name}' model configuration"
            )
        spec = inputs[0]
        batching = handle.signature.max_batch_size > 0
        return decode_raw_request(
            body, spec.name, spec.datatype, spec.dims, batching, name, version
        )


def _header_length(value: str | None, body_length: int) -> int | None:
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise invalid_arg(
            f"Inference-Header-Content-Length must be an integer, got: '{value}'"
        ) from None
    if not 0 <= length <= body_length:
        raise invalid_arg(
            f"inference header size should be in range (0, {body_length}), got: {length}"
        )
    return length


def _tensor_metadata(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


def _model_statistics(handle: ModelHandle) -> dict[str, Any]:
    """One entry of `model_stats`, shaped as Triton's JSON (64-bit counts as JSON numbers)."""
    stats = handle.statistics

    def duration(d: statistics.Duration) -> dict[str, int]:
        return {"count": d.count, "ns": d.ns}

    return {
        "name": handle.name,
        "version": str(handle.version),
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {k: duration(d) for k, d in stats.inference_stats().items()},
        "response_stats": {},
        "batch_stats": [
            {
                "batch_size": batch.batch_size,
                "compute_input": duration(batch.compute_input),
                "compute_infer": duration(batch.compute_infer),
                "compute_output": duration(batch.compute_output),
            }
            for batch in stats.batch_stats
        ],
        "memory_usage": [],
    }
