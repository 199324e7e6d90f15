"""`tritonactor serve` answers an infer request through its infer lane (frontends/http/
infer_lane.py) as it answers it through the app. The lane never takes a request that asks
`Expect: 100-continue` (uvicorn answers that when the app asks for the body); it takes the same
request without it. Each case is sent both ways to one real server, on one keep-alive
connection, and the two answers compared: status, every header but the date, and the body
(decompressed where the answer is compressed); and to a server with the lane turned off
(`--http-lane false`), without `Expect`, its answer compared the same way."""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model, string_identity_model
from tests.server_process import ServerProcess, start_serve

INPUTS = np.arange(16, dtype=np.int32).reshape(1, 16)


def _serve(root: Path, *flags: str) -> ServerProcess:
    repo = root / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))
    string_identity_model(repo / "strings" / "1" / "model.onnx")
    return start_serve(root, {}, "--workers", "1", "--model-repository", str(repo), *flags)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _serve(tmp_path_factory.mktemp("lane"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def serve_without_lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The same server with the lane turned off: every request through the app."""
    server = _serve(tmp_path_factory.mktemp("no-lane"), "--http-lane", "false")
    yield server
    server.stop()


def _json_request() -> bytes:
    tensor = {"datatype": "INT32", "shape": [1, 16], "data": INPUTS.flatten().tolist()}
    return json.dumps(
        {"inputs": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}]}
    ).encode()


def _binary_request() -> tuple[bytes, int]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": n,
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                }
                for n in ("INPUT0", "INPUT1")
            ],
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"binary_data": True}},
                {"name": "OUTPUT1"},
            ],
        }
    ).encode()
    return header + INPUTS.tobytes() * 2, len(header)


def _cases() -> list[tuple[str, str, bytes, tuple[str, ...]]]:
    binary, header_length = _binary_request()
    plain = _json_request()
    return [
        ("json", "/v2/models/simple/infer", plain, ()),
        ("version", "/v2/models/simple/versions/1/infer", plain, ()),
        (
            "binary",
            "/v2/models/simple/infer",
            binary,
            (f"Inference-Header-Content-Length: {header_length}",),
        ),
        (
            "raw",
            "/v2/models/strings/infer",
            b"a raw string",
            ("Inference-Header-Content-Length: 0",),
        ),
        ("gzip in", "/v2/models/simple/infer", gzip.compress(plain), ("Content-Encoding: gzip",)),
        ("deflate out", "/v2/models/simple/infer", plain, ("Accept-Encoding: deflate",)),
        ("gzip out", "/v2/models/simple/infer", plain, ("Accept-Encoding: gzip",)),
        ("unknown coding", "/v2/models/simple/infer", plain, ("Content-Encoding: br2",)),
        ("unknown model", "/v2/models/nothing/infer", plain, ()),
        ("unknown version", "/v2/models/simple/versions/9/infer", plain, ()),
        ("bad json", "/v2/models/simple/infer", b"{not json", ()),
        ("wrong input", "/v2/models/simple/infer", plain.replace(b"INPUT1", b"INPUT7"), ()),
        (
            "header past body",
            "/v2/models/simple/infer",
            plain,
            ("Inference-Header-Content-Length: 99999",),
        ),
    ]


class Connection:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buffered = b""

    def close(self) -> None:
        self.sock.close()

    def _head(self) -> bytes:
        while b"\r\n\r\n" not in self.buffered:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            self.buffered += data
        head, _, self.buffered = self.buffered.partition(b"\r\n\r\n")
        return head

    def _response(self, head: bytes) -> tuple[int, dict[str, str], bytes]:
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.lower()] = value.strip()
        length = int(headers["content-length"])
        while len(self.buffered) < length:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            self.buffered += data
        body, self.buffered = self.buffered[:length], self.buffered[length:]
        coding = headers.get("content-encoding")
        if coding == "gzip":
            body = gzip.decompress(body)
        elif coding == "deflate":
            body = zlib.decompress(body)
        headers.pop("date", None)
        return status, headers, body

    def ask(
        self, path: str, body: bytes, headers: tuple[str, ...], expect_continue: bool
    ) -> tuple[int, dict[str, str], bytes]:
        lines = [f"POST {path} HTTP/1.1", "Host: test", *headers, f"Content-Length: {len(body)}"]
        if expect_continue:
            lines.append("Expect: 100-continue")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        if not expect_continue:
            self.sock.sendall(head + body)
            return self._response(self._head())
        self.sock.sendall(head)
        first = self._head()
        if first.startswith(b"HTTP/1.1 100"):
            self.sock.sendall(body)
            return self._response(self._head())
        return self._response(first)  # answered before the body was asked for


@pytest.mark.parametrize(
    ("name", "path", "body", "headers"), _cases(), ids=[c[0] for c in _cases()]
)
def test_the_lane_answers_as_the_app_does(
    serve: ServerProcess, name: str, path: str, body: bytes, headers: tuple[str, ...]
) -> None:
    connection = Connection(serve.http_port)
    try:
        through_app = connection.ask(path, body, headers, expect_continue=True)
        through_lane = connection.ask(path, body, headers, expect_continue=False)
        # and again through the app, on the same connection after the lane's answer
        again = connection.ask(path, body, headers, expect_continue=True)
    finally:
        connection.close()
    assert through_lane == through_app == again


@pytest.mark.parametrize(
    ("name", "path", "body", "headers"), _cases(), ids=[c[0] for c in _cases()]
)
def test_the_lane_answers_as_a_server_without_it(
    serve: ServerProcess,
    serve_without_lane: ServerProcess,
    name: str,
    path: str,
    body: bytes,
    headers: tuple[str, ...],
) -> None:
    """The same bytes to a server with the lane and to one with `--http-lane false`: the same
    answer (uvicorn's `server` header and all)."""
    answers = []
    for server in (serve, serve_without_lane):
        connection = Connection(server.http_port)
        try:
            answers.append(connection.ask(path, body, headers, expect_continue=False))
        finally:
            connection.close()
    assert answers[0] == answers[1]


def test_the_lane_answers_a_keep_alive_connections_requests_one_after_another(
    serve: ServerProcess,
) -> None:
    connection = Connection(serve.http_port)
    try:
        answers = [
            connection.ask("/v2/models/simple/infer", _json_request(), (), False) for _ in range(50)
        ]
    finally:
        connection.close()
    status, _, body = answers[0]
    assert status == 200
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert outputs["OUTPUT0"] == (INPUTS * 2).flatten().tolist()
    assert outputs["OUTPUT1"] == [0] * 16
    assert all(answer == answers[0] for answer in answers)


def test_the_lane_sends_what_triton_clients_read(serve: ServerProcess) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{serve.http_port}")
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(INPUTS, binary_data=True)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    for _ in range(3):
        result = client.infer("simple", inputs, outputs=outputs)
        assert (result.as_numpy("OUTPUT0") == INPUTS * 2).all()
        assert (result.as_numpy("OUTPUT1") == 0).all()
    client.close()
