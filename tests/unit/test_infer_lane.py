"""The infer lane under `tritonactor serve`'s uvicorn protocol (frontends/http/infer_lane.py):
which requests it takes and which stay the app's, and how it answers. A real uvicorn with the
protocol, on a real socket, serves an ASGI app (answering `asgi ...`) whose infer lane is the
real `InferLane` over a stand-in for the routes' handler (answering `lane ...`); a model named
`hold` waits for the test to release it, `missing` is unknown, `broken` raises."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.test_uvicorn_protocol import serving
from tritonactor.core.errors import not_found
from tritonactor.frontends.drain import Drain
from tritonactor.frontends.http.infer_lane import InferLane
from tritonactor.frontends.http.routes import InferResponse
from tritonactor.frontends.http.uvicorn_protocol import HttpToolsWholeBody

INFER = "/v2/models/m/infer"


def digest(body: bytes) -> str:
    return f"{len(body)} {hashlib.sha256(body).hexdigest()[:12]}"


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
        tag = headers.get("x-tag", "-")
        return InferResponse(f"lane {name} {version or '-'} {tag} {digest(body)}".encode(), None)


class App:
    """The ASGI app: answers `asgi <path> <body digest>`; its `lane` is the infer lane."""

    def __init__(self, routes: StandInRoutes) -> None:
        self.lane = InferLane(routes, max_body=1 << 20)  # type: ignore[arg-type]
        self.started = threading.Event()  # the app was called (a request it answers)
        self.release: threading.Event | None = None

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


@pytest.fixture
def served() -> Iterator[tuple[App, StandInRoutes, int]]:
    routes = StandInRoutes()
    app = App(routes)
    app.release = routes.release  # (set as the server stops: a held request ends)
    with serving(HttpToolsWholeBody, app) as (port, _):
        yield app, routes, port


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


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (it read nothing more, then the end)."""
    return sock.recv(1) == b""


def exchange(port: int, *requests: bytes) -> list[tuple[list[bytes], bytes]]:
    with socket.create_connection(("127.0.0.1", port)) as sock:
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
    names = [line.split(b":")[0] for line in head[1:]]
    assert names == [b"date", b"server", b"content-length", b"content-type"]
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
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(whole[:-40])
        assert app.started.wait(30)  # the app was called at the end of that read
        sock.sendall(whole[-40:])
        _, answer = read_response(sock, bytearray())
    assert answer == f"asgi {INFER} {digest(body)}".encode()


def test_expect_100_continue_is_the_apps(served: tuple[App, StandInRoutes, int]) -> None:
    _, _, port = served
    body = b"abc"
    head, _, _ = request(INFER, body, "Expect: 100-continue").partition(b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head + b"\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        _, answer = read_response(sock, bytearray())
    assert answer == f"asgi {INFER} {digest(body)}".encode()


def test_pipelined_requests_are_answered_in_order(served: tuple[App, StandInRoutes, int]) -> None:
    _, _, port = served
    bodies = [b"first", b"second one", b"third"]
    paths = [INFER, "/v2/models/m/ready", INFER]
    answers = exchange(port, *(request(p, b) for p, b in zip(paths, bodies, strict=True)))
    for (_, answer), path, body in zip(answers, paths, bodies, strict=True):
        # (a request that waited its turn behind another is the app's)
        assert answer.endswith(digest(body).encode())
        assert answer.startswith(b"asgi" if path != INFER else (b"lane", b"asgi"))


def test_an_error_is_answered_as_the_apps_handlers_answer_it(
    served: tuple[App, StandInRoutes, int],
) -> None:
    _, _, port = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request("/v2/models/missing/infer", b"x"))
        buffered = bytearray()
        head, answer = read_response(sock, buffered)
        assert head[0] == b"HTTP/1.1 404 Not Found"
        assert answer == b'{"error":"Request for unknown model: \'missing\' is not found"}'
        # the connection serves on
        sock.sendall(request(INFER, b"y"))
        _, answer = read_response(sock, buffered)
        assert answer.startswith(b"lane m ")


def test_an_unexpected_error_is_answered_500_and_the_connection_closed(
    served: tuple[App, StandInRoutes, int],
) -> None:
    _, _, port = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request("/v2/models/broken/infer", b"x"))
        head, answer = read_response(sock, bytearray())
        assert head[0] == b"HTTP/1.1 500 Internal Server Error"
        assert answer == b'{"error":"internal error: RuntimeError: the stand-in broke"}'
        assert b"connection: close" in head
        assert closed(sock)


def test_an_answer_written_while_draining_closes_the_connection(
    served: tuple[App, StandInRoutes, int],
) -> None:
    app, routes, port = served
    drain = app.lane.drain = Drain(exit_timeout=60)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request("/v2/models/hold/infer", b"x"))
        assert routes.holding.wait(30)
        assert drain.in_flight == 1  # counted in flight by the drain
        drain.draining = True  # (what `begin` sets; its other work needs the server's loop)
        routes.release.set()
        head, answer = read_response(sock, bytearray())
        assert answer.startswith(b"lane hold ")
        assert b"connection: close" in head
        assert closed(sock)
    assert drain.in_flight == 0


def test_nothing_is_taken_while_draining(served: tuple[App, StandInRoutes, int]) -> None:
    app, _, port = served
    drain = app.lane.drain = Drain(exit_timeout=60)
    drain.draining = True
    [(_, answer)] = exchange(port, request(INFER, b"x"))
    assert answer.startswith(b"asgi ")  # the app's gate answers it
