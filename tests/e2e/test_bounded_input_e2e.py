"""Bounded input on the real server (docs/limits.md): a body past the size limit, a body that
does not arrive in time, JSON nested too deep, a compressed body that does not inflate or
inflates past the limit, gRPC messages past the size limit or that do not parse. Each gets
its status and a message naming the limit, the server keeps serving, and its log has no
traceback. Compressed bodies within the limits are served, and answers compressed as asked.

Both topologies: `tritonactor serve --workers 2` (uvicorn front ends before one engine) and
`hypercorn tritonactor.app:app` in one process; the limits are the front ends'.
"""

from __future__ import annotations

import gzip
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tests.server_process import free_port, loopback_env, wait_for
from tritonactor.frontends.grpc.wire import _varint

pytestmark = pytest.mark.e2e

MAX_INPUT = 1024 * 1024
MAX_MESSAGE = 1024 * 1024
BODY_TIMEOUT = 2
INFER = "/v2/models/simple/infer"
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.http_port), timeout=60)
        return sock


def _start(kind: str, root: Path) -> Served:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = loopback_env(root, http_port, grpc_port, metrics_port)
    env.update(
        {
            "TRITONACTOR_HTTP_MAX_INPUT_SIZE": str(MAX_INPUT),
            "TRITONACTOR_HTTP_BODY_TIMEOUT_SECS": str(BODY_TIMEOUT),
            "TRITONACTOR_GRPC_MAX_MESSAGE_SIZE": str(MAX_MESSAGE),
            # Explicit, so that the load route reads its body.
            "TRITONACTOR_MODEL_CONTROL_MODE": "explicit",
            "TRITONACTOR_LOAD_MODEL": "simple",
            # Verbose: a client that leaves mid-body is one debug line, the event waited on.
            "TRITONACTOR_LOG_VERBOSE": "1",
        }
    )
    if kind == "serve":
        command = [sys.executable, "-m", "tritonactor.cli", "serve", "--workers", "2"]
    else:
        command = [
            sys.executable,
            "-m",
            "hypercorn",
            "tritonactor.app:app",
            "--bind",
            f"127.0.0.1:{http_port}",
        ]
    log = root / f"server-{kind}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    served = Served(process, http_port, grpc_port, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited {process.returncode}:\n{served.output()}")
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/v2/health/ready").status_code == 200:
                return served
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    _stop(served)
    raise AssertionError(f"server did not start:\n{served.output()}")


def _stop(served: Served) -> None:
    # Its own session: the signal reaches the front ends and the engine it started.
    os.killpg(served.process.pid, signal.SIGTERM)
    try:
        served.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(served.process.pid, signal.SIGKILL)
        served.process.wait()


@pytest.fixture(scope="module", params=["serve", "hypercorn"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    server = _start(request.param, tmp_path_factory.mktemp(f"bounded-{request.param}"))
    try:
        yield server
    finally:
        _stop(server)


def _infer_body() -> bytes:
    data = list(range(16))
    return orjson.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": data},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": data},
            ]
        }
    )


def _still_serves(served: Served) -> None:
    """An inference over HTTP and one over gRPC succeed, and the log has no traceback."""
    answer = httpx.post(f"http://127.0.0.1:{served.http_port}{INFER}", content=_infer_body())
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [2 * i for i in range(16)]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)
    result = client.infer("simple", inputs)
    assert result.as_numpy("OUTPUT0").tolist() == [[2 * i for i in range(16)]]
    client.close()
    assert "Traceback" not in served.output(), served.output()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length, read from `sock`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the response"
        body += chunk
    return status, headers, body


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (it sends nothing more)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_declared_length_past_the_limit_is_answered_before_the_body(served: Served) -> None:
    with served.connect() as sock:
        sock.sendall(
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {1024**3}\r\n\r\n".encode()
            + b"{" * 100
        )
        # The answer comes while 1 GiB is still to send: nothing waits for the body.
        status, headers, body = _read_response(sock)
        assert status == 400
        assert headers["connection"].lower() == "close"
        assert orjson.loads(body)["error"] == (
            f"request body size of {1024**3} bytes exceeds the maximum allowed input size of "
            f"{MAX_INPUT} bytes. Use --http-max-input-size to increase the limit."
        )
        assert _closed(sock)
    _still_serves(served)


