"""The direct route for inference: `POST /v2/models/{model}[/versions/{version}]/infer` is
answered before starlette's middleware and routing, which cost a request a few hundred
microseconds of matching, wrapping and building (bench/request_path.py). Everything else goes
through starlette as before; the endpoint, its restrictions and its errors are the same as
through the routes (the app sets `infer`). Every HTTP request's body is held to the app's
`limits` first, whichever way it goes (limits.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from tritonactor.frontends.http.infer_target import (
    LookupHeaders,
    infer_path,
    keep_encoded_slashes,
)
from tritonactor.frontends.http.limits import BodyLimits, answer

if TYPE_CHECKING:
    from tritonactor.frontends.http.infer_lane import InferLane

# Answers one infer request: handles it and sends the response, errors included.
Answer = Callable[[Request, Send], Awaitable[None]]
# Sees every HTTP request first, and passes it on (or not): the graceful drain (drain.py).
Gate = Callable[
    [Scope, Receive, Send, Callable[[Scope, Receive, Send], Awaitable[None]]], Awaitable[None]
]


class HttpApp(Starlette):
    """The starlette app, with its infer route served directly once `infer` is set, and every
    request's body held to `limits`."""

    infer: Answer | None = None
    limits: BodyLimits | None = None
    gate: Gate | None = None  # set by tritonactor/app.py
    # Infer requests answered under `tritonactor serve`'s uvicorn protocol (infer_lane.py),
    # when inference is not restricted; None otherwise.
    lane: InferLane | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = self.gate
        if gate is not None and scope["type"] == "http":
            await gate(scope, receive, send, self._serve)
            return
        await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            keep_encoded_slashes(scope)
        limits = self.limits
        if limits is not None and scope["type"] == "http":
            receive, send, refused = limits.bound(scope, receive, send)
            if refused is not None:  # a declared length past the limit: nothing is read
                await answer(refused, send)
                return
        infer = self.infer
        if (
            infer is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and not self.user_middleware  # middleware added to the app sees every request
        ):
            params = infer_path(scope["path"]) if not scope.get("root_path") else None
            if params is not None:
                scope["app"] = self
                scope["path_params"] = params
                await infer(InferRequest(scope, receive, send), send)
                return
        await super().__call__(scope, receive, send)


class InferRequest(Request):
    """A request of the direct route: its body is read as starlette's `Request.body()` reads
    it (the same state after: the stream consumed, a disconnect noted), without the async
    generator it reads through, which cost an infer request more than the rest of reading it."""

    @property
    def headers(self) -> Headers:
        if not hasattr(self, "_headers"):
            self._headers = LookupHeaders(scope=self.scope)
        return self._headers

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            if self._stream_consumed:
                raise RuntimeError("Stream consumed")
            chunks: list[bytes] = []
            while True:
                message = await self._receive()
                if message["type"] == "http.request":
                    chunks.append(message.get("body", b""))
                    if not message.get("more_body", False):
                        break
                elif message["type"] == "http.disconnect":
                    self._is_disconnected = True
                    raise ClientDisconnect()
            self._stream_consumed = True
            only = chunks[0] if len(chunks) == 1 else None
            self._body = only if type(only) is bytes else b"".join(chunks)
        return self._body
