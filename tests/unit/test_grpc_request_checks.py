"""What a ModelInfer request must be before anything runs, with Triton 2.51's words (each case
was answered so by Triton's gRPC front end in a differential fuzz, 2026-12-06): the request
parameters the server acts on of their own types, the typed contents in one field of the
input's type, and a message's tags as protobuf reads them, however large the message."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from tritonactor._proto_c import grpc_service_pb2 as upb
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.frontends.grpc.codec import decode_infer_request
from tritonactor.frontends.grpc.wire import InferRequestMessage
from tritonactor.scheduling.signature import _class_count


def _request(datatype: str = "FP32", count: int = 4) -> upb.ModelInferRequest:
    message = upb.ModelInferRequest(model_name="m", model_version="1")
    message.inputs.add(name="INPUT0", datatype=datatype, shape=[count])
    return message


def _raw(message: upb.ModelInferRequest) -> upb.ModelInferRequest:
    message.raw_input_contents.append(np.zeros(4, np.float32).tobytes())
    return message


def _refused(message: upb.ModelInferRequest) -> str:
    with pytest.raises(TritonError) as raised:
        decode_infer_request(InferRequestMessage.FromString(message.SerializeToString()))
    assert raised.value.code is ErrorCode.INVALID_ARG
    return raised.value.message


@pytest.mark.parametrize(
    ("key", "field", "value", "words"),
    [
        ("sequence_start", "int64_param", 5, "expected bool_param."),
        ("sequence_end", "string_param", "true", "expected bool_param."),
        ("timeout", "bool_param", True, "expected int64_param."),
        ("timeout", "uint64_param", 5, "expected int64_param."),
        ("sequence_id", "bool_param", True, "expected int64_param or string_param."),
        ("sequence_id", "uint64_param", 5, "expected int64_param or string_param."),
        ("sequence_id", "double_param", 1.5, "expected int64_param or string_param."),
        ("priority", "double_param", 1.0, "expected int64_param or uint64_param."),
        ("priority", "string_param", "1", "expected int64_param or uint64_param."),
        ("triton_enable_empty_final_response", "int64_param", 1, "expected bool_param."),
        ("custom", "uint64_param", 5, "expected int64_param, bool_param, or string_param."),
    ],
)
def test_a_parameter_of_the_wrong_type_is_refused(
    key: str, field: str, value: object, words: str
) -> None:
    message = _raw(_request())
    setattr(message.parameters[key], field, value)
    assert _refused(message) == f"invalid value type for '{key}' parameter, {words}"


def test_a_parameter_without_a_value_is_refused() -> None:
    message = _raw(_request())
    message.parameters["custom"].SetInParent()
    assert _refused(message) == (
        "invalid value type for 'custom' parameter, expected int64_param, bool_param, or "
        "string_param."
    )


def test_a_negative_priority_is_refused() -> None:
    message = _raw(_request())
    message.parameters["priority"].int64_param = -1
    assert _refused(message) == "invalid value for 'priority', expected value >= 0."


def test_parameters_of_the_right_types_pass() -> None:
    message = _raw(_request())
    message.parameters["sequence_id"].string_param = "s"
    message.parameters["sequence_start"].bool_param = True
    message.parameters["priority"].uint64_param = 2**64 - 1
    message.parameters["timeout"].int64_param = 0
    message.parameters["custom"].double_param = 0.5
    request = decode_infer_request(InferRequestMessage.FromString(message.SerializeToString()))
    assert request.parameters == {
        "sequence_id": "s",
        "sequence_start": True,
        "priority": 2**64 - 1,
        "timeout": 0,
        "custom": 0.5,
    }


RESERVED_WORDS = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
    "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
)


def test_a_reserved_key_is_refused_and_the_empty_final_flag_is_not_a_parameter() -> None:
    message = _raw(_request())
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    message.parameters["custom"].int64_param = 3
    request = decode_infer_request(InferRequestMessage.FromString(message.SerializeToString()))
    assert request.parameters == {"custom": 3}
    assert request.context["triton_enable_empty_final_response"] is True
    message.parameters["triton_other"].bool_param = True
    assert _refused(message) == RESERVED_WORDS


def test_a_reserved_key_without_a_value_is_refused_too() -> None:
    """(Triton refuses the key whatever it holds; it was dropped here, found by a
    differential review against Triton 2.51.)"""
    message = _raw(_request())
    message.parameters["triton_foo"].SetInParent()  # an entry whose value is unset
    assert _refused(message) == RESERVED_WORDS


def test_the_request_parameters_are_told_before_its_inputs() -> None:
    """A request wrong in a parameter and in an input is told of the parameter, as Triton
    reads a request's own settings before its tensors."""
    message = _request()  # (no raw contents: its input has no data)
    assert "unable to find data for input tensor 'INPUT0'" in _refused(message)
    message.parameters["triton_foo"].bool_param = True
    assert _refused(message) == RESERVED_WORDS
    message = _raw(_request(count=3))  # its data does not fit its shape
    message.parameters["sequence_start"].int64_param = 1
    assert (
        _refused(message)
        == "invalid value type for 'sequence_start' parameter, expected bool_param."
    )