def test_a_chunked_body_past_the_limit_is_refused_as_it_arrives(served: Served) -> None:
    piece = b" " * 65536

    def chunks() -> Iterator[bytes]:
        for _ in range(MAX_INPUT // len(piece) + 2):
            yield piece

    answer = httpx.post(f"http://127.0.0.1:{served.http_port}{INFER}", content=chunks())
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert f"exceeds the maximum allowed input size of {MAX_INPUT} bytes" in message
    assert "--http-max-input-size" in message
    # At the limit it is read, and then it is the JSON that is wrong.
    answer = httpx.post(
        f"http://127.0.0.1:{served.http_port}{INFER}", content=iter([b" " * MAX_INPUT])
    )
    assert answer.status_code == 400
    assert "failed to parse the request JSON buffer" in answer.json()["error"]
    _still_serves(served)


def test_a_body_past_the_limit_on_a_route_that_reads_no_body(served: Served) -> None:
    with served.connect() as sock:
        sock.sendall(
            f"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_INPUT + 1}"
            "\r\n\r\n".encode()
        )
        status, _, body = _read_response(sock)
    assert status == 400
    assert "--http-max-input-size" in orjson.loads(body)["error"]


def test_slow_bodies_get_408_and_their_connections_close(served: Served) -> None:
    slow = []
    for _ in range(5):
        sock = served.connect()
        sock.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{".encode())
        slow.append(sock)
    # They hold nothing the server needs: others are served while they dawdle.
    _still_serves(served)
    for sock in slow:
        with sock:
            status, headers, body = _read_response(sock)
            assert status == 408
            assert headers["connection"].lower() == "close"
            assert orjson.loads(body)["error"] == (
                f"the request body did not arrive within {BODY_TIMEOUT} seconds. Use "
                "--http-body-timeout-secs to increase the limit."
            )
            assert _closed(sock)
    _still_serves(served)


def test_a_websocket_handshake_is_refused_and_the_server_serves_on(served: Served) -> None:
    # No route takes a WebSocket: the handshake is refused by the WebSocket protocol, the same
    # under both ASGI servers (docs/decisions.md; Triton ignores the Upgrade header). It was a
    # parser error under serve's uvicorn protocol on a fresh connection (a 400 "Invalid HTTP
    # request received.").
    handshake = (
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    with served.connect() as sock:
        sock.sendall(handshake)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 403 "), answer
    _still_serves(served)


def test_a_keep_alive_connection_serves_on_after_a_refused_body(served: Served) -> None:
    """A body that was read whole and refused (too deep) leaves its connection usable."""
    deep = b"[" * 1000 + b"1" + b"]" * 1000
    with httpx.Client(base_url=f"http://127.0.0.1:{served.http_port}") as client:
        answer = client.post(INFER, content=b'{"inputs":[{"name":"INPUT0","data":' + deep + b"}]}")
        assert answer.status_code == 400
        assert answer.json()["error"] == (
            "JSON nesting depth exceeds maximum allowed limit (100). Use --http-max-json-depth "
            "to increase the limit."
        )
        assert client.post(INFER, content=_infer_body()).status_code == 200
    _still_serves(served)


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/index",
        "/v2/repository/models/simple/load",
        "/v2/logging",
        "/v2/trace/setting",
        "/v2/systemsharedmemory/region/r/register",
        "/v2/models/simple/generate",
    ],
)
def test_json_nested_too_deep_is_refused_on_every_route(served: Served, path: str) -> None:
    deep = b'{"parameters":' + b"[" * 5000 + b"]" * 5000 + b"}"
    answer = httpx.post(f"http://127.0.0.1:{served.http_port}{path}", content=deep)
    assert answer.status_code == 400, answer.text
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in answer.json()["error"]


def test_tritonclient_json_and_binary_requests_pass_the_limits(served: Served) -> None:
    """What a client sends every day is within the limits: JSON data nested as its shape, and
    binary data."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.http_port}")
    for binary in (False, True):
        result = client.infer("simple", _simple_inputs(binary))
        assert result.as_numpy("OUTPUT0").tolist() == (2 * SIMPLE_DATA).tolist()
    client.close()


SIMPLE_DATA = np.arange(16, dtype=np.int32).reshape(1, 16)


def _simple_inputs(binary: bool) -> list[httpclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(SIMPLE_DATA, binary_data=binary)
        inputs.append(tensor)
    return inputs


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_compresses_requests_and_responses(served: Served, coding: str) -> None:
    """tritonclient's request and response compression, JSON and binary data (whose
    Inference-Header-Content-Length counts the bytes before compression)."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.http_port}")
    for binary in (False, True):
        inputs = _simple_inputs(binary)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
        for request_coding, response_coding in ((coding, None), (None, coding), (coding, coding)):
            result = client.infer(
                "simple",
                inputs,
                outputs=outputs,
                request_compression_algorithm=request_coding,
                response_compression_algorithm=response_coding,
            )
            assert result.as_numpy("OUTPUT0").tolist() == (2 * SIMPLE_DATA).tolist()
    client.close()
    # The answer is compressed as asked, and says so.
    answer = httpx.post(
        f"http://127.0.0.1:{served.http_port}{INFER}",
        content=_infer_body(),
        headers={"Accept-Encoding": f"br;q=0.9, {coding};q=0.5"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-encoding"] == coding
    assert answer.json()["outputs"][0]["data"] == [2 * i for i in range(16)]  # httpx inflates


def test_a_body_in_a_coding_the_server_does_not_read_is_501(served: Served) -> None:
    answer = httpx.post(
        f"http://127.0.0.1:{served.http_port}{INFER}",
        content=_infer_body(),
        headers={"Content-Encoding": "br"},
    )
    assert answer.status_code == 501, answer.text
    assert answer.json() == {"error": "Unsupported compression type"}
    assert answer.headers["accept-encoding"] == "gzip, deflate"
    # The model is looked up first, as Triton does: an unknown one is 404 whatever its body.
    for headers in ({"Content-Encoding": "br"}, {"Inference-Header-Content-Length": "x"}):
        answer = httpx.post(
            f"http://127.0.0.1:{served.http_port}/v2/models/nosuch/infer",
            content=_infer_body(),
            headers=headers,
        )
        assert answer.status_code == 404, answer.text
    _still_serves(served)


def test_a_compressed_body_that_does_not_inflate_is_refused(served: Served) -> None:
    answer = httpx.post(
        f"http://127.0.0.1:{served.http_port}{INFER}",
        content=gzip.compress(_infer_body())[:40],
        headers={"Content-Encoding": "gzip"},
    )
    assert answer.status_code == 400, answer.text
    assert answer.json() == {
        "error": "failed to decompress the request body: it ends before its data"
    }
    _still_serves(served)


def test_a_compressed_body_that_inflates_past_the_limit_is_refused(served: Served) -> None:
    """A small body that would inflate to 4 MiB, past the 1 MiB limit: refused as the inflater
    passes the limit, with Triton's words."""
    bomb = gzip.compress(b"{" + b" " * (4 * MAX_INPUT) + b"}")
    assert len(bomb) < MAX_INPUT // 100
    answer = httpx.post(
        f"http://127.0.0.1:{served.http_port}{INFER}",
        content=bomb,
        headers={"Content-Encoding": "gzip"},
    )
    assert answer.status_code == 400, answer.text
    assert answer.json() == {
        "error": f"Decompressed data size exceeds the maximum allowed value of {MAX_INPUT} "
        "bytes. Use --http-max-input-size to increase the limit."
    }
    _still_serves(served)


def _grpc_call(served: Served, method: str, body: bytes) -> grpc.RpcError | bytes:
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}", options=options) as channel:
        call = channel.unary_unary(
            f"/inference.GRPCInferenceService/{method}",
            request_serializer=None,
            response_deserializer=None,
        )
        try:
            return call(body, timeout=60)
        except grpc.RpcError as error:
            return error


@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("ModelInfer", b"\x0a\x02\xff\xfe"),  # model_name: 2 bytes that are not UTF-8
        ("ModelInfer", b"\xff\xff\xff"),  # no message at all
        ("ModelMetadata", b"\x0a\x02\xff\xfe"),
        ("ModelConfig", b"\x0a\x02\xff\xfe"),
    ],
)
def test_grpc_bytes_that_do_not_parse_are_invalid_argument(
    served: Served, method: str, body: bytes
) -> None:
    error = _grpc_call(served, method, body)
    assert isinstance(error, grpc.RpcError)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("Unable to parse request")
    _still_serves(served)


