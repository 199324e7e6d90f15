"""The gRPC front end end to end: tritonclient.grpc (sync, callbacks, aio, streaming) and raw
protobuf stubs against `hypercorn tritonactor.app:app`. Error codes and messages are checked
against what Triton 2.51 answers (docs/reference/triton-2.51/grpc_none.md)."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from grpclib.client import Channel
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import tritonactor
from tests.server_process import ServerProcess
from tritonactor._proto.grpc.health import v1 as health

# grpc_server and grpc_broken_server, shared by every module that names this plugin.
pytest_plugins = ["tests.e2e.grpc_fixtures"]

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
UNKNOWN_ID = "[request id: <id_unknown>] "
BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the batch "
    "dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


@pytest.fixture
def client(grpc_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        yield client


@pytest.fixture
def stub(grpc_server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """Triton's own generated protobuf stub, for messages tritonclient will not build."""
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


# -- building requests --------------------------------------------------------------------------


def tensor(name: str, data: np.ndarray, datatype: str) -> grpcclient.InferInput:
    infer_input = grpcclient.InferInput(name, list(data.shape), datatype)
    infer_input.set_data_from_numpy(data)
    return infer_input


def simple_arrays(batch: int = 1) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16) - 5
    b = np.full((batch, 16), 7, dtype=np.int32) * np.arange(1, batch + 1, dtype=np.int32)[:, None]
    return a, b


def simple_inputs(batch: int = 1) -> list[grpcclient.InferInput]:
    a, b = simple_arrays(batch)
    return [tensor("INPUT0", a, "INT32"), tensor("INPUT1", b, "INT32")]


