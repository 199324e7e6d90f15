"""`tritonactor serve`'s uvicorn protocol (frontends/http/uvicorn_protocol.py): a body of a
declared length reaches the app in one message once it has all arrived; every other body, and
every other behaviour, is uvicorn's. A real uvicorn serves an app that records what it receives,
on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from uvicorn.importer import import_from_string
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tritonactor import cli
from tritonactor.frontends.http import uvicorn_protocol
from tritonactor.frontends.http.limits import BODY_COMPLETE
from tritonactor.frontends.http.uvicorn_protocol import HttpToolsWholeBody
from tritonactor.settings import Settings


class Recorder:
    """An ASGI app that reads each request's body (except on /unread) and answers with the
    body's length and digest; every message it received is kept, by request path."""

    def __init__(self) -> None:
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.complete_at_start: dict[str, bool] = {}
        self.lock = threading.Lock()
        self.disconnected = threading.Event()
        # /hold answers once `release` is set; what its sends raised, and that it has ended
        self.release = threading.Event()
        self.raised: list[BaseException] = []
        self.held_done = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        received: list[dict[str, Any]] = []
        with self.lock:
            self.messages[path] = received
            # whether the body had all come before the app was called
            self.complete_at_start[path] = BODY_COMPLETE in scope.get("extensions", {})
        body = b""
        if path != "/unread":
            while True:
                message = await receive()
                received.append(message)
                if message["type"] == "http.disconnect":
                    self.disconnected.set()
                    return
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    break
        if path == "/hold":
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        answer = f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()
        headers = [(b"content-length", str(len(answer)).encode())]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": answer})
        except BaseException as error:
            self.raised.append(error)
            raise
        finally:
            if path == "/hold":
                self.held_done.set()


@contextlib.contextmanager
def running(protocol: type[HttpToolsProtocol]) -> Iterator[tuple[Recorder, int, uvicorn.Server]]:
    """A uvicorn with `protocol` (on uvloop, as `tritonactor serve` runs it), serving a
    `Recorder` on a port of its own."""
    app = Recorder()
    with serving(protocol, app) as (port, server):
        yield app, port, server


@contextlib.contextmanager
def serving(
    protocol: type[HttpToolsProtocol], app: Any, **settings: Any
) -> Iterator[tuple[int, uvicorn.Server]]:
    """A uvicorn with `protocol` on uvloop serving `app` on a port of its own, with uvicorn's
    `settings` beside; at the end, `app.release` is set if it has one (what a held request
    waits for)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=protocol, loop="uvloop", lifespan="off", log_level="warning", **settings
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]})
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            threading.Event().wait(0.01)
        yield listener.getsockname()[1], server
    finally:
        release = getattr(app, "release", None)
        if release is not None:
            release.set()
        server.should_exit = True
        thread.join()
        listener.close()


@pytest.fixture
def server() -> Iterator[tuple[Recorder, int, uvicorn.Server]]:
    """A uvicorn with this protocol."""
    with running(HttpToolsWholeBody) as served:
        yield served


@pytest.fixture
def served(server: tuple[Recorder, int, uvicorn.Server]) -> tuple[Recorder, int]:
    return server[0], server[1]


def post(path: str, body: bytes, *headers: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: test", *headers]
    if not any(h.lower().startswith("transfer-encoding") for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def read_answer(sock: socket.socket) -> bytes:
    """One answer's body (its Content-Length's worth)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return rest


def expected(body: bytes) -> bytes:
    return f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()


def test_serve_runs_uvicorn_with_this_protocol(tmp_path: Path) -> None:
    assert import_from_string(cli.UVICORN_PROTOCOL) is HttpToolsWholeBody
    assert issubclass(HttpToolsWholeBody, HttpToolsProtocol)
    (tmp_path / "models").mkdir()
    settings = Settings(model_repositories=(tmp_path / "models",), journal=tmp_path / "journal")
    command = cli.uvicorn_command(settings)
    assert command[command.index("--http") + 1] == cli.UVICORN_PROTOCOL
    # (without uvicorn's access log, which the infer lane leaves to the app: infer_lane.py)
    assert "--no-access-log" in command


