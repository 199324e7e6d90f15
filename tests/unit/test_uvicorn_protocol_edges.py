"""`tritonactor serve`'s uvicorn protocol where uvicorn's own failed a client (each found by a
review against Triton 2.51, which serves these): an upgrade offer beside a body, a request head
without end. A real uvicorn on a real socket, as
in test_uvicorn_protocol."""

from __future__ import annotations

import socket

from tests.unit.test_uvicorn_protocol import expected, post, read_answer, running
from tritonactor.frontends.http import uvicorn_protocol
from tritonactor.frontends.http.uvicorn_protocol import HttpToolsWholeBody

H2C = (
    "Connection: Upgrade, HTTP2-Settings",
    "Upgrade: h2c",
    "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA",
)


def read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_an_upgrade_offer_beside_a_body_is_declined_and_the_body_read() -> None:
    """Java's HTTP clients offer h2c with each request: the request is served as HTTP/1.1,
    its body whole, and a request after it on the connection too (uvicorn gave the app an empty
    body, then read the body as a request of its own)."""
    body = b'{"inputs": [1, 2, 3]}'
    with running(HttpToolsWholeBody) as (app, port, _):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            # in one write, with the next request after it
            sock.sendall(post("/offer", body, *H2C) + post("/after", b"next"))
            assert read_answer(sock) == expected(body)
            assert read_answer(sock) == expected(b"next")
            # the head first, the body in a later write
            request = post("/split", body, *H2C)
            head = request[: request.index(b"\r\n\r\n") + 4]
            sock.sendall(head)
            sock.sendall(request[len(head) :])
            assert read_answer(sock) == expected(body)
            # and without a body: served as before
            sock.sendall(
                b"GET /get HTTP/1.1\r\nHost: t\r\n" + "\r\n".join(H2C).encode() + b"\r\n\r\n"
            )
            assert read_answer(sock) == expected(b"")
        assert app.messages["/offer"][-1]["more_body"] is False


def test_a_request_head_past_its_bound_is_refused_and_the_server_serves_on() -> None:
    with running(HttpToolsWholeBody) as (app, port, _):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /big HTTP/1.1\r\nHost: t\r\nX-Long: ")
            piece = b"x" * 16384
            answer = b""
            try:  # sent until the server answers and closes (it may reset what is still sent)
                for _ in range(4 * uvicorn_protocol.MAX_HEAD_BYTES // len(piece)):
                    sock.sendall(piece)
                answer = read_to_end(sock)
            except ConnectionError:
                pass
            assert answer == b"" or answer.startswith(b"HTTP/1.1 431 ")
        assert "/big" not in app.messages
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(post("/ok", b"fine"))
            assert read_answer(sock) == expected(b"fine")


def test_a_head_within_its_bound_over_many_reads_is_served() -> None:
    with (
        running(HttpToolsWholeBody) as (_, port, _),
        socket.create_connection(("127.0.0.1", port)) as sock,
    ):
        sock.sendall(b"POST /long HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nX-Long: ")
        for _ in range(3):
            sock.sendall(b"y" * 10000)
        sock.sendall(b"\r\n\r\nok")
        assert read_answer(sock) == expected(b"ok")
