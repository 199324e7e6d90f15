"""The python backend behind the real server, through tritonclient (HTTP and gRPC): the models in
tests/python_models, plus an ONNX model for BLS to call."""

from __future__ import annotations

import asyncio
import queue
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpclib.client import Channel
from tritonclient.utils import InferenceServerException

from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server
from tritonactor._proto import inference as pb

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
# A generous bound on waiting for an event; reaching it is a failure, never an expected outcome.
EVENT_TIMEOUT_S = 60.0
SERVED = (
    "add_sub",
    "identity_bytes",
    "repeat",
    "bls",
    "faulty",
    "async_add",
    "crash",
    "autocomplete",
    "cancellable",
    "reshaped",
    "bf16_dlpack",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python_repo")
    for name in SERVED:
        shutil.copytree(MODELS / name, repo / name)
    add_sub_model(repo / "onnx_add_sub" / "1" / "model.onnx", "FP32", (4,), batch=False)
    process = start_server([repo], tmp_path_factory.mktemp("python_server"))
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


@pytest.fixture
def grpc(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def http_input(name: str, data: np.ndarray, datatype: str) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def grpc_input(name: str, data: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


A = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
B = np.array([0.5, 0.5, 0.5, 0.5], dtype=np.float32)


def test_add_sub_over_http_and_grpc(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    result = http.infer(
        "add_sub", [http_input("INPUT0", A, "FP32"), http_input("INPUT1", B, "FP32")]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    result = grpc.infer(
        "add_sub", [grpc_input("INPUT0", A, "FP32"), grpc_input("INPUT1", B, "FP32")]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_a_request_id_larger_than_the_stubs_socket_buffers_is_served(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """A 1 MB request id travels to the model in its execute message, larger than the
    socket's buffers: it is served and echoed, and the model serves on (it hung, the stub
    left half a message, before ipc's writes waited for room)."""
    long_id = "x" * 1_000_000
    inputs = [http_input("INPUT0", A, "FP32"), http_input("INPUT1", B, "FP32")]
    result = http.infer("add_sub", inputs, request_id=long_id)
    assert result.get_response()["id"] == long_id
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    result = grpc.infer(
        "add_sub",
        [grpc_input("INPUT0", A, "FP32"), grpc_input("INPUT1", B, "FP32")],
        request_id=long_id,
        client_timeout=EVENT_TIMEOUT_S,
    )
    assert result.get_response().id == long_id
    result = http.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_a_config_reshape_applies_between_client_and_model(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """The model gets INPUT0 ([b, 3] from the client) in its reshape, [b, 1, 3]; ECHO, made in
    its reshape, reaches the client in its dims, [b, 3] (as Triton 2.51 does for python models)."""
    data = np.arange(6, dtype=np.int32).reshape(2, 3)
    for client, make in ((http, http_input), (grpc, grpc_input)):
        result = client.infer("reshaped", [make("INPUT0", data, "INT32")])
        np.testing.assert_array_equal(result.as_numpy("ECHO"), data + 1)
        np.testing.assert_array_equal(result.as_numpy("SEEN"), data.reshape(2, 1, 3))


def test_bf16_travels_through_torch_dlpack(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    data = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    for client, make in ((http, http_input), (grpc, grpc_input)):
        result = client.infer("bf16_dlpack", [make("INPUT0", data, "BF16")])
        got = result.as_numpy("OUTPUT0")
        assert got.view(np.uint16).tolist() == (data * 2).view(np.uint16).tolist()


def test_bytes_identity_keeps_empty_and_non_ascii(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    items = [b"", "gr\u00fc\u00df dich \u2603".encode(), b"\x00\x01", b"ok"]
    data = np.array(items, dtype=np.object_)
    got = http.infer("identity_bytes", [http_input("INPUT0", data, "BYTES")]).as_numpy("OUTPUT0")
    assert list(got) == items
    got = grpc.infer("identity_bytes", [grpc_input("INPUT0", data, "BYTES")]).as_numpy("OUTPUT0")
    assert list(got) == items


def test_decoupled_repeat_over_grpc_streaming(grpc: grpcclient.InferenceServerClient) -> None:
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        values = np.array([7, 8, 9, 10], dtype=np.int32)
        grpc.async_stream_infer(
            "repeat",
            [grpc_input("IN", values, "INT32")],
            request_id="r1",
            enable_empty_final_response=True,
        )
        seen: list[tuple[int, int]] = []
        while True:
            result, error = answers.get(timeout=EVENT_TIMEOUT_S)
            assert error is None, error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            if not final or response.outputs:
                seen.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
            if final:
                break
    finally:
        grpc.stop_stream()
    assert seen == [(7, 0), (8, 1), (9, 2), (10, 3)]


@pytest.mark.parametrize("check", ["sender", "request"])
def test_closed_stream_cancels_a_decoupled_python_model(
    grpc: grpcclient.InferenceServerClient, tmp_path: Path, check: str
) -> None:
    marker = tmp_path / "cancelled"
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        grpc.async_stream_infer(
            "cancellable",
            [grpc_input("INTERVAL_MS", np.array([20], dtype=np.int32), "INT32")],
            request_id="c1",
            # Its own limit well past the test's bound: only the cancellation ends it in time.
            parameters={"marker": str(marker), "check": check, "limit_s": 4 * EVENT_TIMEOUT_S},
        )
        indexes = []
        for _ in range(2):
            result, error = answers.get(timeout=EVENT_TIMEOUT_S)
            assert error is None, error
            indexes.append(int(result.as_numpy("INDEX")[0]))
        assert indexes == [0, 1]
    finally:
        grpc.stop_stream(cancel_requests=True)
    # The model streams on unless it sees the cancellation.
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never saw the stream's cancellation"
        time.sleep(0.02)
    assert marker.read_text() == "cancelled"
    # The model still serves.
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        while not answers.empty():
            answers.get_nowait()
        grpc.async_stream_infer(
            "cancellable",
            [grpc_input("INTERVAL_MS", np.array([1], dtype=np.int32), "INT32")],
            request_id="c2",
            parameters={"limit_s": 0.05},
            enable_empty_final_response=True,
        )
        streamed = []
        while True:
            result, error = answers.get(timeout=EVENT_TIMEOUT_S)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
            streamed.append(int(result.as_numpy("INDEX")[0]))
    finally:
        grpc.stop_stream()
    # It ran to its limit, uncancelled: the final response counts what it streamed (how many
    # fit in 50 ms, perhaps none, is the machine's business).
    assert result.as_numpy("CANCELLED").tolist() == [False]
    assert streamed == list(range(len(streamed)))
    assert result.as_numpy("INDEX")[0] == len(streamed)
    assert grpc.is_model_ready("cancellable")


def test_bls_calls_an_onnx_model(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    result = http.infer("bls", [http_input("INPUT0", A, "FP32"), http_input("INPUT1", B, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    # A BLS call's errors as Triton 2.51's python backend gives them to the caller (which
    # passes them on here): INTERNAL, and prefixed where the server refused the call.
    prefix = "Model {model} - Error when running inference: "
    for model, words in (
        ("nowhere", "Failed for execute the inference request. Model 'nowhere' is not ready."),
        ("faulty", "expected 1 inputs but got 2 inputs"),  # (not valid for it)
    ):
        with pytest.raises(InferenceServerException) as raised:
            grpc.infer(
                "bls",
                [grpc_input("INPUT0", A, "FP32"), grpc_input("INPUT1", B, "FP32")],
                parameters={"model": model},
            )
        assert raised.value.status() == "StatusCode.INTERNAL"
        message = raised.value.message()
        assert message.startswith(prefix.format(model=model)) and words in message


def test_model_errors_fail_the_request_and_the_server_stays_ready(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    def ask(value: int) -> httpclient.InferResult:
        data = np.array([value], dtype=np.int32)
        return http.infer("faulty", [http_input("INPUT0", data, "INT32")])

    with pytest.raises(InferenceServerException) as raised:
        ask(0)
    assert "ValueError: the model was asked to fail" in str(raised.value)
    assert raised.value.status() == "500"
    with pytest.raises(InferenceServerException) as raised:
        ask(1)
    assert "one is not allowed" in str(raised.value)
    assert raised.value.status() == "400"
    with pytest.raises(InferenceServerException) as raised:
        ask(2)  # responses in a tuple: Triton 2.51's stub wants a list
    assert raised.value.status() == "500"
    assert raised.value.message() == (
        "Failed to process the request(s) for model 'faulty_0', message: Expected a list in "
        "the execute return, found type '<class 'tuple'>'."
    )
    assert ask(5).as_numpy("OUTPUT0").tolist() == [5]
    assert http.is_server_ready()
    assert http.is_model_ready("faulty")


def test_async_execute(http: httpclient.InferenceServerClient) -> None:
    data = np.array([[1.0, 2.0]], dtype=np.float32)
    result = http.infer("async_add", [http_input("INPUT0", data, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)


def test_auto_completed_config(server: ServerProcess) -> None:
    config = httpx.get(f"{server.base}/v2/models/autocomplete/config").json()
    assert config["max_batch_size"] == 4
    assert [i["name"] for i in config["input"]] == ["INPUT0"]
    assert [o["name"] for o in config["output"]] == ["OUTPUT0"]


def test_killed_model_process_fails_its_request_then_recovers(
    http: httpclient.InferenceServerClient,
) -> None:
    def ask(value: int) -> int:
        data = np.array([value], dtype=np.int32)
        return int(http.infer("crash", [http_input("INPUT0", data, "INT32")]).as_numpy("PID")[0])

    first_pid = ask(0)
    with pytest.raises(InferenceServerException, match="exited with code 1"):
        ask(1)
    # The server starts a new process in place of the dead one.
    deadline = time.monotonic() + 30
    while True:
        try:
            second_pid = ask(0)
            break
        except InferenceServerException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert second_pid != first_pid
    assert http.is_model_ready("crash")


def test_model_log_lines_reach_the_server_log(server: ServerProcess) -> None:
    """Located where the model called the logger, as Triton's lines are (its file and line)."""
    log = server.log()
    assert 'model.py:17] "[add_sub_0_0] add_sub initialized as add_sub_0_0"' in log


def test_a_model_error_in_a_stream_carries_the_model_and_the_final_flag(
    server: ServerProcess,
) -> None:
    """As Triton 2.51 answers a failed response in a stream (read with a grpclib client from our
    protos, since tritonclient hands only the message to its callback): the request's id, model
    name and version as given, and `triton_final_response`; a request refused before it ran
    carries its id only. Every successful response is marked final or not."""

    def request(request_id: str, value: int, model: str = "faulty") -> pb.ModelInferRequest:
        return pb.ModelInferRequest(
            model_name=model,
            model_version="1",
            id=request_id,
            inputs=[
                pb.ModelInferRequestInferInputTensor(name="INPUT0", datatype="INT32", shape=[1])
            ],
            raw_input_contents=[np.array([value], dtype="<i4").tobytes()],
        )

    async def run() -> dict[str, pb.ModelStreamInferResponse]:
        channel = Channel("127.0.0.1", server.grpc_port)
        try:
            stub = pb.GrpcInferenceServiceStub(channel, timeout=60)
            messages = [request("ok", 7), request("bad", 1), request("refused", 7, "nosuch")]
            return {a.infer_response.id: a async for a in stub.model_stream_infer(messages)}
        finally:
            channel.close()

    answers = asyncio.run(run())
    ok, bad, refused = answers["ok"], answers["bad"], answers["refused"]
    assert ok.error_message == ""
    assert ok.infer_response.parameters["triton_final_response"].bool_param is True
    assert bad.error_message == "one is not allowed"
    assert (bad.infer_response.model_name, bad.infer_response.model_version) == ("faulty", "1")
    assert bad.infer_response.parameters["triton_final_response"].bool_param is True
    assert refused.error_message == "Request for unknown model: 'nosuch' is not found"
    assert refused.infer_response.model_name == ""
    assert "triton_final_response" not in refused.infer_response.parameters
