"""Bounds on what an HTTP request may send: the body's size, the time it may take to arrive,
and the nesting depth of its JSON. Each breach is answered before the memory it would take is
spent, with a message naming the limit and the setting that raises it.

- The size: a `Content-Length` above the limit is answered at once, before any of the body is
  read; a chunked body is counted as it arrives and refused once it passes the limit.
- The time: the whole body must arrive within the timeout from the request's start; a body that
  does not is answered 408.
- A response sent before the request's body has all arrived (a breach, or a route that never
  reads its body) asks the ASGI server to close the connection (`Connection: close`), so a
  client that keeps sending holds nothing.
- The JSON depth is checked on the bytes before they are parsed (`check_json_depth`, from
  core/json_depth.py: the control plane applies it to a load's config too).
- A body the ASGI server says has all arrived before the app looks at it (`BODY_COMPLETE` in
  the scope's extensions: `tritonactor serve`'s uvicorn protocol says so, uvicorn_protocol.py),
  of a declared length within the limit, is not wrapped: it can neither grow nor be late, and
  an answer sent before it is read leaves nothing unread on the connection. Most small
  requests come so, in the read that brought their headers.

The ASGI wrapping is `BodyLimits.bound`, used by `HttpApp` for every HTTP request with a body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from starlette.types import Message, Receive, Scope, Send

from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.json_depth import DEFAULT_JSON_DEPTH, check_json_depth
from tritonactor.settings import Settings

# Triton's default (its HTTP_DEFAULT_MAX_INPUT_SIZE).
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024

_DISCONNECT: Message = {"type": "http.disconnect"}
# The scope extension by which an ASGI server says that a request's whole body had arrived
# before the app was called (uvicorn_protocol.py sets it).
BODY_COMPLETE = "tritonactor.body_complete"
_CLOSE = (b"connection", b"close")


class BodyLimitError(TritonError):
    """A request body past one of the limits: answered with `http_status` (400, or 408 for a
    body that did not arrive in time), and the connection is closed after the answer."""

    def __init__(self, message: str, http_status: int = 400) -> None:
        super().__init__(ErrorCode.INVALID_ARG, message)
        self.http_status = http_status


def too_large(size: int, limit: int) -> BodyLimitError:
    return BodyLimitError(
        f"request body size of {size} bytes exceeds the maximum allowed input size of {limit} "
        "bytes. Use --http-max-input-size to increase the limit."
    )


def too_slow(timeout: float) -> BodyLimitError:
    return BodyLimitError(
        f"the request body did not arrive within {timeout:g} seconds. Use "
        "--http-body-timeout-secs to increase the limit.",
        408,
    )


def declared_body(headers: Iterable[tuple[bytes, bytes]]) -> tuple[int, bool]:
    """What a request's headers say of its body: its `Content-Length` (-1 without one, or with
    one the ASGI server has refused already) and whether it comes chunked."""
    length = -1
    chunked = False
    for name, value in headers:
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = -1
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked


@dataclass(frozen=True)
class BodyLimits:
    """The largest body (bytes) and the longest it may take to arrive (seconds)."""

    max_size: int = DEFAULT_MAX_INPUT_SIZE
    timeout: float = 30.0

    @classmethod
    def of(cls, settings: Settings) -> BodyLimits:
        return cls(settings.http_max_input_size, settings.http_body_timeout_secs)

    def bound(
        self, scope: Scope, receive: Receive, send: Send
    ) -> tuple[Receive, Send, BodyLimitError | None]:
        """`receive` and `send` for one HTTP request, held to the limits (unchanged for a
        request without a body), and the error to answer at once, before anything is read,
        when its declared length is past the limit (else None)."""
        length, chunked = declared_body(scope["headers"])
        if length <= 0 and not chunked:
            return receive, send, None
        if not chunked and length <= self.max_size:
            extensions = scope.get("extensions")
            if extensions is not None and BODY_COMPLETE in extensions:
                return receive, send, None  # all in, within the limit
        bounded = _Bounded(self, receive, send)
        if length > self.max_size:
            bounded.failed = True
            return bounded.receive, bounded.send, too_large(length, self.max_size)
        return bounded.receive, bounded.send, None


class _Bounded:
    """One request's body, counted and timed as it arrives.

    The time is one timer per request (the ASGI servers run on asyncio, as the actors do): when
    it fires with the body incomplete, a `receive` waiting for the body is cancelled and raises
    the 408 error, and the next one raises it at once. No timer is set per `receive`: a body
    already in costs nothing more."""

    __slots__ = (
        "_limits",
        "_receive",
        "_received",
        "_send",
        "_timer",
        "_waiting",
        "complete",
        "failed",
        "late",
    )

    def __init__(self, limits: BodyLimits, receive: Receive, send: Send) -> None:
        self._limits = limits
        self._receive = receive
        self._send = send
        self._received = 0
        self._waiting: asyncio.Task[Any] | None = None  # the task waiting in `receive`
        self.complete = False  # the whole body has arrived
        self.failed = False  # it broke a limit
        self.late = False  # it did not arrive in time
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            limits.timeout, self._expire
        )

    def _expire(self) -> None:
        self._timer = None
        if self.complete or self.failed:
            return
        self.late = True
        if self._waiting is not None:
            self._waiting.cancel()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def receive(self) -> Message:
        if self.complete:  # the body is in: what is left to wait for is the client leaving
            return await self._receive()
        if self.failed:  # whoever reads on after a breach sees the client gone
            return _DISCONNECT
        if self.late:
            self.failed = True
            raise too_slow(self._limits.timeout)
        task = self._waiting = asyncio.current_task()
        try:
            message = await self._receive()
        except asyncio.CancelledError:
            # The timer's cancellation, unless the task was cancelled for another reason too.
            if self.late and task is not None and task.uncancel() == 0:
                self.failed = True
                raise too_slow(self._limits.timeout) from None
            raise
        finally:
            self._waiting = None
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._limits.max_size:
                self.failed = True
                self._stop_timer()
                raise too_large(self._received, self._limits.max_size)
            if not message.get("more_body", False):
                self.complete = True
                self._stop_timer()
        else:  # the client has gone
            self._stop_timer()
        return message

    async def send(self, message: Message) -> None:
        """Send, asking the ASGI server to close the connection after a response that leaves
        the request's body unread."""
        if not self.complete:
            kind = message["type"]
            if kind == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
            elif kind == "http.response.body" and not message.get("more_body", False):
                self._stop_timer()
                await self._send({**message, "more_body": True})
                if not self.late:
                    await self._linger()
                message = _END
        await self._send(message)

    async def _linger(self) -> None:
        """Read and drop what the client is still sending, for a moment, before the response
        ends and the connection closes: a socket closed with data unread resets the
        connection, and the client may lose the answer it has already been sent."""
        dropped = 0
        with anyio.move_on_after(LINGER_SECONDS):
            while dropped <= self._limits.max_size:
                message = await self._receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
                dropped += len(message.get("body", b""))


# How long a response that leaves a body unread waits for the rest of it (`_Bounded._linger`).
LINGER_SECONDS = 2.0
_END: Message = {"type": "http.response.body", "body": b""}


async def answer(error: BodyLimitError, send: Send) -> None:
    """Answer `error` (with the `send` of `BodyLimits.bound`, which closes the connection)."""
    body = orjson.dumps({"error": error.message})
    await send(
        {
            "type": "http.response.start",
            "status": error.http_status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "DEFAULT_JSON_DEPTH",
    "DEFAULT_MAX_INPUT_SIZE",
    "BodyLimitError",
    "BodyLimits",
    "answer",
    "check_json_depth",
]