def test_a_classification_without_a_value_is_refused() -> None:
    message = _raw(_request())
    message.outputs.add(name="OUTPUT0").parameters["classification"].SetInParent()
    request = decode_infer_request(InferRequestMessage.FromString(message.SerializeToString()))
    # kept without a value, which the model's signature refuses with Triton's words
    assert request.outputs[0].parameters == {"classification": None}
    with pytest.raises(TritonError) as raised:
        _class_count(request.outputs[0])
    assert raised.value.message == (
        "invalid value type for 'classification' parameter, expected int64_param"
    )


def test_a_wrong_type_is_told_before_a_reserved_key_wherever_each_comes() -> None:
    """(Triton tells either, as protobuf's map order falls: here always the type.) Both
    orders of the two keys are tried."""
    for keys in (("triton_a", "custom"), ("custom", "triton_a")):
        message = _raw(_request())
        for key in keys:
            if key == "custom":
                message.parameters[key].uint64_param = 5
            else:
                message.parameters[key].bool_param = True
        assert _refused(message) == (
            "invalid value type for 'custom' parameter, expected int64_param, bool_param, or "
            "string_param."
        )


@pytest.mark.parametrize(
    ("datatype", "fields", "words"),
    [
        (
            "FP32",
            {"fp32_contents": 4, "int_contents": 4},
            "of type 'INT32', expected datatype 'FP32'",
        ),
        ("FP32", {"uint64_contents": 4}, "of type 'UINT64', expected datatype 'FP32'"),
        ("INT8", {"bool_contents": 4}, "of type 'BOOL', expected datatype 'INT8'"),
        ("INT64", {"int_contents": 4}, "of type 'INT32', expected datatype 'INT64'"),
        (
            "UINT16",
            {"uint_contents": 4, "uint64_contents": 4},
            ", binary data was already supplied.",
        ),
        ("FP32", {"fp32_contents": 4, "fp64_contents": 4}, ", binary data was already supplied."),
        ("FP16", {"fp32_contents": 4}, "of type 'FP32', expected datatype 'FP16'"),
    ],
)
def test_typed_contents_in_another_field_are_refused(
    datatype: str, fields: dict[str, int], words: str
) -> None:
    message = _request(datatype)
    for field, count in fields.items():
        values = [True] * count if field == "bool_contents" else [1] * count
        getattr(message.inputs[0].contents, field).extend(values)
    assert _refused(message) == (
        f"unexpected explicit tensor data for input tensor 'INPUT0' for model 'm'{words}"
        if words.startswith(",")
        else f"unexpected explicit tensor data for input tensor 'INPUT0' for model 'm' {words}"
    )


@pytest.mark.parametrize(
    ("datatype", "field"), [("INT8", "int_contents"), ("UINT16", "uint_contents")]
)
def test_narrow_integers_read_their_wide_field(datatype: str, field: str) -> None:
    message = _request(datatype)
    getattr(message.inputs[0].contents, field).extend([1, 2, 3, 4])
    request = decode_infer_request(InferRequestMessage.FromString(message.SerializeToString()))
    assert request.inputs[0].data.tolist() == [1, 2, 3, 4]


# A raw_input_contents entry (field 7, length-delimited) of 64 bytes, its tag written in 10
# bytes: protobuf reads a tag in 5 at most.
_OVERLONG = b"\xba\x80\x80\x80\x80\x80\x80\x80\x80\x00" + bytes([64]) + bytes(64)
# An unknown field of 20 KB: large enough that the raw entries are found without upb.
_PAD = b"\xca\x06\xa0\x9c\x01" + b"p" * 20000


@pytest.mark.parametrize("prefix", [b"", _PAD], ids=["small", "large"])
def test_a_tag_protobuf_does_not_read_is_refused_at_any_size(prefix: bytes) -> None:
    message = _request("FP32", 16).SerializeToString()
    with pytest.raises(DecodeError):
        InferRequestMessage.FromString(prefix + message + _OVERLONG)
    # Written in 5 bytes, the same tag reads (non-minimal, as protobuf allows).
    entry = b"\xba\x80\x80\x80\x00" + bytes([64]) + bytes(64)
    request = decode_infer_request(InferRequestMessage.FromString(prefix + message + entry))
    assert request.inputs[0].data.tolist() == [0.0] * 16
