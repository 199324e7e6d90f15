"""`tritonactor serve` (its uvicorn protocol, its infer lane) on what clients send that a review
against Triton 2.51 found it answering otherwise: an `h2c` upgrade offer with an infer request
(Java's HTTP clients), and encoded slashes in a path. Raw sockets, one real server."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_serve

A = np.arange(16, dtype=np.int32)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("wire")
    repo = root / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))
    server = start_serve(root, {}, "--workers", "1", "--model-repository", str(repo))
    yield server
    server.stop()


def infer_body() -> bytes:
    tensor = {"datatype": "INT32", "shape": [1, 16], "data": A.tolist()}
    return json.dumps(
        {"inputs": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}]}
    ).encode()


def request(method: str, path: str, body: bytes = b"", *headers: str) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def answer(sock: socket.socket, buffered: bytearray) -> tuple[int, bytes]:
    while b"\r\n\r\n" not in buffered:
        buffered += sock.recv(65536)
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(
        int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    buffered[:] = rest[length:]
    return int(lines[0].split()[1]), rest[:length]


def test_an_h2c_upgrade_offer_with_an_infer_request_is_served(serve: ServerProcess) -> None:
    offer = ("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQ")
    body = infer_body()
    path = "/v2/models/simple/infer"
    with socket.create_connection(("127.0.0.1", serve.http_port)) as sock:
        buffered = bytearray()
        # with the next request in the same write; then the body in a write of its own
        sock.sendall(request("POST", path, body, *offer) + request("GET", "/v2/health/ready"))
        status, content = answer(sock, buffered)
        assert status == 200, content
        outputs = {o["name"]: o["data"] for o in json.loads(content)["outputs"]}
        assert outputs["OUTPUT0"] == (A + A).tolist()
        assert answer(sock, buffered)[0] == 200
        whole = request("POST", path, body, *offer)
        sock.sendall(whole[: -len(body)])
        sock.sendall(body)
        assert answer(sock, buffered)[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("GET", "/v2%2Fmodels%2Fsimple%2Fconfig", 404, "Not Found"),
        (
            "POST",
            "/v2/models/simple%2fx/infer",
            404,
            "Request for unknown model: 'simple%2fx' is not found",
        ),
        ("POST", "/v2/models/simple%2Finfer", 405, "Method Not Allowed"),
    ],
)
def test_an_encoded_slash_is_no_path_separator(
    serve: ServerProcess, method: str, path: str, status: int, error: str
) -> None:
    """As Triton reads them (a proxy's rules over the raw path see what the server serves)."""
    with socket.create_connection(("127.0.0.1", serve.http_port)) as sock:
        sock.sendall(request(method, path, infer_body() if method == "POST" else b""))
        got, content = answer(sock, bytearray())
    assert (got, json.loads(content)) == (status, {"error": error})
