"""Triton's shared-memory extension over HTTP: `/v2/systemsharedmemory` and
`/v2/cudasharedmemory`, each with `[/region/{name}]/status` (GET), `.../register` and
`.../unregister` (POST). The regions themselves are the server's `SharedMemoryRegistry`."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tritonactor.core.errors import invalid_arg
from tritonactor.frontends.http.codec import parse_unsigned
from tritonactor.frontends.http.json_body import decode_json, encode_json
from tritonactor.memory.cuda import IPC_HANDLE_SIZE
from tritonactor.memory.region import Kind

if TYPE_CHECKING:
    from tritonactor.server import Server

Handler = Callable[[Request], Awaitable[Response]]
MakeRoute = Callable[[str, Handler, list[str]], Route]

_PREFIXES = {Kind.SYSTEM: "/v2/systemsharedmemory", Kind.CUDA: "/v2/cudasharedmemory"}


def shared_memory_routes(server: Server, route: MakeRoute) -> list[Route]:
    """The extension's routes; `route(path, endpoint, methods)` applies the restricted-API
    guard of the "shared-memory" category."""
    routes: list[Route] = []
    for kind, prefix in _PREFIXES.items():
        endpoints = _Endpoints(server, kind)
        for base in (prefix, f"{prefix}/region/{{region}}"):
            routes.append(route(f"{base}/status", endpoints.status, ["GET"]))
            routes.append(route(f"{base}/register", endpoints.register, ["POST"]))
            routes.append(route(f"{base}/unregister", endpoints.unregister, ["POST"]))
    return routes


def _empty() -> Response:
    return Response(status_code=200, media_type="application/json")


class _Endpoints:
    def __init__(self, server: Server, kind: Kind) -> None:
        # Registering goes through the server (in a front-end process, its engine tells every
        # front end); the status is read from this process's registry.
        self._server = server
        self._registry = server.shared_memory
        self._kind = kind

    async def status(self, request: Request) -> Response:
        regions = self._registry.status(self._kind, request.path_params.get("region", ""))
        body = encode_json([region.status() for region in regions])
        return Response(body, media_type="application/json")

    async def unregister(self, request: Request) -> Response:
        await self._server.unregister_memory(self._kind, request.path_params.get("region", ""))
        return _empty()

    async def register(self, request: Request) -> Response:
        name = request.path_params.get("region", "")
        if not name:
            what = "system" if self._kind is Kind.SYSTEM else "cuda"
            raise invalid_arg(f"'region name' is necessary to register {what} shared memory region")
        document = decode_json(await request.body(), self._server.settings.http_max_json_depth)
        if not isinstance(document, dict):
            raise invalid_arg("the shared memory register request must be a JSON object")
        if self._kind is Kind.SYSTEM:
            key = _required(document, "key")
            if not isinstance(key, str):
                raise invalid_arg("Unable to parse 'key': expected a string")
            key = key.split("\0", 1)[0]  # as Triton's JSON parser gives it: a C string
            offset = _unsigned(document, "offset", 0)
            byte_size = _unsigned(document, "byte_size")
            await self._server.register_system_memory(name, key, offset, byte_size)
        else:
            handle = _raw_handle(_required(document, "raw_handle"))
            byte_size = _unsigned(document, "byte_size")
            device_id = _unsigned(document, "device_id")
            await self._server.register_cuda_memory(name, handle, device_id, byte_size)
        return _empty()


def _required(document: dict[str, Any], field: str) -> Any:
    if field not in document:
        raise invalid_arg(f"Shared memory register request has no '{field}' field")
    return document[field]


def _unsigned(document: dict[str, Any], field: str, default: int | None = None) -> int:
    value = _required(document, field) if default is None else document.get(field, default)
    return parse_unsigned(value, field)


def _raw_handle(value: Any) -> bytes:
    text = value.get("b64") if isinstance(value, dict) else None
    if not isinstance(text, str):
        raise invalid_arg("Unable to parse 'raw_handle': expected an object with a 'b64' string")
    try:
        handle = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        handle = b""
    if len(handle) != IPC_HANDLE_SIZE:
        raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return handle