def test_a_large_body_reaches_the_app_whole_in_one_message(served: tuple[Recorder, int]) -> None:
    app, port = served
    body = os.urandom(3 * 1024 * 1024)  # many reads (asyncio reads 256 KiB at most)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        request = post("/big", body, "Content-Type: application/octet-stream")
        for start in range(0, len(request), 100_000):  # in pieces, as a client may write it
            sock.sendall(request[start : start + 100_000])
        assert read_answer(sock) == expected(body)
        # The connection serves on: a small body, in one message too, the very bytes read.
        small = b'{"inputs": []}'
        sock.sendall(post("/small", small))
        assert read_answer(sock) == expected(small)
    (message,) = app.messages["/big"]
    assert message["more_body"] is False and message["body"] == body
    (message,) = app.messages["/small"]
    assert type(message["body"]) is bytes and message["body"] == small


def test_a_chunked_body_comes_uvicorns_way(served: tuple[Recorder, int]) -> None:
    app, port = served
    pieces = [os.urandom(100_000) for _ in range(5)]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(post("/chunked", chunked, "Transfer-Encoding: chunked"))
        assert read_answer(sock) == expected(b"".join(pieces))
    assert app.messages["/chunked"][-1]["more_body"] is False


def test_a_body_past_the_limit_comes_in_pieces(
    served: tuple[Recorder, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, port = served
    monkeypatch.setattr(uvicorn_protocol, "WHOLE_LIMIT", 1024 * 1024)
    body = os.urandom(3 * 1024 * 1024)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(post("/big", body))
        assert read_answer(sock) == expected(body)
    assert len(app.messages["/big"]) > 1  # uvicorn pauses past 64 KiB until the app reads


def test_a_body_the_app_does_not_read_is_dropped_and_the_connection_serves_on(
    served: tuple[Recorder, int],
) -> None:
    app, port = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(post("/unread", os.urandom(2 * 1024 * 1024)))
        assert read_answer(sock) == expected(b"")
        small = b"next"
        sock.sendall(post("/small", small))
        assert read_answer(sock) == expected(small)
    assert app.messages["/unread"] == []


def test_expect_100_continue_is_answered_when_the_app_asks_for_the_body(
    served: tuple[Recorder, int],
) -> None:
    app, port = served
    body = os.urandom(500_000)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        request = post("/continue", body, "Expect: 100-continue")
        head, body_part = request[: len(request) - len(body)], request[len(request) - len(body) :]
        sock.sendall(head)
        interim = b""
        while b"\r\n\r\n" not in interim:
            interim += sock.recv(1024)
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body_part)
        assert read_answer(sock) == expected(body)
    (message,) = app.messages["/continue"]
    assert message["body"] == body


def test_a_client_gone_mid_body_is_a_disconnect(served: tuple[Recorder, int]) -> None:
    app, port = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        request = post("/gone", os.urandom(1024 * 1024))
        sock.sendall(request[: len(request) // 2])
        while "/gone" not in app.messages:  # the app waits for the rest of the body
            threading.Event().wait(0.01)
    assert app.disconnected.wait(30)
    assert app.messages["/gone"] == [{"type": "http.disconnect"}]


def test_a_pipelining_client_gone_is_told_to_the_request_still_answering(
    server: tuple[Recorder, int, uvicorn.Server],
) -> None:
    app, port, uvicorn_server = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        # The second request is parsed while the first is still being answered.
        sock.sendall(post("/hold", b"first") + post("/small", b"second"))
        while "/hold" not in app.messages:
            threading.Event().wait(0.01)
    while uvicorn_server.server_state.connections:  # the server has seen the client go
        threading.Event().wait(0.01)
    app.release.set()
    assert app.held_done.wait(30)
    # uvicorn marked only the later request disconnected: the earlier one's answer went to the
    # closed transport, which uvloop refuses with RuntimeError.
    assert app.raised == []
    assert "/small" not in app.messages  # never started


def test_a_pipelined_body_waiting_its_turn_is_read_no_further_than_uvicorn_reads_it(
    server: tuple[Recorder, int, uvicorn.Server],
) -> None:
    """While a request waits behind one still running, its body's limits do not apply yet:
    reading pauses past 64 KiB of it (the running request's `receive` resumes reading)."""
    app, port, uvicorn_server = server
    body = os.urandom(40 * 1024 * 1024)  # more than the sockets' buffers hold
    sock = socket.create_connection(("127.0.0.1", port))
    sender = threading.Thread(
        target=sock.sendall, args=(post("/hold", b"first") + post("/big", body),)
    )
    sender.start()
    try:
        while "/hold" not in app.messages:  # the first request has read its body, and waits
            threading.Event().wait(0.01)
        (protocol,) = uvicorn_server.server_state.connections
        whole: Any = protocol
        while not whole.flow.read_paused and whole._gathered <= 4 * 1024 * 1024:
            threading.Event().wait(0.01)
        assert whole.flow.read_paused
        assert whole._gathered <= 1024 * 1024  # 64 KiB and a read or two
        app.release.set()  # the first answers; the second starts, reads its body, answers
        assert read_answer(sock) == expected(b"first")
        assert read_answer(sock) == expected(body)
    finally:
        app.release.set()
        sender.join()
        sock.close()
    (message,) = app.messages["/big"]
    assert message["body"] == body


def test_a_body_in_before_the_app_is_called_says_so(served: tuple[Recorder, int]) -> None:
    """A small request's body comes in the read that brought its headers: the app is told it
    is all in (its body limits then need not wait for it nor time it: limits.py)."""
    app, port = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(post("/small", b'{"inputs": []}'))
        assert read_answer(sock) == expected(b'{"inputs": []}')
        # A body that comes after the headers, once the app waits for it: not said.
        request = post("/continue", b"later", "Expect: 100-continue")
        sock.sendall(request[: -len(b"later")])
        interim = b""
        while b"\r\n\r\n" not in interim:
            interim += sock.recv(1024)
        sock.sendall(b"later")
        assert read_answer(sock) == expected(b"later")
    assert app.complete_at_start == {"/small": True, "/continue": False}


HANDSHAKE = (
    b"GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
)


def _answers(port: int, *requests: bytes) -> list[tuple[bytes, bytes]]:
    """The status line and body of each answer to `requests`, sent one after the other on one
    connection; the last answer's body is what comes until the connection ends (a refused
    handshake's ends it)."""
    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for index, request in enumerate(requests):
            sock.sendall(request)
            if index < len(requests) - 1:
                answers.append((b"HTTP/1.1 200 OK", read_answer(sock)))
                continue
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            answers.append((head.split(b"\r\n", 1)[0], body))
    return answers


@pytest.mark.parametrize(
    "requests",
    [
        [HANDSHAKE],  # the first request of its connection
        [HANDSHAKE.replace(b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", b"")],
        [post("/small", b"abc"), HANDSHAKE],  # after a request of ours
    ],
)
def test_a_websocket_handshake_is_the_websocket_protocols_as_under_uvicorns_own(
    requests: list[bytes],
) -> None:
    """A handshake goes to uvicorn's WebSocket protocol (the app, which takes no WebSocket,
    is refused there), as with uvicorn's own protocol; it was a parser error (400 "Invalid
    HTTP request received.") as the first request of a connection, where this protocol read
    a request cycle that a handshake does not have."""
    with running(HttpToolsProtocol) as (_, port, _server):
        theirs = _answers(port, *requests)
    with running(HttpToolsWholeBody) as (_, port, _server):
        ours = _answers(port, *requests)
    assert ours == theirs
    assert ours[-1][1] != b"Invalid HTTP request received."
