"""The graceful drain of a front-end process (docs/shutdown.md).

One `Drain` per process that serves HTTP and gRPC. Both front ends consult it: every HTTP
request passes its gate (`http`) and every gRPC handler its wrapper (`grpc_service`), so it
knows each request it admitted and still answers. Once draining (a signal, or the ASGI
server's shutdown), a new request is answered 503 / `UNAVAILABLE` with `SHUTTING_DOWN` at
once, and `wait()` lets the admitted ones finish, up to the exit timeout counted from the
moment the drain began. What is left then is cancelled, and answered 503 with a JSON error /
`UNAVAILABLE`, with a message that says the server is shutting down: never an empty 500 or a
reset stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

import grpclib.const
import orjson
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream
from starlette.types import Message, Receive, Scope, Send

log = logging.getLogger("tritonactor.drain")

SHUTTING_DOWN = "Server exiting: the server is shutting down and takes no new requests"
# How long the requests cancelled at the exit timeout may take to send their error.
ANSWER_GRACE = 5.0

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
GrpcMethod = Callable[[Stream[Any, Any]], Awaitable[None]]


class DrainableStream(Protocol):
    """A call that serves many requests (a gRPC stream): told when the drain begins, it refuses
    the requests that follow and ends once those it had admitted are answered."""

    def drain(self) -> None: ...


def timed_out(exit_timeout: float) -> str:
    """The error of a request still running when the exit timeout ends."""
    return (
        "Server exiting: the server is shutting down and this request did not finish within "
        f"the exit timeout ({exit_timeout:g} s)"
    )


class Drain:
    """The requests a front-end process admitted and has not answered yet, and whether it
    still admits new ones. Used on the process's event loop only."""

    def __init__(self, exit_timeout: float) -> None:
        self.exit_timeout = exit_timeout
        self.draining = False
        self.expired = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._streams: set[DrainableStream] = set()
        self._idle = asyncio.Event()
        self._deadline = 0.0

    @property
    def in_flight(self) -> int:
        """How many admitted requests (HTTP requests and gRPC calls) are being answered."""
        return len(self._tasks)

    def open(self) -> None:
        """Admit requests (again): the app's lifespan starts (an app may be started twice)."""
        self.draining = False
        self.expired = False
        self._idle = asyncio.Event()

    def begin(self) -> None:
        """Stop admitting requests; the exit timeout starts now. Idempotent."""
        if self.draining:
            return
        self.draining = True
        self._deadline = asyncio.get_running_loop().time() + self.exit_timeout
        if not self._tasks:
            self._idle.set()
        for stream in list(self._streams):
            stream.drain()
        log.info(  # Triton's first sentence, which scripts wait for, then ours
            "Waiting for in-flight requests to complete. Shutting down: %d request(s) in flight "
            "may finish within %g s; new requests are answered 503 / UNAVAILABLE",
            len(self._tasks),
            self.exit_timeout,
        )

    async def wait(self) -> None:
        """Begin draining (if not yet) and return once every admitted request has been
        answered. At the exit timeout the requests still running are cancelled: each answers
        `timed_out(...)` (503 / UNAVAILABLE). Safe to call more than once, concurrently."""
        self.begin()
        remaining = self._deadline - asyncio.get_running_loop().time()
        if not self._idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), max(remaining, 0.0))
        if self._tasks and not self.expired:
            self.expired = True
            log.warning(
                "exit timeout (%g s): %d request(s) still in flight are answered with an error",
                self.exit_timeout,
                len(self._tasks),
            )
            for task in list(self._tasks):
                task.cancel()
        if self._tasks:
            try:
                await asyncio.wait_for(self._idle.wait(), ANSWER_GRACE)
            except TimeoutError:
                log.error("%d request(s) did not end after being cancelled", len(self._tasks))

    @contextlib.contextmanager
    def stream(self, stream: DrainableStream) -> Iterator[None]:
        """While the block runs, `stream` is told when the drain begins (at once if it has)."""
        if self.draining:
            stream.drain()
        self._streams.add(stream)
        try:
            yield
        finally:
            self._streams.discard(stream)

    def admitted(self) -> asyncio.Task[Any]:
        """The current task: a call admitted, answered before the drain ends."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        return task

    def answered(self, task: asyncio.Task[Any]) -> None:
        """`task`'s call is answered (or ended)."""
        self._tasks.discard(task)
        if self.draining and not self._tasks:
            self._idle.set()

    # --- HTTP ----------------------------------------------------------------------------------

    async def http(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        """The gate every HTTP request of the app passes (frontends/http/direct.py)."""
        if self.draining:
            await refuse_http(scope, send, SHUTTING_DOWN)
            return
        task = asyncio.current_task()
        assert task is not None
        tasks = self._tasks
        tasks.add(task)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if self.draining and _http1(scope):
                    # Finished during the drain: the client should not reuse the connection.
                    message = {**message, "headers": [*message["headers"], _CLOSE]}
            await send(message)

        try:
            await app(scope, receive, tracked)
        except asyncio.CancelledError:
            # Cancelled while draining: by this drain's exit timeout, or by the ASGI server's
            # graceful timeout (which `tritonactor serve` sets to the same). Answer for it,
            # unless the answer had begun (a stream then just ends).
            if not self.draining or started:
                raise
            task.uncancel()
            await refuse_http(scope, send, timed_out(self.exit_timeout))
        finally:
            tasks.discard(task)
            if self.draining and not tasks:
                self._idle.set()

    # --- gRPC ----------------------------------------------------------------------------------

    def grpc_service(self, service: GrpcService) -> GrpcService:
        """`service` (a grpclib service: its `__mapping__`), each of its handlers passing this
        drain: a call that starts while draining is refused UNAVAILABLE, an admitted one is
        tracked. A wrapper around the handler, not grpclib's RecvRequest event, whose listener
        costs every call an event object and an extra await."""
        return _DrainedService(self, service)

    def gate_grpc(self, method: GrpcMethod) -> GrpcMethod:
        """`method`, refused while draining and tracked once admitted."""
        tracked = self._tracked(method)

        async def gated(stream: Stream[Any, Any]) -> None:
            if self.draining:
                raise GRPCError(Status.UNAVAILABLE, SHUTTING_DOWN)
            await tracked(stream)

        return gated

    def _tracked(self, method: GrpcMethod) -> GrpcMethod:
        async def answer(stream: Stream[Any, Any]) -> None:
            task = self.admitted()
            try:
                await method(stream)
            except asyncio.CancelledError:
                if not self.expired:
                    raise
                task.uncancel()
                raise GRPCError(Status.UNAVAILABLE, timed_out(self.exit_timeout)) from None
            finally:
                self.answered(task)

        return answer


class GrpcService(Protocol):
    def __mapping__(self) -> dict[str, grpclib.const.Handler]: ...


class _DrainedService:
    """A grpclib service whose handlers pass a drain (`Drain.grpc_service`)."""

    def __init__(self, drain: Drain, service: GrpcService) -> None:
        self._drain = drain
        self._service = service

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            name: handler._replace(func=self._drain.gate_grpc(handler.func))
            for name, handler in self._service.__mapping__().items()
        }


_CLOSE = (b"connection", b"close")


async def refuse_http(scope: Scope, send: Send, message: str) -> None:
    """Answer 503 with Triton's JSON error, closing the connection after it."""
    body = orjson.dumps({"error": message})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if _http1(scope):
        headers.append(_CLOSE)
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _http1(scope: Scope) -> bool:
    """HTTP/1 (a Connection header means something; not in HTTP/2)."""
    return scope.get("http_version", "1.1") in ("1.0", "1.1")
