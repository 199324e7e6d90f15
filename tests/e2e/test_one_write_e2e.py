"""`tritonactor serve` writes each answer in one write (frontends/http/uvicorn_protocol.py): a
client reading a keep-alive connection finds the whole response, headers and body, in its first
read; large answers in several pieces still read whole."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model, identity_model
from tests.server_process import ServerProcess, start_serve

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("one-write")
    repo = root / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))
    identity_model(repo / "variable_fp32" / "1" / "model.onnx", "FP32", ["batch", "n"])
    server = start_serve(root, {}, "--model-repository", str(repo))
    yield server
    server.stop()


def one_read(connection: socket.socket, request: bytes) -> tuple[bytes, bytes]:
    """Send `request`; the head and body of the answer found by one read of the connection."""
    connection.sendall(request)
    data = connection.recv(1 << 20)
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise AssertionError(f"no content-length in {head!r}")


def test_a_keep_alive_client_reads_each_answer_whole_in_one_read(served: ServerProcess) -> None:
    a = list(range(16))
    json_body = orjson.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )
    request = (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nhost: test\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(json_body), json_body)
    )
    with socket.create_connection(("127.0.0.1", served.http_port)) as connection:
        for _ in range(20):
            head, body = one_read(connection, request)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert len(body) == content_length(head)  # nothing left for a second read
            json_length = int(head.lower().split(b"inference-header-content-length: ")[1][:3])
            answer = orjson.loads(body[:json_length])
            assert answer["outputs"][0]["parameters"] == {"binary_data_size": 64}
            summed = np.frombuffer(body[json_length:], dtype=np.int32)
            np.testing.assert_array_equal(summed, np.array(a, dtype=np.int32) + 1)
        # An error is an answer too: one read, Triton's JSON error.
        head, body = one_read(
            connection,
            b"POST /v2/models/nothing/infer HTTP/1.1\r\nhost: test\r\ncontent-length: 2\r\n\r\n{}",
        )
        assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
        assert len(body) == content_length(head)
        assert "nothing" in orjson.loads(body)["error"]


def test_large_answers_in_several_pieces_read_whole(served: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.http_port}")
    rng = np.random.default_rng(3)
    try:
        for _ in range(3):
            data = rng.random((1, 1 << 18), dtype=np.float32)  # 1 MiB in, 1 MiB out
            given = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
            given.set_data_from_numpy(data, binary_data=True)
            wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            result = client.infer("variable_fp32", [given], outputs=[wanted])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.close()