def check_simple(result: Any, batch: int = 1) -> None:
    a, b = simple_arrays(batch)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def raw_simple_request(**fields: Any) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest for `simple` with no data: the caller adds contents or raw data."""
    request = service_pb2.ModelInferRequest(model_name="simple", **fields)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    return request


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


# -- inference ----------------------------------------------------------------------------------


def test_infer_returns_exact_numbers(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer("simple", simple_inputs(3), request_id="sync-1")
    check_simple(result, 3)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("simple", "1", "sync-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT0", "INT32", [3, 16]),
        ("OUTPUT1", "INT32", [3, 16]),
    ]


def test_infer_only_the_requested_output(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer(
        "simple", simple_inputs(), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")]
    )
    a, b = simple_arrays()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None


def test_async_infer_calls_back_with_result_and_error(
    client: grpcclient.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def callback(*, result: Any, error: Any) -> None:  # tritonclient passes keywords
        answers.put((result, error))

    client.async_infer("simple", simple_inputs(2), callback, request_id="cb-ok")
    result, error = answers.get(timeout=10)
    assert error is None
    check_simple(result, 2)
    assert result.get_response().id == "cb-ok"

    client.async_infer("nosuch", simple_inputs(), callback)
    result, error = answers.get(timeout=10)
    assert result is None
    assert error.status() == "StatusCode.NOT_FOUND"
    assert error.message() == "Request for unknown model: 'nosuch' is not found"


@pytest.mark.anyio
async def test_aio_client_infers_and_streams(grpc_server: ServerProcess) -> None:
    async with aioclient.InferenceServerClient(grpc_server.grpc_url) as client:
        assert await client.is_server_ready()
        assert await client.is_model_ready("simple")
        result = await client.infer("simple", simple_inputs(2), request_id="aio")
        check_simple(result, 2)

        with pytest.raises(InferenceServerException) as caught:
            await client.infer("simple", simple_inputs(9))
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "batch-size must be <= 8" in caught.value.message()

        async def requests() -> AsyncIterator[dict[str, Any]]:
            for index in range(3):
                yield {"model_name": "simple", "inputs": simple_inputs(), "request_id": str(index)}

        seen = []
        async for result, error in client.stream_infer(requests()):
            assert error is None
            check_simple(result)
            seen.append(result.get_response().id)
        assert sorted(seen) == ["0", "1", "2"]


@pytest.mark.anyio
async def test_more_than_100_streams_open_at_once_on_one_channel(
    grpc_server: ServerProcess,
) -> None:
    """One client channel carries every call of an aio client: 150 streams held open until
    all are answered (h2's default of 100 streams a connection held the last 50 back: with
    the first ones open for good, they never opened)."""
    count = 150
    answered: list[str] = []
    everyone = asyncio.Event()
    async with aioclient.InferenceServerClient(grpc_server.grpc_url) as client:

        async def one(index: int) -> None:
            async def requests() -> AsyncIterator[dict[str, Any]]:
                yield {"model_name": "simple", "inputs": simple_inputs(), "request_id": str(index)}
                await everyone.wait()  # the stream stays open until every stream is answered

            async for result, error in client.stream_infer(requests()):
                assert error is None
                answered.append(result.get_response().id)
                if len(answered) == count:
                    everyone.set()

        # (a bound on waiting for the event: reaching it fails)
        await asyncio.wait_for(asyncio.gather(*(one(index) for index in range(count))), 120)
    assert sorted(answered, key=int) == [str(index) for index in range(count)]


def test_large_metadata_leaves_the_connection_to_its_other_calls(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    """70 KB of metadata on one call (h2's 64 KiB limit ended the connection: every call on it
    failed UNAVAILABLE); up to 1 MiB is read."""
    big = stub.ServerLive(service_pb2.ServerLiveRequest(), metadata=[("x-big", "a" * 70_000)])
    assert big.live
    assert stub.ServerLive(service_pb2.ServerLiveRequest()).live


def test_stream_matches_answers_by_id_and_survives_an_error(
    client: grpcclient.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        batches = {"s1": 1, "s2": 2, "s4": 3, "s5": 4}
        for request_id in ("s1", "s2", "s3", "s4", "s5"):
            if request_id == "s3":  # INPUT1 left out: this one fails, in the stream
                a, _ = simple_arrays()
                client.async_stream_infer(
                    "simple", [tensor("INPUT0", a, "INT32")], request_id=request_id
                )
            else:
                batch = batches[request_id]
                client.async_stream_infer("simple", simple_inputs(batch), request_id=request_id)
        results: dict[str, Any] = {}
        errors = []
        for _ in range(5):
            result, error = answers.get(timeout=10)
            if error is not None:
                errors.append(error)
            else:
                results[result.get_response().id] = result
        assert sorted(results) == ["s1", "s2", "s4", "s5"]
        for request_id, result in results.items():
            check_simple(result, batches[request_id])  # each answer is its own request's
        assert [e.message() for e in errors] == [
            "[request id: s3] expected 2 inputs but got 1 inputs for model 'simple'. Got "
            "input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all "
            "required input(s)."
        ]

        # The stream is still open: an unknown model fails in-stream too, and the next works.
        client.async_stream_infer("nosuch", simple_inputs(), request_id="s6")
        client.async_stream_infer("simple", simple_inputs(), request_id="s7")
        result, error = answers.get(timeout=10)
        assert result is None
        assert error.message() == "Request for unknown model: 'nosuch' is not found"
        result, error = answers.get(timeout=10)
        assert error is None
        assert result.get_response().id == "s7"
        check_simple(result)
    finally:
        client.stop_stream()


def test_stream_empty_final_response_flag(client: grpcclient.InferenceServerClient) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(
            "simple", simple_inputs(), request_id="final", enable_empty_final_response=True
        )
        result, error = answers.get(timeout=10)
        assert error is None
        response = result.get_response()
        assert response.parameters["triton_final_response"].bool_param is True
        check_simple(result)

        # Without the flag too: Triton 2.51 marks every stream response final or not.
        client.async_stream_infer("simple", simple_inputs(), request_id="plain")
        result, error = answers.get(timeout=10)
        assert error is None
        assert result.get_response().parameters["triton_final_response"].bool_param is True
    finally:
        client.stop_stream()


@pytest.mark.parametrize("mebibytes", [4, 64])
def test_large_tensor_round_trip(client: grpcclient.InferenceServerClient, mebibytes: int) -> None:
    data = np.random.default_rng(mebibytes).random(mebibytes * MiB // 4, dtype=np.float32)
    result = client.infer("big", [tensor("INPUT0", data, "FP32")])
    output = result.as_numpy("OUTPUT0")
    assert output.shape == data.shape
    assert np.array_equal(output, data)


def test_bytes_with_empty_and_non_ascii_strings(client: grpcclient.InferenceServerClient) -> None:
    words = ["", "héllo", "日本語", "\x00 zero", "🙂"]
    data = np.array([[w.encode() for w in words], [b"", "ß".encode(), b"a", b"", b"z" * 300]])
    result = client.infer("strings", [tensor("INPUT0", data.astype(np.object_), "BYTES")])
    output = result.as_numpy("OUTPUT0")
    assert output.shape == (2, 5)
    assert output.tolist() == data.tolist()
    assert output[0, 1].decode() == "héllo"


def test_bytes_that_are_not_utf8_for_an_onnx_string(
    client: grpcclient.InferenceServerClient,
) -> None:
    data = np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("strings", [tensor("INPUT0", data, "BYTES")])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "not UTF-8" in caught.value.message()


def test_fp16_through_raw_contents(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[1.0, 2.5, -3.0, 0.1], [65504.0, -0.0, 6e-8, np.inf]], dtype=np.float16)
    result = client.infer("half", [tensor("INPUT0", data, "FP16")])
    output = result.as_numpy("OUTPUT0")
    assert output.dtype == np.float16
    assert output.tobytes() == data.tobytes()  # bit for bit, -0.0 and the subnormal included


# -- typed contents and raw messages ------------------------------------------------------------


def test_typed_int_contents(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = raw_simple_request(id="typed")
    request.inputs[0].contents.int_contents.extend(range(-8, 8))
    request.inputs[1].contents.int_contents.extend([3] * 16)
    response = stub.ModelInfer(request)
    assert response.id == "typed"
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert not response.outputs[0].HasField("contents")  # answers are always raw
    total = np.frombuffer(response.raw_output_contents[0], dtype=np.int32)
    difference = np.frombuffer(response.raw_output_contents[1], dtype=np.int32)
    np.testing.assert_array_equal(total, np.arange(-8, 8) + 3)
    np.testing.assert_array_equal(difference, np.arange(-8, 8) - 3)


def test_typed_bytes_contents(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="strings")
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 3])
    request.inputs[0].contents.bytes_contents.extend([b"", "ünï".encode(), b"x"])
    response = stub.ModelInfer(request)
    raw = response.raw_output_contents[0]
    # BYTES travel raw as a 4-byte little-endian length before each element.
    assert raw == b"\0\0\0\0" + b"\x05\0\0\0" + "ünï".encode() + b"\x01\0\0\0x"


def test_typed_contents_with_wrong_count(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = raw_simple_request()
    request.inputs[0].contents.int_contents.extend(range(16))
    request.inputs[1].contents.int_contents.extend(range(10))
    error = rpc_error(lambda: stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        f"{UNKNOWN_ID}input byte size mismatch for input 'INPUT1' for model 'simple'. "
        "Expected 64, got 40"
    )


def test_fp16_has_no_typed_contents(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="half")
    request.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 4])
    request.inputs[0].contents.fp32_contents.extend([1, 2, 3, 4])
    error = rpc_error(lambda: stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Triton 2.51's words: the values are in the field of another type.
    assert error.details() == (
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'half' of type "
        "'FP32', expected datatype 'FP16'"
    )


def test_contents_mixed_with_raw_is_refused(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request = raw_simple_request()
    request.inputs[0].contents.int_contents.extend(range(16))
    request.raw_input_contents.extend([bytes(64), bytes(64)])
    error = rpc_error(lambda: stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' "
        "for model 'simple'"
    )


@pytest.mark.parametrize(
    ("raw", "details"),
    [
        (
            [bytes(60), bytes(64)],
            f"{UNKNOWN_ID}input byte size mismatch for input 'INPUT0' for model 'simple'. "
            "Expected 64, got 60",
        ),
        (
            [bytes(64)],
            "unable to find data for input tensor 'INPUT1' for model 'simple' in request.",
        ),
    ],
    ids=["short-buffer", "missing-buffer"],
)
def test_raw_contents_that_do_not_fit(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, raw: list[bytes], details: str
) -> None:
    request = raw_simple_request()
    request.raw_input_contents.extend(raw)
    error = rpc_error(lambda: stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == details


def strings_request(count: int, shape: list[int]) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="strings")
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=shape)
    request.inputs[0].contents.bytes_contents.extend([b"x"] * count)
    return request


@pytest.mark.parametrize(
    ("count", "shape", "details"),
    [
        # Triton 2.51's words: too few are counted, too many are told as one past the count.
        (
            2,
            [1, 3],
            "expected 3 string elements for inference input 'INPUT0' for model 'strings', got 2",
        ),
        (
            5,
            [1, 2],
            "unexpected number of string elements 3 for inference input 'INPUT0' for "
            "model 'strings', expecting 2",
        ),
    ],
    ids=["too-few", "too-many"],
)
def test_bytes_contents_of_the_wrong_count(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, count: int, shape: list[int], details: str
) -> None:
    error = rpc_error(lambda: stub.ModelInfer(strings_request(count, shape)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == f"{UNKNOWN_ID}{details}"


@pytest.mark.parametrize("datatype", ["INT32", "BYTES"])
def test_an_input_with_no_data_at_all(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, datatype: str
) -> None:
    # No contents and no raw_input_contents: what a client that forgot the data sends.
    request = service_pb2.ModelInferRequest(
        model_name="strings" if datatype == "BYTES" else "simple"
    )
    request.inputs.add(name="INPUT0", datatype=datatype, shape=[1, 16])
    error = rpc_error(lambda: stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    model = request.model_name
    assert error.details() == (
        f"unable to find data for input tensor 'INPUT0' for model '{model}' in request."
    )


def test_an_unspecified_dimension_is_refused(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request = raw_simple_request()
    request.inputs[0].shape[:] = [1, -1]
    request.raw_input_contents.extend([bytes(64), bytes(64)])
    error = rpc_error(lambda: stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        f"{UNKNOWN_ID}All input dimensions should be specified for input 'INPUT0' for model "
        "'simple', got [1,-1]"
    )


def test_typed_data_for_a_datatype_that_names_no_type(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    # Triton's front end holds typed contents against the type first.
    request = raw_simple_request()
    request.inputs[0].datatype = "FOO"
    request.inputs[0].contents.fp32_contents.extend([1.0] * 16)
    request.raw_input_contents.extend([])
    error = rpc_error(lambda: stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple' of type "
        "'FP32', expected datatype '<invalid>'"
    )


@pytest.mark.parametrize(
    ("name", "details"),
    [
        (
            "INPUT0",
            f"{UNKNOWN_ID}inference input 'INPUT0' data-type is '<invalid>', but model "
            "'simple' expects 'INT32'",
        ),
        ("NOPE", "unexpected inference input 'NOPE' for model 'simple'"),
    ],
)
def test_a_datatype_that_names_no_type(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, name: str, details: str
) -> None:
    # As Triton's core: the model's signature refuses the type, or first the name it lacks.
    request = raw_simple_request()
    request.inputs[0].name = name
    request.inputs[0].datatype = "int32"
    request.raw_input_contents.extend([bytes(64), bytes(64)])
    error = rpc_error(lambda: stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == details
    # ... and the server serves on.
    request = raw_simple_request()
    request.raw_input_contents.extend([bytes(64), bytes(64)])
    assert len(stub.ModelInfer(request).raw_output_contents) == 2


# -- errors -------------------------------------------------------------------------------------


def _inputs_wrong_shape() -> list[grpcclient.InferInput]:
    a = np.zeros((1, 15), dtype=np.int32)
    return [tensor("INPUT0", a, "INT32"), tensor("INPUT1", a, "INT32")]


def _inputs_of_65_dims() -> list[grpcclient.InferInput]:
    """More dimensions than a numpy array has (64): refused as any wrong shape is."""
    inputs = simple_inputs()
    for tensor_ in inputs:
        tensor_.set_shape([1] * 64 + [16])
    return inputs


def _inputs_wrong_shape_and_size() -> list[grpcclient.InferInput]:
    """A shape the config does not take, its data sized for the right one: Triton holds the
    shape against the config before the data against the shape."""
    inputs = simple_inputs()
    inputs[0].set_shape([1, 15])
    return inputs


def _inputs_wrong_datatype_and_size() -> list[grpcclient.InferInput]:
    a, b = simple_arrays()
    # 16 INT32 are 64 bytes: 8 FP64, not the 16 the shape holds.
    wrong = grpcclient.InferInput("INPUT0", [1, 16], "FP64")
    wrong._raw_content = a.tobytes()
    return [wrong, tensor("INPUT1", b, "INT32")]


def _inputs_wrong_datatype() -> list[grpcclient.InferInput]:
    a, b = simple_arrays()
    return [tensor("INPUT0", a.astype(np.float32), "FP32"), tensor("INPUT1", b, "INT32")]


def _inputs_missing_one() -> list[grpcclient.InferInput]:
    return simple_inputs()[:1]


INFER_ERRORS = {
    "unknown-model": (
        {"model_name": "nosuch", "inputs": simple_inputs},
        "NOT_FOUND",
        "Request for unknown model: 'nosuch' is not found",
    ),
    "unknown-version": (
        {"model_name": "simple", "model_version": "7", "inputs": simple_inputs},
        "NOT_FOUND",
        "Request for unknown model: 'simple' version 7 is not found",
    ),
    "wrong-shape": (
        {"model_name": "simple", "inputs": _inputs_wrong_shape},
        "INVALID_ARGUMENT",
        f"{UNKNOWN_ID}unexpected shape for input 'INPUT0' for model 'simple'. Expected "
        f"[-1,16], got [1,15]. {BATCH_NOTE}",
    ),
    "65-dims": (
        {"model_name": "simple", "inputs": _inputs_of_65_dims},
        "INVALID_ARGUMENT",
        f"{UNKNOWN_ID}unexpected shape for input 'INPUT0' for model 'simple'. Expected "
        f"[-1,16], got [{'1,' * 64}16]. {BATCH_NOTE}",
    ),
    "wrong-shape-and-size": (
        {"model_name": "simple", "inputs": _inputs_wrong_shape_and_size},
        "INVALID_ARGUMENT",
        f"{UNKNOWN_ID}unexpected shape for input 'INPUT0' for model 'simple'. Expected "
        f"[-1,16], got [1,15]. {BATCH_NOTE}",
    ),
    "wrong-datatype-and-size": (
        {"model_name": "simple", "inputs": _inputs_wrong_datatype_and_size},
        "INVALID_ARGUMENT",
        f"{UNKNOWN_ID}inference input 'INPUT0' data-type is 'FP64', but model 'simple' "
        "expects 'INT32'",
    ),
    "wrong-datatype": (
        {"model_name": "simple", "inputs": _inputs_wrong_datatype},
        "INVALID_ARGUMENT",
        f"{UNKNOWN_ID}inference input 'INPUT0' data-type is 'FP32', but model 'simple' "
        "expects 'INT32'",
    ),
    "missing-input": (
        {"model_name": "simple", "inputs": _inputs_missing_one},
        "INVALID_ARGUMENT",
        f"{UNKNOWN_ID}expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) "
        "['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required "
        "input(s).",
    ),
    "batch-too-big": (
        {"model_name": "simple", "inputs": lambda: simple_inputs(9)},
        "INVALID_ARGUMENT",
        f"{UNKNOWN_ID}inference request batch-size must be <= 8 for 'simple'",
    ),
    "unknown-output": (
        {
            "model_name": "simple",
            "inputs": simple_inputs,
            "outputs": [grpcclient.InferRequestedOutput("NOPE")],
        },
        "INVALID_ARGUMENT",
        "unexpected inference output 'NOPE' for model 'simple'",
    ),
}


@pytest.mark.parametrize(("arguments", "code", "message"), INFER_ERRORS.values(), ids=INFER_ERRORS)
def test_infer_errors_match_triton(
    client: grpcclient.InferenceServerClient,
    arguments: dict[str, Any],
    code: str,
    message: str,
) -> None:
    arguments = {**arguments, "inputs": arguments["inputs"]()}
    with pytest.raises(InferenceServerException) as caught:
        client.infer(**arguments)
    assert caught.value.status() == f"StatusCode.{code}"
    assert caught.value.message() == message


def test_request_id_prefixes_validation_errors(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer("simple", _inputs_wrong_shape(), request_id="my-id")
    assert caught.value.message().startswith(
        "[request id: my-id] unexpected shape for input 'INPUT0'"
    )


def test_version_that_is_not_a_number(client: grpcclient.InferenceServerClient) -> None:
    for call in (
        lambda: client.get_model_metadata("simple", "abc"),
        lambda: client.is_model_ready("simple", "abc"),
        lambda: client.infer("simple", simple_inputs(), model_version="abc"),
    ):
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "'abc'" in caught.value.message()


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.load_model("simple"),
        lambda c: c.unload_model("simple"),
        lambda c: c.load_model("nosuch"),
    ],
    ids=["load", "unload", "load-unknown"],
)
def test_load_and_unload_in_mode_none(
    client: grpcclient.InferenceServerClient,
    call: Callable[[grpcclient.InferenceServerClient], object],
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call(client)
    assert caught.value.status() == "StatusCode.UNAVAILABLE"
    assert caught.value.message() == (
        "explicit model load / unload is not allowed if polling is enabled"
    )
    assert client.is_model_ready("simple")


def test_bad_requests_change_nothing(
    client: grpcclient.InferenceServerClient, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    for arguments, _, _ in INFER_ERRORS.values():
        with pytest.raises(InferenceServerException):
            client.infer(**{**arguments, "inputs": arguments["inputs"]()})
    garbled = raw_simple_request()
    garbled.raw_input_contents.extend([b"\x01" * 64, b"\x02" * 3])
    assert rpc_error(lambda: stub.ModelInfer(garbled)).code() == grpc.StatusCode.INVALID_ARGUMENT

    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    check_simple(client.infer("simple", simple_inputs(8)), 8)


# -- metadata, configuration, repository, health ------------------------------------------------


def test_model_ready(
    client: grpcclient.InferenceServerClient, grpc_broken_server: ServerProcess
) -> None:
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "2")
    assert not client.is_model_ready("nosuch")  # an answer, not an error
    with grpcclient.InferenceServerClient(grpc_broken_server.grpc_url) as broken:
        assert not broken.is_model_ready("broken")
        assert broken.is_model_ready("simple")


def test_server_metadata_matches_http(
    client: grpcclient.InferenceServerClient, grpc_server: ServerProcess
) -> None:
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "triton"
    assert metadata["version"] == tritonactor.__version__
    assert "model_configuration" in metadata["extensions"]
    http = httpx.get(f"{grpc_server.base}/v2").json()
    assert metadata == {
        "name": http["name"],
        "version": http["version"],
        "extensions": http["extensions"],
    }


def test_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    shape = ["-1", "16"]  # int64 fields come as strings in protobuf's JSON
    expected = {
        "name": "simple",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": shape},
            {"name": "INPUT1", "datatype": "INT32", "shape": shape},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": shape},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": shape},
        ],
    }
    assert client.get_model_metadata("simple", as_json=True) == expected
    assert client.get_model_metadata("simple", "1", as_json=True) == expected
    big = client.get_model_metadata("big")
    assert [(t.name, t.datatype, list(t.shape)) for t in big.inputs] == [("INPUT0", "FP32", [-1])]
    strings = client.get_model_metadata("strings")
    assert [(t.datatype, list(t.shape)) for t in strings.outputs] == [("BYTES", [-1, -1])]


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple").config
    assert config.name == "simple"
    assert config.platform == "onnxruntime_onnx"
    assert config.backend == "onnxruntime"
    assert config.max_batch_size == 8
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", model_config_pb2.TYPE_INT32, [16]),
        ("INPUT1", model_config_pb2.TYPE_INT32, [16]),
    ]
    assert [o.name for o in config.output] == ["OUTPUT0", "OUTPUT1"]
    # No count in its config: Triton's two CPU instances for ONNX Runtime, the group named
    # after the model.
    assert (config.instance_group[0].name, config.instance_group[0].count) == ("simple", 2)
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    strings = client.get_model_config("strings").config
    assert strings.input[0].data_type == model_config_pb2.TYPE_STRING
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_config("nosuch")
    assert caught.value.status() == "StatusCode.NOT_FOUND"
    assert caught.value.message() == "Request for unknown model: 'nosuch' is not found"


def test_repository_index(
    client: grpcclient.InferenceServerClient, grpc_broken_server: ServerProcess
) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == [
        {"name": name, "version": "1", "state": "READY"}
        for name in ("big", "decoupled", "half", "simple", "slow", "strings")
    ]
    with grpc.insecure_channel(grpc_broken_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        everything = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest()).models
        ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True)).models
    states = {(m.name, m.version): (m.state, m.reason) for m in everything}
    assert states[("simple", "1")] == ("READY", "")
    state, reason = states[("broken", "1")]
    assert state == "UNAVAILABLE"
    assert reason  # why it failed to load
    assert [(m.name, m.state) for m in ready] == [("simple", "READY")]


def test_model_metadata_of_a_model_that_failed_to_load(grpc_broken_server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(grpc_broken_server.grpc_url) as client:
        for call in (
            lambda: client.get_model_metadata("broken"),
            lambda: client.get_model_config("broken"),
            lambda: client.infer("broken", simple_inputs()),
        ):
            with pytest.raises(InferenceServerException) as caught:
                call()
            assert caught.value.status() == "StatusCode.NOT_FOUND"
            assert caught.value.message() == (
                "Request for unknown model: 'broken' has no available versions"
            )


async def _health(server: ServerProcess) -> health.HealthCheckResponseServingStatus:
    channel = Channel("127.0.0.1", server.grpc_port)
    try:
        answer = await health.HealthStub(channel).check(health.HealthCheckRequest(), timeout=10)
    finally:
        channel.close()
    return answer.status


def test_health_serving_when_ready(
    client: grpcclient.InferenceServerClient, grpc_server: ServerProcess
) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    status = asyncio.run(_health(grpc_server))
    assert status == health.HealthCheckResponseServingStatus.SERVING


def test_health_not_serving_with_a_broken_model(grpc_broken_server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(grpc_broken_server.grpc_url) as client:
        assert client.is_server_live()
        assert not client.is_server_ready()
    status = asyncio.run(_health(grpc_broken_server))
    assert status == health.HealthCheckResponseServingStatus.NOT_SERVING


def test_decoupled_models_are_served_only_by_streaming(
    client: grpcclient.InferenceServerClient, grpc_server: ServerProcess
) -> None:
    # ModelInfer refuses a decoupled model (as Triton does), and so does HTTP infer.
    with pytest.raises(InferenceServerException) as caught:
        client.infer("decoupled", simple_inputs())
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert caught.value.message() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )
    response = httpx.post(
        f"http://{grpc_server.url}/v2/models/decoupled/infer",
        json={
            "inputs": [
                {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ]
        },
    )
    assert response.status_code == 501
    assert response.json() == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"
    }
    # ModelStreamInfer serves it.
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("decoupled", simple_inputs(), request_id="d1")
        result, error = answers.get(timeout=10)
    finally:
        client.stop_stream()
    assert error is None
    assert result.get_response().id == "d1"
    check_simple(result)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_read_as_triton_reads_them(
    client: grpcclient.InferenceServerClient, algorithm: str
) -> None:
    # tritonclient's compression_algorithm, unary (the lane's direct path) and on a stream
    # (grpclib's handler); Triton 2.51 answers both (it was UNIMPLEMENTED here).
    check_simple(client.infer("simple", simple_inputs(4), compression_algorithm=algorithm), 4)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)),
        compression_algorithm=algorithm,
    )
    try:
        client.async_stream_infer("simple", simple_inputs(4))
        result, error = answers.get(timeout=10)
    finally:
        client.stop_stream()
    assert error is None, error
    check_simple(result, 4)
