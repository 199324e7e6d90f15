"""Infer requests answered under `tritonactor serve`'s uvicorn protocol, without the ASGI layers.

An infer request through ASGI passes uvicorn's request cycle (its task's wrapper, the `send`
that checks every header of every response against two regular expressions, the `receive`
and their message dicts), uvicorn's proxy-headers middleware, then the app's own layers: the
drain's gate and the `send` it wraps, the body limits, starlette's `Request`, the direct
route's handler (direct.py) and the response's two `send`s. Each costs a few µs; together
they were a seventh of the front end's CPU a request, a sixth under dynamic batching, where
the front end is what paces the clients (docs/benchmarks.md, "Infer requests under the
protocol"). The protocol (uvicorn_protocol.py) hands this lane a request it may take, once its
body has all come, and the lane answers it with `Routes.answer_infer`, the direct route's own
handler, and writes the response on the connection itself: the same status, headers
(uvicorn's `date` and `server` first, as uvicorn writes them) and body, in one write.

What the lane takes (`InferLane.takes`): `POST /v2/models/<model>[/versions/<v>]/infer` over
HTTP/1.1 with a body of a declared length within the body limit, no `Expect: 100-continue`,
no `Upgrade`, a connection kept alive, no uvicorn access log, on an app with no middleware of
a user's and no restricted inference category, served under no wrapper of uvicorn's but its
proxy-headers middleware. Anything else goes through ASGI as before, and so does a request
whose body does not come in the read that brought its headers (its limits and timer are the
app's), or a request pipelined behind another. What the app's layers and uvicorn's task do for
a request the lane takes, the lane does too: the drain's gate refuses it once the drain has
begun (503, checked as the gate checks, when its answer starts) and counts it in flight
otherwise (an answer written while draining says `connection: close`; one the drain's exit
timeout cancels is answered 503); an error is answered as the app's handlers answer it, and an
unexpected one is also logged and answered as uvicorn answers an app that raised (the
connection closed after the answer, or uvicorn's 500 where none had begun); an answer waits for
the connection's writes to resume where uvicorn's `send` waits; the connection's reading goes
on while the request is answered, as the app's reading of its body lets it (a request
pipelined behind paused it), so a client gone before the answer is seen and gets nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from tritonactor.core.errors import TritonError
from tritonactor.frontends.drain import SHUTTING_DOWN, Drain, timed_out
from tritonactor.frontends.http.errors import error_answer, error_response
from tritonactor.frontends.http.infer_target import LookupHeaders, infer_path, url_path
from tritonactor.frontends.http.limits import declared_body

if TYPE_CHECKING:
    from tritonactor.frontends.http.routes import InferResponse, Routes

log = logging.getLogger("tritonactor.frontends.http.app")  # where the app's handlers log
uvicorn_log = logging.getLogger("uvicorn.error")  # where uvicorn logs an app's failure

_CLOSE = b"connection: close\r\n"
# Past this many bytes a response's pieces are handed to the transport as they are, rather
# than joined into one write.
_JOIN_LIMIT = 64 << 10


class InferLane:
    """Infer requests answered without the ASGI layers (see above), for one app."""

    def __init__(self, app: Starlette, routes: Routes, max_body: int) -> None:
        self.app = app
        self.routes = routes
        self.max_body = max_body  # the body limit (limits.BodyLimits.max_size)
        self.drain: Drain | None = None  # set with the app's gate (tritonactor/app.py)

    def takes(self, cycle: RequestResponseCycle, whole_limit: int) -> dict[str, Any] | None:
        """The model and version of the request `cycle` carries when the lane may answer it
        (its body, of a declared length within `whole_limit`, may not have come yet); None
        otherwise."""
        scope = cycle.scope
        if (
            scope["method"] != "POST"
            or scope["http_version"] != "1.1"
            or not cycle.keep_alive
            or cycle.waiting_for_100_continue
            or cycle.access_log  # (uvicorn's access log line is its cycle's: `serve` has none)
            or scope["root_path"]
            or self.app.user_middleware  # (which sees every request)
        ):
            return None
        raw = scope.get("raw_path")
        if raw is not None and b"%" in raw:  # (the app's to read: `keep_encoded_slashes`)
            return None
        params = infer_path(scope["path"])
        if params is None:
            return None
        headers = scope["headers"]
        length, chunked = declared_body(headers)
        if chunked or not 0 < length <= min(self.max_body, whole_limit):
            return None
        for name, _ in headers:
            if name == b"upgrade":
                return None
        return params

    async def answer(self, cycle: RequestResponseCycle, params: dict[str, Any]) -> None:
        """Answer the request `cycle` carries, its body whole in `cycle.body`, as the app and
        uvicorn's task for it would have: what escapes the app is logged and answered as
        uvicorn answers it (500, or the connection closed where the answer had begun)."""
        try:
            await self._answer(cycle, params)
        except BaseException as error:  # (uvicorn's task catches everything an app raises)
            uvicorn_log.error("Exception in ASGI application\n", exc_info=error)
            if not cycle.response_started:
                await _write(cycle, _INTERNAL_ERROR, True)
            else:
                cycle.transport.close()
        finally:
            cycle.on_response = _nothing  # (as uvicorn's task leaves its cycle)

    async def _answer(self, cycle: RequestResponseCycle, params: dict[str, Any]) -> None:
        drain = self.drain
        if drain is not None and drain.draining:  # refused as the gate refuses it
            await _write(cycle, _refusal(SHUTTING_DOWN), True)
            return
        task = drain.admitted() if drain is not None else None
        if not cycle.disconnected and not cycle.response_complete:
            # Reading goes on, as uvicorn's `receive` lets it when the app reads its body: a
            # request pipelined behind this one paused it, and a client that goes away
            # meanwhile is then seen (its answer goes nowhere, as through the app).
            cycle.flow.resume_reading()
        scope = cycle.scope
        body, cycle.body = bytes(cycle.body), b""  # (the cycle outlives its request)
        begun = False  # the answer is going out (the gate's `started`)
        try:
            raised: Exception | None = None
            try:
                response: InferResponse | Response = await self.routes.answer_infer(
                    params["model"],
                    str(params.get("version", "")),
                    scope["path"],
                    LookupHeaders(scope=scope),
                    body,
                )
            except TritonError as error:
                response = error_answer(error)
            except Exception as error:  # answered, then raised again, as app.py's `_answer`
                log.error("request POST %s failed", url_path(scope["path"]), exc_info=error)
                response = error_response(f"internal error: {type(error).__name__}: {error}", 500)
                raised = error
            begun = True
            await _write(cycle, response, drain is not None and drain.draining)
            if raised is not None:
                raise raised
        except asyncio.CancelledError:
            # Cancelled while draining (the drain's exit timeout, or uvicorn's graceful
            # timeout): answered as the gate answers it, unless the answer had begun.
            current = asyncio.current_task()
            if drain is None or not drain.draining or begun or current is None:
                raise
            current.uncancel()
            await _write(cycle, _refusal(timed_out(drain.exit_timeout)), True)
        finally:
            if task is not None and drain is not None:
                drain.answered(task)


def _nothing() -> None:
    pass


def _refusal(message: str) -> Response:
    """The drain's 503, its headers in the order the gate writes them (drain.refuse_http)."""
    response = error_response(message, 503)
    response.raw_headers.reverse()  # (content-type first)
    return response


