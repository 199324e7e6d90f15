"""The infer lane under `tritonactor serve`'s uvicorn protocol (frontends/http/infer_lane.py):
which requests it takes and which stay the app's, and how it answers. A real uvicorn with the
protocol, on a real socket, serves an ASGI app (answering `asgi ...`) whose infer lane is the
real `InferLane` over a stand-in for the routes' handler (answering `lane ...`); a model named
`hold` waits for the test to release it, `missing` is unknown, `broken` raises."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from starlette.requests import Request
from uvicorn.middleware.message_logger import MessageLoggerMiddleware
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from tests.unit.test_uvicorn_protocol import serving
from tritonactor.core.errors import not_found
from tritonactor.frontends.drain import SHUTTING_DOWN, Drain, timed_out
from tritonactor.frontends.http.infer_lane import InferLane
from tritonactor.frontends.http.infer_target import url_path
from tritonactor.frontends.http.routes import InferResponse
from tritonactor.frontends.http.uvicorn_protocol import HttpToolsWholeBody, _lane_of
from tritonactor.settings import Settings

INFER = "/v2/models/m/infer"


def digest(body: bytes) -> str:
    return f"{len(body)} {hashlib.sha256(body).hexdigest()[:12]}"


class Escape(BaseException):
    """What gets past the handler's error answers."""


class StandInRoutes:
    """`Routes.answer_infer`'s stand-in: what it was asked, and a body that says so."""

    def __init__(self) -> None:
        self.server = SimpleNamespace(tracing=None)
        self.release = threading.Event()
        self.holding = threading.Event()

    async def answer_infer(
        self, name: str, version: str, path: str, headers: Any, body: bytes
    ) -> InferResponse:
        if name == "hold":
            self.holding.set()
            await asyncio.to_thread(self.release.wait)
        if name == "missing":
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if name == "broken":
            raise RuntimeError("the stand-in broke")
        if name == "escape":
            raise Escape  # (not an Exception: past the app's handlers, as a cancellation is)
        tag = headers.get("x-tag", "-")
        return InferResponse(f"lane {name} {version or '-'} {tag} {digest(body)}".encode(), None)