def test_grpc_stream_bytes_that_do_not_parse_end_it_invalid_argument(served: Served) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.RpcError) as raised:
            list(call(iter([b"\x0a\x02\xff\xfe"]), timeout=60))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith("Unable to parse request")
    _still_serves(served)


def test_grpc_stream_answers_the_requests_before_a_bad_message(served: Served) -> None:
    """The requests a stream sent before a message that does not parse are answered before
    the stream ends with its status (they were dropped when the message came first)."""
    request = service_pb2.ModelInferRequest(model_name="simple", id="before")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    good = request.SerializeToString()
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=None,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        # Many: without the fix some were always still in the server when the bad one came.
        answers = call(iter([good] * 50 + [b"\x0a\x02\xff\xfe"]), timeout=60)
        got = []
        with pytest.raises(grpc.RpcError) as raised:
            for answer in answers:
                got.append(answer)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert [(a.error_message, a.infer_response.id) for a in got] == [("", "before")] * 50
    _still_serves(served)


def test_grpc_message_past_the_limit_is_resource_exhausted(served: Served) -> None:
    big = b"\x0a\x06simple" + b"\x3a\x80\x80\x40" + b"x" * MAX_MESSAGE  # raw_input_contents
    error = _grpc_call(served, "ModelInfer", big)
    assert isinstance(error, grpc.RpcError)
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details() == (
        f"Received message larger than max ({len(big)} vs. {MAX_MESSAGE}). Use "
        "--grpc-max-message-size to increase the limit."
    )
    # Refused messages give their flow-control window back: more of them on one connection
    # than its window (64 MiB) holds, and it still serves.
    huge = b"\x0a\x06simple" + b"\x3a\x80\x80\x80\x05" + b"x" * (10 * 1024 * 1024)
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}", options=options) as channel:
        call = channel.unary_unary(GRPC_INFER, request_serializer=None, response_deserializer=None)
        for _ in range(8):
            with pytest.raises(grpc.RpcError) as raised:
                call(huge, timeout=60)
            assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as raised:
            call(b"\x0a\x06simple", timeout=60)
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # read: no inputs
    # At the limit it is read: then the request is wrong for the model, not too large.
    fits = b"\x0a\x06simple" + b"\x3a" + _varint(MAX_MESSAGE - 32) + b"x" * (MAX_MESSAGE - 32)
    assert len(fits) <= MAX_MESSAGE
    error = _grpc_call(served, "ModelInfer", fits)
    assert isinstance(error, grpc.RpcError)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    _still_serves(served)


