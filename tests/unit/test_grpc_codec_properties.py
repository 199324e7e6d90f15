"""Properties of the gRPC inference path on protobuf's wire form: a generated ModelInferRequest
decodes to the tensors it carries (raw contents or typed contents, under and over the size from
which raw contents are kept outside the message), a response encodes back to them, and bytes
that are not a request are refused with protobuf's DecodeError when parsed, or, once parsed,
with the error model's TritonError, nothing else."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tritonactor._proto_c.grpc_service_pb2 import ModelInferRequest
from tritonactor.core.datatypes import DATATYPES, deserialize_bytes, serialize_bytes, to_numpy_dtype
from tritonactor.core.errors import TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.frontends.grpc.codec import (
    CONTENTS_FIELD,
    decode_infer_request,
    encode_infer_response,
)
from tritonactor.frontends.grpc.wire import InferRequestMessage

BOUNDED = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NUMERIC = tuple(d for d in DATATYPES if d != "BYTES")
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)


@st.composite
def tensors(draw: st.DrawFn, name: str) -> tuple[str, Any]:
    datatype = draw(st.sampled_from(DATATYPES))
    shape = draw(shapes)
    if datatype == "BYTES":
        count = int(np.prod(shape))
        array = np.empty(count, dtype=np.object_)
        array[:] = draw(st.lists(st.binary(max_size=10), min_size=count, max_size=count))
        return datatype, array.reshape(shape)
    dtype = to_numpy_dtype(datatype)
    bits = draw(hnp.arrays(np.dtype(f"u{dtype.itemsize}"), shape))  # any bit pattern
    return datatype, bits.view(dtype) if datatype != "BOOL" else bits.astype(bool)


def _data(datatype: str, array: Any) -> bytes:
    return serialize_bytes(array) if datatype == "BYTES" else array.tobytes()


def _same(datatype: str, got: Any, expected: Any) -> None:
    assert tuple(np.shape(got)) == tuple(expected.shape)
    assert _data(datatype, np.asarray(got)) == _data(datatype, expected)


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, str, Any, bool]]]:
    """A serialized ModelInferRequest and its inputs (name, datatype, array, typed?)."""
    message = ModelInferRequest(model_name=draw(st.text(max_size=8)), id=draw(st.text(max_size=8)))
    inputs = []
    for index in range(draw(st.integers(1, 4))):
        name = f"IN{index}"
        datatype, array = draw(tensors(name))
        typed = draw(st.booleans()) and datatype not in ("FP16", "BF16")
        entry = message.inputs.add(name=name, datatype=datatype, shape=array.shape)
        if typed:  # the typed contents field of its kind
            field = getattr(entry.contents, CONTENTS_FIELD[datatype])
            field.extend(array.reshape(-1).tolist())
        else:
            message.raw_input_contents.append(_data(datatype, array))
        inputs.append((name, datatype, array, typed))
    if draw(st.booleans()):  # over 16 KiB: raw contents are then found in the bytes themselves
        big = np.arange(5000, dtype=np.int32)
        message.inputs.add(name="BIG", datatype="INT32", shape=big.shape)
        message.raw_input_contents.append(big.tobytes())
        inputs.append(("BIG", "INT32", big, False))
    if any(typed for *_, typed in inputs) and not all(typed for *_, typed in inputs):
        # One form per request: all typed contents, or (here) all raw contents.
        for entry, (*_, typed) in zip(message.inputs, inputs, strict=True):
            if typed:
                entry.ClearField("contents")
        message.ClearField("raw_input_contents")
        for _, datatype, array, _ in inputs:
            message.raw_input_contents.append(_data(datatype, array))
        inputs = [(n, d, a, False) for n, d, a, _ in inputs]
    return message.SerializeToString(), inputs


@BOUNDED
@given(requests())
def test_request_round_trip(case: tuple[bytes, list[tuple[str, str, Any, bool]]]) -> None:
    data, inputs = case
    request = decode_infer_request(InferRequestMessage.FromString(data))
    assert [t.name for t in request.inputs] == [name for name, *_ in inputs]
    for tensor, (_, datatype, array, typed) in zip(request.inputs, inputs, strict=True):
        assert tensor.datatype == datatype and tensor.shape == array.shape
        got = tensor.data
        if datatype == "BYTES":
            got = np.asarray(got).reshape(-1)
            want = [bytes(x) for x in array.reshape(-1)]
            assert [bytes(x) for x in got] == want
        elif typed:
            # Typed contents carry values (e.g. FP32 as float, NaN payloads aside).
            assert np.array_equal(
                np.asarray(got).reshape(array.shape), array, equal_nan=array.dtype.kind == "f"
            )
        else:
            _same(datatype, np.asarray(got).reshape(array.shape), array)


@BOUNDED
@given(st.lists(tensors("OUT"), min_size=1, max_size=3))
def test_response_round_trip(outputs: list[tuple[str, Any]]) -> None:
    response = InferenceResponse(
        model_name="m",
        model_version="1",
        id="q",
        outputs=[Tensor(f"O{i}", d, tuple(a.shape), a) for i, (d, a) in enumerate(outputs)],
    )
    message = encode_infer_response(response, request=InferenceRequest(model_name="m"))
    decoded = message.to_message()
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "1", "q")
    for entry, raw, (datatype, array) in zip(
        decoded.outputs, decoded.raw_output_contents, outputs, strict=True
    ):
        assert (entry.datatype, tuple(entry.shape)) == (datatype, array.shape)
        if datatype == "BYTES":
            assert list(deserialize_bytes(raw)) == [bytes(x) for x in array.reshape(-1)]
        else:
            assert raw == array.tobytes()


def _parse_or_refuse(data: bytes) -> None:
    try:
        message = InferRequestMessage.FromString(data)
    except DecodeError:
        return
    with contextlib.suppress(TritonError):
        decode_infer_request(message)


@BOUNDED
@given(st.binary(max_size=300))
def test_any_bytes_are_parsed_or_refused(data: bytes) -> None:
    _parse_or_refuse(data)


@BOUNDED
@given(requests(), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8))
def test_damaged_request_is_parsed_or_refused(
    case: tuple[bytes, Any], at: int, junk: bytes
) -> None:
    """A real request with a few bytes changed, inserted or cut: the likeliest garbage."""
    data = case[0]
    at %= len(data) + 1
    for damaged in (
        data[:at] + junk + data[at + len(junk) :],
        data[:at] + junk + data[at:],
        data[:at],
    ):
        _parse_or_refuse(damaged)


def test_non_utf8_model_name_is_a_decode_error() -> None:
    """`0a 02 ff fe` (the issue's bytes): a model name that is not UTF-8."""
    with contextlib.suppress(DecodeError):
        InferRequestMessage.FromString(bytes.fromhex("0a02fffe"))
        raise AssertionError("parsed a model name that is not UTF-8")