class App:
    """The ASGI app: answers `asgi <path> <body digest>`; its `lane` is the infer lane."""

    def __init__(self, routes: StandInRoutes) -> None:
        self.user_middleware: list[Any] = []
        self.lane = InferLane(self, routes, max_body=1 << 20)  # type: ignore[arg-type]
        self.started = threading.Event()  # the app was called (a request it answers)
        self.release: threading.Event | None = None
        self.uvicorn: uvicorn.Server | None = None  # the server serving it

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.started.set()
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        answer = f"asgi {scope['path']} {digest(body)}".encode()
        headers = [(b"content-length", str(len(answer)).encode()), (b"content-type", b"x/y")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


class WithoutAccessLog(HttpToolsWholeBody):
    """The protocol as `tritonactor serve` runs it, with no access log (`--no-access-log`;
    uvicorn reads its access log as on wherever its access logger has handlers, as pytest's
    log capture may give it)."""

    access_log_on = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access_log = self.access_log_on


class WithAccessLog(WithoutAccessLog):
    access_log_on = True


@contextlib.contextmanager
def lane_served(protocol: type[HttpToolsWholeBody]) -> Iterator[tuple[App, StandInRoutes, int]]:
    routes = StandInRoutes()
    app = App(routes)
    app.release = routes.release  # (set as the server stops: a held request ends)
    with serving(protocol, app, access_log=False) as (port, server):
        app.uvicorn = server
        yield app, routes, port


@pytest.fixture
def uvicorn_errors(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """`caplog`, with what uvicorn logs as errors: its `uvicorn` logger does not propagate
    once a server configured it, and only some pytest versions capture such loggers."""
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


@pytest.fixture
def served() -> Iterator[tuple[App, StandInRoutes, int]]:
    with lane_served(WithoutAccessLog) as served:
        yield served


def test_with_uvicorns_access_log_on_the_app_answers_every_request() -> None:
    with lane_served(WithAccessLog) as (_, _, port):
        [(_, answer)] = exchange(port, request(INFER, b"x"))
    assert answer == f"asgi {INFER} {digest(b'x')}".encode()


def request(path: str, body: bytes, *headers: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: test", *headers, f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def read_response(sock: socket.socket, buffered: bytearray) -> tuple[list[bytes], bytes]:
    """The next response on `sock`: its head's lines and its body (`buffered`: what was read
    past the responses before)."""
    while b"\r\n\r\n" not in buffered:
        data = sock.recv(65536)
        assert data, "the connection closed"
        buffered += data
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    while len(rest) < length:
        data = sock.recv(65536)
        assert data, "the connection closed"
        rest += data
    buffered[:] = rest[length:]
    return lines, rest[:length]


DEFAULTS = [b"date", b"server"]  # uvicorn's own headers, first in each answer


def names(head: list[bytes]) -> list[bytes]:
    """The header names of a response's head, in order."""
    return [line.split(b":")[0] for line in head[1:]]


@contextlib.contextmanager
def connected(port: int) -> Iterator[socket.socket]:
    """A connection to the server, whose reads fail after a while rather than hang a test
    whose answer never comes."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        yield sock


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (it read nothing more, then the end)."""
    return sock.recv(1) == b""


def exchange(port: int, *requests: bytes) -> list[tuple[list[bytes], bytes]]:
    with connected(port) as sock:
        sock.sendall(b"".join(requests))
        buffered = bytearray()
        return [read_response(sock, buffered) for _ in requests]


def test_a_whole_infer_request_is_the_lanes_and_answered_as_uvicorn_writes_an_answer(
    served: tuple[App, StandInRoutes, int],
) -> None:
    app, _, port = served
    body = b'{"inputs": []}'
    [(head, answer)] = exchange(port, request(INFER, body, "X-Tag: t1"))
    assert answer == f"lane m - t1 {digest(body)}".encode()
    assert head[0] == b"HTTP/1.1 200 OK"
    assert names(head) == [*DEFAULTS, b"content-length", b"content-type"]
    assert not app.started.is_set()  # the app never saw it


def test_a_version_is_read_from_the_path(served: tuple[App, StandInRoutes, int]) -> None:
    _, _, port = served
    [(_, answer)] = exchange(port, request("/v2/models/m/versions/3/infer", b"x"))
    assert answer.startswith(b"lane m 3 ")


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v2/models/m/ready", ()),  # not an infer path
        ("/v2/models/m/versions/x/infer", ()),  # not a version the routes take
        (INFER, ("Connection: close",)),  # a connection not kept alive
    ],
)
def test_other_requests_are_the_apps(
    served: tuple[App, StandInRoutes, int], path: str, headers: tuple[str, ...]
) -> None:
    app, _, port = served
    [(_, answer)] = exchange(port, request(path, b"abc", *headers))
    assert answer == f"asgi {path} {digest(b'abc')}".encode()
    assert app.started.is_set()


def test_a_body_not_in_the_read_of_its_headers_is_the_apps(
    served: tuple[App, StandInRoutes, int],
) -> None:
    app, _, port = served
    body = b"0123456789" * 10
    whole = request(INFER, body)
    with connected(port) as sock:
        sock.sendall(whole[:-40])
        assert app.started.wait(30)  # the app was called at the end of that read
        sock.sendall(whole[-40:])
        _, answer = read_response(sock, bytearray())
    assert answer == f"asgi {INFER} {digest(body)}".encode()


def test_expect_100_continue_is_the_apps(served: tuple[App, StandInRoutes, int]) -> None:
    _, _, port = served
    body = b"abc"
    head, _, _ = request(INFER, body, "Expect: 100-continue").partition(b"\r\n\r\n")
    with connected(port) as sock:
        sock.sendall(head + b"\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        _, answer = read_response(sock, bytearray())
    assert answer == f"asgi {INFER} {digest(body)}".encode()


def test_requests_pipelined_behind_the_lanes_are_the_apps_and_answered_in_order(
    served: tuple[App, StandInRoutes, int],
) -> None:
    _, routes, port = served
    paths = ["/v2/models/hold/infer", INFER, "/v2/models/m/ready", INFER]
    bodies = [b"first", b"second one", b"third", b"fourth"]
    with connected(port) as sock:
        sock.sendall(b"".join(request(p, b) for p, b in zip(paths, bodies, strict=True)))
        # the first is the lane's, held: whatever read brought the others, they wait their turn
        assert routes.holding.wait(30)
        routes.release.set()
        buffered = bytearray()
        answers = [read_response(sock, buffered)[1] for _ in paths]
    assert answers[0] == f"lane hold - - {digest(b'first')}".encode()
    for answer, path, body in zip(answers[1:], paths[1:], bodies[1:], strict=True):
        assert answer == f"asgi {path} {digest(body)}".encode()


def test_reading_goes_on_under_a_held_request_as_when_the_app_reads_its_body(
    served: tuple[App, StandInRoutes, int],
) -> None:
    """A request pipelined behind one the lane holds pauses the connection's reading; the lane
    lets it go on, as the app's reading of its body does (uvicorn's `receive`), so a client
    that goes away meanwhile is seen and its answers go nowhere, as through the app. (Before,
    the end was read only after the held request's answer had been written, and the request
    behind it run.)"""
    app, routes, port = served
    assert app.uvicorn is not None
    connections = app.uvicorn.server_state.connections
    with connected(port) as sock:
        sock.sendall(request("/v2/models/hold/infer", b"x") + request(INFER, b"y"))
        assert routes.holding.wait(30)
        sock.shutdown(socket.SHUT_WR)
        waited = 0
        while connections and waited < 3000:  # the server reads the end: the connection goes
            threading.Event().wait(0.01)
            waited += 1
        assert not connections
        routes.release.set()
        assert sock.recv(65536) == b""  # neither request answered
    assert not app.started.is_set()  # the one behind never ran


def test_the_path_logged_is_starlettes() -> None:
    """(The lane logs a failed request's path as the app logs `request.url.path`.)"""
    paths = ["/v2/models/a b/infer", "/v2/models/a\tb\r\nc/infer", "/v2/models/a?b#c\\d/infer"]
    for path in paths:
        scope = {"type": "http", "scheme": "http", "server": ("h", 80), "path": path}
        scope |= {"query_string": b"", "headers": [], "root_path": ""}
        assert url_path(path) == Request(scope).url.path


def test_an_error_is_answered_as_the_apps_handlers_answer_it(
    served: tuple[App, StandInRoutes, int],
) -> None:
    _, _, port = served
    with connected(port) as sock:
        sock.sendall(request("/v2/models/missing/infer", b"x"))
        buffered = bytearray()
        head, answer = read_response(sock, buffered)
        assert head[0] == b"HTTP/1.1 404 Not Found"
        assert answer == b'{"error":"Request for unknown model: \'missing\' is not found"}'
        # the connection serves on
        sock.sendall(request(INFER, b"y"))
        _, answer = read_response(sock, buffered)
        assert answer.startswith(b"lane m ")


def test_an_unexpected_error_is_answered_500_then_the_connection_closed_as_under_uvicorn(
    served: tuple[App, StandInRoutes, int], uvicorn_errors: pytest.LogCaptureFixture
) -> None:
    _, _, port = served
    with connected(port) as sock:
        sock.sendall(request("/v2/models/broken/infer", b"x"))
        head, answer = read_response(sock, bytearray())
        assert head[0] == b"HTTP/1.1 500 Internal Server Error"
        assert answer == b'{"error":"internal error: RuntimeError: the stand-in broke"}'
        assert not any(line.startswith(b"connection") for line in head)  # (none says so)
        assert closed(sock)
    # logged by the app's handler and by uvicorn, as when the app raised
    logged = [(r.name, r.getMessage().strip()) for r in uvicorn_errors.records]
    assert (
        "tritonactor.frontends.http.app",
        "request POST /v2/models/broken/infer failed",
    ) in logged
    assert ("uvicorn.error", "Exception in ASGI application") in logged


@contextlib.contextmanager
def held(served: tuple[App, StandInRoutes, int]) -> Iterator[tuple[socket.socket, Drain]]:
    """A connection whose infer request the lane holds (model `hold`), under a drain of its
    own not yet begun."""
    app, routes, port = served
    drain = app.lane.drain = Drain(exit_timeout=60)
    with connected(port) as sock:
        sock.sendall(request("/v2/models/hold/infer", b"x"))
        assert routes.holding.wait(30)
        yield sock, drain


def test_an_answer_written_while_draining_closes_the_connection(
    served: tuple[App, StandInRoutes, int],
) -> None:
    _, routes, _ = served
    with held(served) as (sock, drain):
        assert drain.in_flight == 1  # counted in flight by the drain
        drain.draining = True  # (what `begin` sets; its other work needs the server's loop)
        routes.release.set()
        head, answer = read_response(sock, bytearray())
        assert answer.startswith(b"lane hold ")
        assert b"connection: close" in head
        assert closed(sock)
    assert drain.in_flight == 0


def test_a_request_is_refused_once_the_drain_has_begun_as_the_gate_refuses_it(
    served: tuple[App, StandInRoutes, int],
) -> None:
    app, _, port = served
    drain = app.lane.drain = Drain(exit_timeout=60)
    drain.draining = True
    with connected(port) as sock:
        sock.sendall(request(INFER, b"x"))
        head, answer = read_response(sock, bytearray())
        assert head[0] == b"HTTP/1.1 503 Service Unavailable"
        assert answer == f'{{"error":"{SHUTTING_DOWN}"}}'.encode()
        assert names(head) == [*DEFAULTS, b"content-type", b"content-length", b"connection"]
        assert closed(sock)
    assert not app.started.is_set() and drain.in_flight == 0


def test_a_lane_request_the_exit_timeout_cancels_is_answered_503(
    served: tuple[App, StandInRoutes, int],
) -> None:
    _, routes, _ = served
    with held(served) as (sock, drain):
        [task] = drain._tasks  # the lane's, counted in flight
        drain.draining = True
        loop = task.get_loop()
        loop.call_soon_threadsafe(task.cancel)  # what the drain's exit timeout does
        head, answer = read_response(sock, bytearray())
        assert head[0] == b"HTTP/1.1 503 Service Unavailable"
        assert answer == f'{{"error":"{timed_out(60)}"}}'.encode()
        assert names(head) == [*DEFAULTS, b"content-type", b"content-length", b"connection"]
        assert closed(sock)
    assert drain.in_flight == 0
    routes.release.set()


def test_what_escapes_the_handler_is_answered_as_uvicorn_answers_an_app_that_raised(
    served: tuple[App, StandInRoutes, int], uvicorn_errors: pytest.LogCaptureFixture
) -> None:
    app, _, port = served
    drain = app.lane.drain = Drain(exit_timeout=60)
    with connected(port) as sock:
        sock.sendall(request("/v2/models/escape/infer", b"x"))
        head, answer = read_response(sock, bytearray())
        assert head[0] == b"HTTP/1.1 500 Internal Server Error"
        assert answer == b"Internal Server Error"
        assert names(head) == [*DEFAULTS, b"content-type", b"content-length", b"connection"]
        assert b"content-type: text/plain; charset=utf-8" in head
        assert closed(sock)
    assert ("uvicorn.error", "Exception in ASGI application") in [
        (r.name, r.getMessage().strip()) for r in uvicorn_errors.records
    ]
    assert drain.in_flight == 0


def test_a_users_middleware_sees_every_request(served: tuple[App, StandInRoutes, int]) -> None:
    app, _, port = served
    app.user_middleware.append(object())  # (what starlette's add_middleware records)
    [(_, answer)] = exchange(port, request(INFER, b"x"))
    assert answer == f"asgi {INFER} {digest(b'x')}".encode()


def test_no_lane_under_uvicorns_message_logger() -> None:
    app = App(StandInRoutes())
    assert _lane_of(ProxyHeadersMiddleware(app)) is app.lane
    # (uvicorn's `--log-level trace` wraps the app in it, under the proxy-headers middleware)
    assert _lane_of(ProxyHeadersMiddleware(MessageLoggerMiddleware(app))) is None


@pytest.mark.parametrize("workers", [0, 1])
def test_the_apps_lane_is_found_under_uvicorn_and_waits_on_the_apps_drain(
    tmp_path: Path, workers: int
) -> None:
    from tritonactor import app as app_module

    settings = Settings.from_env({"TRITONACTOR_MODEL_REPOSITORY": str(tmp_path)})
    app = app_module.create_app(settings, workers=workers)  # (nothing starts before its lifespan)
    config = uvicorn.Config(app, http=HttpToolsWholeBody, lifespan="off")
    config.load()  # the app wrapped as `tritonactor serve`'s uvicorn wraps it
    assert app.lane is not None
    assert _lane_of(config.loaded_app) is app.lane
    assert app.lane.drain is app.state.drain


def test_no_lane_where_inference_is_restricted(tmp_path: Path) -> None:
    from tritonactor import app as app_module

    settings = Settings.from_env(
        {
            "TRITONACTOR_MODEL_REPOSITORY": str(tmp_path),
            "TRITONACTOR_HTTP_RESTRICTED_API": "inference:infer-key=yes",
        }
    )
    app = app_module.create_app(settings, workers=1)
    assert app.lane is None
    restricted_elsewhere = Settings.from_env(
        {
            "TRITONACTOR_MODEL_REPOSITORY": str(tmp_path),
            "TRITONACTOR_HTTP_RESTRICTED_API": "model-config:admin-key=yes",
        }
    )
    assert app_module.create_app(restricted_elsewhere, workers=1).lane is not None


def test_no_lane_where_the_settings_turn_it_off(tmp_path: Path) -> None:
    from tritonactor import app as app_module

    settings = Settings.from_env(
        {"TRITONACTOR_MODEL_REPOSITORY": str(tmp_path), "TRITONACTOR_HTTP_LANE": "false"}
    )
    assert app_module.create_app(settings, workers=1).lane is None
