"""Shared-memory tensors in both wire codecs: which parameters name a region, Triton's checks
of them, and outputs answered without data."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from tritonactor._proto.inference import (
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferRequestInferRequestedOutputTensor,
)
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.tensors import DATA_ERROR
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.frontends.grpc import codec as grpc_codec
from tritonactor.frontends.http import codec as http_codec
from tritonactor.frontends.http.responses import encode_infer_response

REGION = np.arange(16, dtype=np.int32).tobytes()


class FakeLease:
    """Records what the codec asks of the request's lease."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, int, int]] = []
        self.reserved: list[tuple[str, str, int, int]] = []

    def read(self, name: str, offset: int, size: int) -> memoryview:
        self.reads.append((name, offset, size))
        return memoryview(REGION)[offset : offset + size]

    def reserve(self, output: str, name: str, offset: int, size: int) -> None:
        self.reserved.append((output, name, offset, size))


# --- HTTP ----------------------------------------------------------------------------------------


def http_decode(document: dict[str, Any], lease: FakeLease) -> InferenceRequest:
    return http_codec.decode_infer_request(
        orjson.dumps(document),
        None,
        "m",
        "",
        shared_memory=lease.read,
        shared_memory_outputs=lease.reserve,
    )


def shm_input(**parameters: Any) -> dict[str, Any]:
    return {"name": "X", "datatype": "INT32", "shape": [2], "parameters": parameters}


def test_http_input_and_output_in_shared_memory() -> None:
    lease = FakeLease()
    request = http_decode(
        {
            "inputs": [shm_input(shared_memory_region="r", shared_memory_byte_size=8, tag=1)],
            "outputs": [
                {
                    "name": "Y",
                    "parameters": {
                        "shared_memory_region": "o",
                        "shared_memory_offset": 4,
                        "shared_memory_byte_size": 8,
                        "binary_data": False,
                    },
                }
            ],
        },
        lease,
    )
    assert lease.reads == [("r", 0, 8)]
    assert lease.reserved == [("Y", "o", 4, 8)]
    assert request.inputs[0].data.tolist() == [0, 1]
    assert request.inputs[0].parameters == {"tag": 1}
    assert request.outputs[0].parameters == {"binary_data": False}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"shared_memory_region": 5}, "Unable to parse 'shared_memory_region': expected a string"),
        (
            {"shared_memory_region": "r", "shared_memory_offset": -1},
            "Unable to parse 'shared_memory_offset': expected a non-negative integer",
        ),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": "8"},
            "Unable to parse 'shared_memory_byte_size': expected a non-negative integer",
        ),
    ],
)
def test_http_shared_memory_parameters_of_the_wrong_type(
    parameters: dict[str, Any], message: str
) -> None:
    lease = FakeLease()
    for document in (
        {"inputs": [shm_input(**parameters)]},
        {"inputs": [], "outputs": [{"name": "Y", "parameters": parameters}]},
    ):
        with pytest.raises(TritonError) as caught:
            http_decode(document, lease)
        assert (caught.value.code, caught.value.message) == (ErrorCode.INVALID_ARG, message)
    assert lease.reads == lease.reserved == []


def test_http_a_missing_byte_size_is_zero_as_in_triton() -> None:
    lease = FakeLease()
    http_decode(
        {"inputs": [], "outputs": [{"name": "Y", "parameters": {"shared_memory_region": "o"}}]},
        lease,
    )
    assert lease.reserved == [("Y", "o", 0, 0)]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"binary_data": True}, "Output can't set both 'shared_memory_region' and 'binary_data'"),
        (
            {"classification": 2},
            "Output can't set both 'shared_memory_region' and 'classification'",
        ),
    ],
)
def test_http_an_output_in_shared_memory_cannot_be_binary_or_classified(
    extra: dict[str, Any], message: str
) -> None:
    lease = FakeLease()
    parameters = {"shared_memory_region": "o", "shared_memory_byte_size": 8, **extra}
    with pytest.raises(TritonError, match=message):
        http_decode({"inputs": [], "outputs": [{"name": "Y", "parameters": parameters}]}, lease)
    assert lease.reserved == []


def test_http_outputs_without_a_writer_are_refused() -> None:
    body = orjson.dumps(
        {"inputs": [], "outputs": [{"name": "Y", "parameters": {"shared_memory_region": "o"}}]}
    )
    with pytest.raises(TritonError, match="output 'Y' uses shared memory"):
        http_codec.decode_infer_request(body, None, "m", "")


def test_http_response_of_an_output_in_shared_memory_has_no_data() -> None:
    response = InferenceResponse(
        "m",
        "1",
        outputs=[
            Tensor("Y", "INT32", (2,), np.array([1, 2], dtype=np.int32)),
            Tensor("Z", "INT32", (1,), np.array([3], dtype=np.int32)),
        ],
    )
    body, length = encode_infer_response(response, InferenceRequest("m"), in_shared_memory={"Y"})
    assert length is None
    assert orjson.loads(body)["outputs"] == [
        {"name": "Y", "datatype": "INT32", "shape": [2]},
        {"name": "Z", "datatype": "INT32", "shape": [1], "data": [3]},
    ]


# --- gRPC ----------------------------------------------------------------------------------------