# What uvicorn answers for an app that raised before its answer began, its headers in
# uvicorn's order (its `connection: close` is the lane's).
_INTERNAL_ERROR = Response(b"Internal Server Error", 500, media_type="text/plain")
_INTERNAL_ERROR.raw_headers.reverse()


async def _write(cycle: RequestResponseCycle, response: Any, close: bool) -> None:
    """Write `response` (an `InferResponse`, or a starlette `Response` with its body) on the
    cycle's connection as uvicorn's `send` writes it, closing the connection after it when
    `close` or when the server stopped keeping connections alive meanwhile."""
    if cycle.disconnected:
        return
    if cycle.flow.write_paused:
        await cycle.flow.drain()
        if cycle.disconnected:
            return
    pieces = getattr(response, "pieces", None)
    if pieces is None:
        pieces = (response.body,)
    content = [STATUS_LINE[response.status_code]]
    for name, value in (*cycle.default_headers, *response.raw_headers):
        content.extend((name, b": ", value, b"\r\n"))
    close = close or not cycle.keep_alive
    if close:
        content.append(_CLOSE)
    content.append(b"\r\n")
    cycle.response_started = True
    transport = cycle.transport
    if sum(map(len, pieces)) <= _JOIN_LIMIT:
        transport.write(b"".join((*content, *pieces)))
    else:
        transport.write(b"".join(content))
        transport.writelines(pieces)
    cycle.response_complete = True
    cycle.message_event.set()
    if close:
        cycle.keep_alive = False
        transport.close()
    cycle.on_response()