def _grpc_raw(served: Served, path: str, data: bytes, before: bytes = b"") -> tuple[str, str]:
    """Send `data` as a gRPC call's whole request stream, framing and all (over HTTP/2 as it
    is, with h2), after the bytes `before` (frames h2 would not write), and return the call's
    grpc-status and grpc-message."""
    with socket.create_connection(("127.0.0.1", served.grpc_port), timeout=60) as sock:
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        connection.initiate_connection()
        sock.sendall(connection.data_to_send() + before)
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        connection.send_headers(1, headers)
        connection.send_data(1, data, end_stream=True)
        sock.sendall(connection.data_to_send())
        while True:
            received = sock.recv(65536)
            assert received, "connection closed before the call's status"
            for event in connection.receive_data(received):
                if isinstance(event, h2.events.DataReceived):
                    connection.acknowledge_received_data(event.flow_controlled_length, 1)
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    fields = {bytes(k).decode(): bytes(v).decode() for k, v in event.headers}
                    if "grpc-status" in fields:
                        return fields["grpc-status"], fields.get("grpc-message", "")
                assert not isinstance(event, h2.events.StreamReset), event
            sock.sendall(connection.data_to_send())


@pytest.mark.parametrize("prefix", [b"\x00\x00", b"\x00\x00\x00"])
@pytest.mark.parametrize(
    "path",
    [
        GRPC_INFER,
        "/inference.GRPCInferenceService/ModelStreamInfer",
        "/grpc.health.v1.Health/Check",
    ],
)
def test_grpc_a_prefix_cut_short_is_invalid_argument(
    served: Served, path: str, prefix: bytes
) -> None:
    status, message = _grpc_raw(served, path, prefix)
    assert (status, message) == (
        str(grpc.StatusCode.INVALID_ARGUMENT.value[0]),
        "Unable to parse request: truncated message",
    )
    _still_serves(served)


@pytest.mark.parametrize(
    "path",
    [GRPC_INFER, "/inference.GRPCInferenceService/ModelMetadata", "/grpc.health.v1.Health/Check"],
)
def test_grpc_a_unary_call_with_no_message_is_invalid_argument(served: Served, path: str) -> None:
    """A unary call whose request stream ends before any message: the client's error, no
    traceback (grpclib's handlers assert a message came: UNKNOWN before)."""
    status, message = _grpc_raw(served, path, b"")
    assert (status, message) == (
        str(grpc.StatusCode.INVALID_ARGUMENT.value[0]),
        "Unable to parse request: no request message",
    )
    _still_serves(served)
    assert "Traceback" not in served.output()


def _frame(kind: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, 0]) + stream.to_bytes(4, "big") + payload


def _simple_call() -> bytes:
    """A ModelInfer call's request stream for simple: its one length-prefixed message."""
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    message = request.SerializeToString()
    return b"\x00" + len(message).to_bytes(4, "big") + message


