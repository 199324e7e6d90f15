"""How the HTTP front end answers: JSON bodies, Triton's `{"error": ...}` errors, and the
handlers that turn an exception into one (after reading what is left of the body)."""

from __future__ import annotations

import logging
from typing import Any

import anyio
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tritonactor.core.errors import TritonError
from tritonactor.frontends.http.compression import UnsupportedEncoding
from tritonactor.frontends.http.json_body import encode_json
from tritonactor.frontends.http.limits import BodyLimitError

log = logging.getLogger("tritonactor.frontends.http.app")

JSON = "application/json"


def json_response(data: Any, status: int = 200) -> Response:
    return Response(encode_json(data), status_code=status, media_type=JSON)


def error_response(message: str, status: int) -> Response:
    return json_response({"error": message}, status)


async def client_gone(request: Request, error: Exception) -> None:
    """The client left before its request's body had all arrived: there is no one to answer."""
    log.debug("request %s %s: the client disconnected", request.method, request.url.path)


async def triton_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, TritonError)
    await drain_body(request)
    return error_answer(error)


def error_answer(error: TritonError) -> Response:
    """The response to `error`, its body being read (the infer lane's, infer_lane.py, is)."""
    if isinstance(error, BodyLimitError):  # 408 for a body that did not arrive in time
        return error_response(error.message, error.http_status)
    response = error_response(error.message, error.code.http_status)
    if isinstance(error, UnsupportedEncoding):  # the codings the server reads
        response.raw_headers.extend(error.headers)
    return response


async def http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    await drain_body(request)
    return error_response(error.detail, error.status_code)


async def internal_error(request: Request, error: Exception) -> Response:
    log.error("request %s %s failed", request.method, request.url.path, exc_info=error)
    await drain_body(request)
    return error_response(f"internal error: {type(error).__name__}: {error}", 500)


async def drain_body(request: Request) -> None:
    """Read and drop what is left of the request body before an error is answered. hypercorn
    closes a keep-alive connection whose request body has not all arrived when the response
    ends, without saying so in the response: the client's next request on it then fails."""
    # Bounded, so that a client that stalls mid-body cannot hold its error back: past the
    # bound the error goes out and hypercorn closes the connection, as it would have anyway.
    with anyio.move_on_after(_DRAIN_SECONDS):
        try:
            async for _ in request.stream():
                pass
        # Already read, the client is gone, or the body breaks a limit (limits.py: the
        # connection is closed after the answer).
        except (RuntimeError, ClientDisconnect, BodyLimitError):
            pass


_DRAIN_SECONDS = 5.0