def grpc_input(name: str, **parameters: InferParameter) -> ModelInferRequestInferInputTensor:
    return ModelInferRequestInferInputTensor(
        name=name, datatype="INT32", shape=[2], parameters=parameters
    )


def region(name: str, offset: int = 0, size: int | None = 8) -> dict[str, InferParameter]:
    parameters = {
        "shared_memory_region": InferParameter(string_param=name),
        "shared_memory_offset": InferParameter(int64_param=offset),
    }
    if size is not None:
        parameters["shared_memory_byte_size"] = InferParameter(int64_param=size)
    return parameters


def grpc_decode(message: ModelInferRequest, lease: FakeLease) -> InferenceRequest:
    return grpc_codec.decode_infer_request(
        message, shared_memory=lease.read, shared_memory_outputs=lease.reserve
    )


def test_grpc_raw_contents_are_for_the_inputs_not_in_shared_memory() -> None:
    lease = FakeLease()
    message = ModelInferRequest(
        model_name="m",
        inputs=[grpc_input("A", **region("r", 8)), grpc_input("B")],
        outputs=[ModelInferRequestInferRequestedOutputTensor(name="Y", parameters=region("o"))],
        raw_input_contents=[np.array([5, 6], dtype=np.int32).tobytes()],
    )
    request = grpc_decode(message, lease)
    assert [t.data.tolist() for t in request.inputs] == [[2, 3], [5, 6]]
    assert request.inputs[0].parameters == {}
    assert lease.reads == [("r", 8, 8)]
    assert lease.reserved == [("Y", "o", 0, 8)]
    assert request.outputs[0].parameters == {}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"shared_memory_region": InferParameter(int64_param=1)},
            "invalid value type for 'shared_memory_region' parameter for tensor 'A', expected "
            "string_param.",
        ),
        (
            {**region("r"), "shared_memory_byte_size": InferParameter(uint64_param=8)},
            "invalid value type for 'shared_memory_byte_size' parameter for tensor 'A', "
            "expected int64_param.",
        ),
        (
            region("r", size=None),
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
            "parameter for tensor 'A'",
        ),
        (
            {"shared_memory_offset": InferParameter(int64_param=0)},
            "'shared_memory_offset' can not be specified without 'shared_memory_region' "
            "parameter for tensor 'A'",
        ),
    ],
)
def test_grpc_shared_memory_parameters_are_checked_as_triton_does(
    parameters: dict[str, InferParameter], message: str
) -> None:
    lease = FakeLease()
    request = ModelInferRequest(model_name="m", inputs=[grpc_input("A", **parameters)])
    with pytest.raises(TritonError) as caught:
        grpc_decode(request, lease)
    assert (caught.value.code, caught.value.message) == (ErrorCode.INVALID_ARG, message)
    assert lease.reads == []


def test_grpc_an_input_in_shared_memory_has_no_contents() -> None:
    tensor = grpc_input("A", **region("r"))
    tensor.contents = InferTensorContents(int_contents=[1, 2])
    with pytest.raises(TritonError, match="unexpected 'content' provided when using shared"):
        grpc_decode(ModelInferRequest(model_name="m", inputs=[tensor]), FakeLease())


def test_grpc_an_output_in_shared_memory_cannot_be_classified() -> None:
    parameters = {**region("o"), "classification": InferParameter(int64_param=2)}
    message = ModelInferRequest(
        model_name="m",
        outputs=[ModelInferRequestInferRequestedOutputTensor(name="Y", parameters=parameters)],
    )
    with pytest.raises(TritonError, match="output can't set both 'shared_memory_region' and"):
        grpc_decode(message, FakeLease())


def test_grpc_response_of_an_output_in_shared_memory_has_empty_raw_contents() -> None:
    response = InferenceResponse(
        "m",
        "1",
        outputs=[
            Tensor("Y", "INT32", (2,), np.array([1, 2], dtype=np.int32)),
            Tensor("Z", "INT32", (1,), np.array([3], dtype=np.int32)),
        ],
    )
    message = grpc_codec.encode_infer_response(
        response, in_shared_memory={"Y"}, request=InferenceRequest("m")
    )
    assert [o.name for o in message.outputs] == ["Y", "Z"]
    assert message.raw_output_contents == [b"", np.array([3], dtype=np.int32).tobytes()]


def test_a_byte_size_past_the_region_is_held_against_the_tensor_as_triton_does() -> None:
    """A byte size that Triton's unsigned bounds check lets through (2^64 - 1, or -1 over gRPC)
    is not the region's bytes that remain: the tensor's size is held against the size given,
    as Triton holds it (this ran the model on the remaining bytes before)."""
    lease = FakeLease()
    document = {
        "inputs": [
            shm_input(
                shared_memory_region="r", shared_memory_offset=56, shared_memory_byte_size=2**64 - 1
            )
        ]
    }
    # (Kept for the model's signature to raise once the rest of the request is right.)
    error = http_decode(document, lease).context[DATA_ERROR]
    assert error.message.endswith("Expected 8, got 18446744073709551615")
    message = ModelInferRequest(model_name="m", inputs=[grpc_input("A", **region("r", 56, -1))])
    error = grpc_decode(message, lease).context[DATA_ERROR]
    assert error.message.endswith("Expected 8, got 18446744073709551615")