def test_grpc_frames_of_types_http2_does_not_define_are_ignored(served: Served) -> None:
    # RFC 9113 (4.1): a frame of an unknown type is ignored and discarded, as Triton does;
    # extensions send such frames (PRIORITY_UPDATE 0x10, ORIGIN 0xc), on the connection or on a
    # stream. Before, grpclib raised on them and the connection ended with the call unanswered.
    unknown = (
        _frame(0x10, 0, b"\x00\x00\x00\x01u=1")  # PRIORITY_UPDATE, for stream 1
        + _frame(0xC, 0, b"\x00\x08http://x")  # ORIGIN
        + _frame(0xFA, 0, b"anything")
        + _frame(0xFF, 1, b"")  # on the stream the call opens next
    )
    live = "/inference.GRPCInferenceService/ServerLive"
    assert _grpc_raw(served, live, b"\x00\x00\x00\x00\x00", before=unknown) == ("0", "")
    status, message = _grpc_raw(served, GRPC_INFER, _simple_call(), unknown)
    assert (status, message) == ("0", "")
    _still_serves(served)


@pytest.mark.parametrize("method", ["TraceSetting", "LogSettings"])
def test_grpc_settings_bytes_that_do_not_parse_are_invalid_argument(
    served: Served, method: str
) -> None:
    # A settings entry whose bytes end inside its key's tag: not a message (protobuf says so;
    # betterproto2 alone would read an entry with an empty key).
    error = _grpc_call(served, method, b"\x0a\x02\xff\xfe")
    assert isinstance(error, grpc.RpcError)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("Unable to parse request: Error parsing message")
    _still_serves(served)


def _entry_without_value(key: str) -> bytes:
    """A map<string, message> field 1 holding `key` with no value: valid protobuf, where the
    value is the empty message."""
    entry = b"\x0a" + bytes([len(key)]) + key.encode()
    return b"\x0a" + bytes([len(entry)]) + entry


def test_grpc_settings_entries_without_a_value_hold_the_empty_value(served: Served) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    try:
        initial = client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"]
        client.update_trace_settings(settings={"trace_rate": "7"})
        assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["7"]
        # As an empty list does (Triton's rule too): the setting goes back to its default.
        answer = _grpc_call(served, "TraceSetting", _entry_without_value("trace_rate"))
        assert isinstance(answer, bytes), answer
        assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == (
            initial
        )
        # As an empty value does: the setting stays as it is.
        before = client.get_log_settings(as_json=True)["settings"]
        answer = _grpc_call(served, "LogSettings", _entry_without_value("log_info"))
        assert isinstance(answer, bytes), answer
        assert client.get_log_settings(as_json=True)["settings"] == before
        # A load parameter without a value is a parameter without a value.
        error = _grpc_call(
            served,
            "RepositoryModelLoad",
            b"\x12\x06simple\x1a" + _entry_without_value("config")[1:],
        )
        assert isinstance(error, grpc.RpcError)
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == (
            "load parameter 'config' for model 'simple' must be a string holding the model "
            "configuration as JSON, not no value"
        )
    finally:
        client.close()
    _still_serves(served)


DEEP_CONFIG = '{"name": "simple", "parameters": ' + "[" * 5000 + "]" * 5000 + "}"
DEPTH_ERROR = (
    "load parameter 'config' for model 'simple': JSON nesting depth exceeds maximum allowed "
    "limit (100). Use --http-max-json-depth to increase the limit."
)


def test_a_load_config_nested_too_deep_is_refused_on_both_protocols(served: Served) -> None:
    # The body itself is 2 deep: it is the config string that nests.
    answer = httpx.post(
        f"http://127.0.0.1:{served.http_port}/v2/repository/models/simple/load",
        content=orjson.dumps({"parameters": {"config": DEEP_CONFIG}}),
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == DEPTH_ERROR
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("simple", config=DEEP_CONFIG)
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert raised.value.message() == DEPTH_ERROR
        assert client.is_model_ready("simple")  # nothing changed
    finally:
        client.close()
    _still_serves(served)


_GONE = "the client disconnected"


@pytest.mark.parametrize(
    "path", [INFER, "/v2/repository/models/simple/load", "/v2/models/simple/generate"]
)
def test_a_client_that_leaves_mid_body_costs_one_debug_line(served: Served, path: str) -> None:
    seen = served.output().count(_GONE)
    with served.connect() as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n".encode()
            + b" " * 100
        )
    # Closed with 900 bytes owed: the server notices, and says so in one debug line.
    wait_for(
        lambda: served.output().count(_GONE) > seen or "Traceback" in served.output(),
        timeout=60,
        describe=served.output,
    )
    # A later request answered (and no traceback) before counting: a second line for the same
    # client would have had its chance to appear.
    _still_serves(served)
    assert served.output().count(_GONE) == seen + 1, served.output()
