"""ModelInfer messages on protobuf's C runtime (frontends/grpc/wire.py): the bytes the server
reads and writes are Triton's messages, tensor data stay views of the request, and malformed
bytes are refused as protobuf refuses them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.internal import api_implementation
from google.protobuf.message import DecodeError

from tritonactor._proto import inference as bp
from tritonactor._proto_c import grpc_service_pb2 as upb
from tritonactor._proto_c._pool import POOL
from tritonactor.core.tensors import DATA_ERROR
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.frontends.grpc import wire
from tritonactor.frontends.grpc.codec import decode_infer_request, encode_infer_response
from tritonactor.frontends.grpc.wire import (
    InferRequestMessage,
    InferResponseMessage,
    StreamInferResponse,
)

ROOT = Path(__file__).resolve().parents[2]


def request_bytes(elements: int, inputs: int = 2) -> bytes:
    message = upb.ModelInferRequest(model_name="m", model_version="1", id="req")
    message.parameters["priority"].int64_param = 3
    for index in range(inputs):
        tensor = message.inputs.add(name=f"IN{index}", datatype="INT32", shape=[elements])
        tensor.parameters["note"].string_param = f"n{index}"
        message.raw_input_contents.append(
            np.arange(index, index + elements, dtype=np.int32).tobytes()
        )
    message.outputs.add(name="OUT")
    return message.SerializeToString()


def test_the_c_runtime_is_upb_with_a_pool_of_its_own() -> None:
    assert api_implementation.Type() == "upb"
    assert upb.DESCRIPTOR.pool is POOL
    # tritonclient registers the same file names in protobuf's default pool: both load.
    import tritonclient.grpc.service_pb2 as client_pb2

    assert client_pb2.DESCRIPTOR.pool is not POOL


@pytest.mark.parametrize("elements", [4, 64 * 1024])  # parsed whole by upb / split first
def test_requests_decode_the_same_both_ways_with_views_of_the_request(elements: int) -> None:
    data = request_bytes(elements)
    assert (len(data) < wire._SPLIT_FROM) == (elements == 4)
    request = decode_infer_request(InferRequestMessage.FromString(data))
    assert (request.model_name, request.model_version, request.id) == ("m", "1", "req")
    assert request.parameters == {"priority": 3}
    assert [t.name for t in request.inputs] == ["IN0", "IN1"]
    assert [t.parameters for t in request.inputs] == [{"note": "n0"}, {"note": "n1"}]
    for index, tensor in enumerate(request.inputs):
        assert tensor.data.tolist() == list(range(index, index + elements))
        assert not tensor.data.flags.writeable
    assert [o.name for o in request.outputs] == ["OUT"]
    if elements > 4:
        # Large data are views of the request's own bytes: nothing was copied.
        base = request.inputs[0].data
        while isinstance(getattr(base, "base", None), np.ndarray | memoryview):
            base = base.base
        assert base.obj is data  # type: ignore[union-attr]


def test_a_split_request_keeps_every_field_but_the_raw_data() -> None:
    data = request_bytes(64 * 1024)
    split = InferRequestMessage.FromString(data)
    whole = upb.ModelInferRequest.FromString(data)
    assert [bytes(r) for r in split.raw] == list(whole.raw_input_contents)
    del whole.raw_input_contents[:]
    assert split.message == whole


@pytest.mark.parametrize("cut", [1, 7, 100, 3000])
def test_malformed_request_bytes_are_refused_as_protobuf_refuses_them(cut: int) -> None:
    data = request_bytes(64 * 1024)
    with pytest.raises(DecodeError):
        upb.ModelInferRequest.FromString(data[:-cut])
    with pytest.raises(DecodeError):
        InferRequestMessage.FromString(data[:-cut])


def test_betterproto2_and_upb_requests_decode_alike() -> None:
    data = request_bytes(8)
    from_wire = decode_infer_request(InferRequestMessage.FromString(data))
    from_upb = decode_infer_request(upb.ModelInferRequest.FromString(data))
    from_betterproto2 = decode_infer_request(bp.ModelInferRequest.parse(data))
    for other in (from_upb, from_betterproto2):
        assert [t.data.tolist() for t in other.inputs] == [
            t.data.tolist() for t in from_wire.inputs
        ]
        assert other.parameters == from_wire.parameters
    with pytest.raises(TypeError, match="expected a ModelInferRequest"):
        decode_infer_request(data)  # type: ignore[arg-type]


def test_bad_requests_get_the_same_errors_from_split_bytes() -> None:
    message = upb.ModelInferRequest(model_name="m")
    message.inputs.add(name="A", datatype="INT32", shape=[4])
    message.raw_input_contents.append(b"\0" * wire._SPLIT_FROM)  # large: split, but 4 x INT32
    request = decode_infer_request(InferRequestMessage.FromString(message.SerializeToString()))
    # Kept for the model's signature to raise once the rest of the request is right.
    assert "Expected 16, got 16384" in request.context[DATA_ERROR].message


@pytest.mark.parametrize("datatype", ["INT32", "FP32", "BOOL", "BYTES", "FP16", "BF16", "UINT64"])
def test_responses_serialize_to_the_message_upb_would_write(datatype: str) -> None:
    if datatype == "BYTES":
        data = np.array([b"ab", b"", b"\xff"], dtype=np.object_)
    elif datatype == "BF16":
        import ml_dtypes

        data = np.array([1.5, -2, 3], dtype=ml_dtypes.bfloat16)
    else:
        data = np.array([1, 0, 3], dtype={"BOOL": np.bool_, "FP16": np.float16}.get(datatype))
        data = data.astype(
            {"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64}.get(datatype, data.dtype)
        )
    response = InferenceResponse(
        "m",
        "2",
        id="x",
        parameters={"big": 2**64 - 1, "flag": True, "ratio": 0.5, "text": "t"},
        outputs=[
            Tensor("OUT", datatype, (3,), data, {"note": 1}),
            Tensor("SHM", "INT32", (1,), np.array([7], dtype=np.int32)),
        ],
    )
    encoded = encode_infer_response(
        response, request=InferenceRequest("m"), in_shared_memory={"SHM"}
    )
    parsed = upb.ModelInferResponse.FromString(encoded.SerializeToString())
    assert parsed == encoded.to_message()
    assert parsed.raw_output_contents[1] == b""
    assert dict(parsed.parameters)["big"].uint64_param == 2**64 - 1
    assert parsed.outputs[0].parameters["note"].int64_param == 1
    assert list(parsed.outputs[0].shape) == [3]
    # tritonclient reads the same bytes into the same array.
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.service_pb2 as client_pb2

    result = grpcclient.InferResult(
        client_pb2.ModelInferResponse.FromString(parsed.SerializeToString())
    )
    expected = data if datatype != "BYTES" else np.array([b"ab", b"", b"\xff"], dtype=np.object_)
    if datatype != "BF16":
        assert result.as_numpy("OUT").tolist() == expected.tolist()


def test_stream_answers_carry_their_error_and_response() -> None:
    response = InferResponseMessage(
        upb.ModelInferResponse(id="7"), [np.arange(3, dtype=np.int32).view(np.uint8)]
    )
    answer = StreamInferResponse("it failed: ü", response)
    parsed = upb.ModelStreamInferResponse.FromString(answer.SerializeToString())
    assert parsed.error_message == "it failed: ü"
    assert parsed.infer_response.id == "7"
    assert list(parsed.infer_response.raw_output_contents) == [
        np.arange(3, dtype=np.int32).tobytes()
    ]
    # An error with an empty response still names the response (its request id may be "").
    empty = StreamInferResponse("refused", InferResponseMessage(upb.ModelInferResponse(), []))
    parsed = upb.ModelStreamInferResponse.FromString(empty.SerializeToString())
    assert parsed.HasField("infer_response")


def test_a_frozen_stream_answer_keeps_the_bytes_of_its_time() -> None:
    data = np.arange(4, dtype=np.int32)
    answer = StreamInferResponse(
        infer_response=InferResponseMessage(upb.ModelInferResponse(), [data.view(np.uint8)])
    ).freeze()
    data[:] = 0  # a decoupled model reusing its output buffer
    parsed = upb.ModelStreamInferResponse.FromString(answer.SerializeToString())
    assert parsed.infer_response.raw_output_contents[0] == np.arange(4, dtype=np.int32).tobytes()


def test_generated_upb_code_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, "tritonactor/_proto_c/generate.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_large_request_with_fields_the_walk_does_not_know_is_left_to_upb() -> None:
    # An unknown group field (wire type 3) is valid protobuf the walk does not handle.
    data = request_bytes(64 * 1024) + b"\x4b\x08\x01\x4c"  # field 9: start group, 1: 1, end
    request = decode_infer_request(InferRequestMessage.FromString(data))
    assert request.inputs[1].data.tolist() == list(range(1, 1 + 64 * 1024))
