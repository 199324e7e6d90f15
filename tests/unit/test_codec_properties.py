"""Properties of the HTTP wire codecs, for generated tensors and generated garbage: a tensor
survives the trip through the binary tensor extension, the BYTES length-prefixed form, the JSON
form and a raw body; and no input makes a decoder raise anything but the error model's
TritonError (a client's mistake is an answer, never a traceback)."""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tritonactor.core.datatypes import (
    BINARY_ONLY,
    DATATYPES,
    deserialize_bytes,
    serialize_bytes,
    to_numpy_dtype,
)
from tritonactor.core.errors import TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.frontends.http.codec import BINARY_DATA_OUTPUT, decode_infer_request
from tritonactor.frontends.http.raw import decode_raw_request
from tritonactor.frontends.http.responses import encode_infer_response

BOUNDED = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NUMERIC = tuple(d for d in DATATYPES if d != "BYTES")
JSON_NUMERIC = tuple(d for d in NUMERIC if d not in BINARY_ONLY)
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)
byte_items = st.binary(max_size=12)


@st.composite
def numeric_arrays(draw: st.DrawFn, datatypes: tuple[str, ...] = NUMERIC) -> tuple[str, Any]:
    datatype = draw(st.sampled_from(datatypes))
    dtype = to_numpy_dtype(datatype)
    shape = draw(shapes)
    if datatype == "BF16":  # no hypothesis strategy for it: its bits, from 16-bit integers
        bits = draw(hnp.arrays(np.uint16, shape))
        return datatype, bits.view(dtype)
    finite = datatype in JSON_NUMERIC  # JSON has no NaN or infinity
    elements = None
    if dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=not finite, allow_infinity=False)
    return datatype, draw(hnp.arrays(dtype, shape, elements=elements))


@st.composite
def bytes_arrays(draw: st.DrawFn) -> Any:
    shape = draw(shapes)
    count = int(np.prod(shape))
    items = draw(st.lists(byte_items, min_size=count, max_size=count))
    array = np.empty(count, dtype=np.object_)
    array[:] = items
    return array.reshape(shape)


def _binary_body(name: str, datatype: str, array: Any) -> tuple[bytes, int]:
    data = serialize_bytes(array) if datatype == "BYTES" else array.tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(array.shape),
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(data)},
                }
            ]
        }
    ).encode()
    return header + data, len(header)


def _same(datatype: str, got: Any, expected: Any) -> None:
    assert tuple(got.shape) == tuple(expected.shape)
    if datatype == "BYTES":
        assert [bytes(x) for x in got.reshape(-1)] == [bytes(x) for x in expected.reshape(-1)]
    else:  # bit for bit: NaNs and signed zeros included
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()


# --- BYTES, length-prefixed ---------------------------------------------------------------------


@BOUNDED
@given(st.lists(byte_items, max_size=20))
def test_bytes_round_trip(items: list[bytes]) -> None:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    encoded = serialize_bytes(array)
    assert len(encoded) == sum(4 + len(i) for i in items)
    assert list(deserialize_bytes(encoded, len(items))) == items


@BOUNDED
@given(st.binary(max_size=64), st.none() | st.integers(0, 8))
def test_bytes_garbage_is_a_value_error(data: bytes, count: int | None) -> None:
    """The documented error of the BYTES decoder (the front ends turn it into INVALID_ARG)."""
    try:
        items = deserialize_bytes(data, count)
    except ValueError:
        return
    assert serialize_bytes(items) == data  # what it accepts is exactly what it reads


# --- requests: binary, JSON, raw ---------------------------------------------------------------


@BOUNDED
@given(numeric_arrays() | st.tuples(st.just("BYTES"), bytes_arrays()))
def test_binary_request_round_trip(case: tuple[str, Any]) -> None:
    datatype, array = case
    body, header_length = _binary_body("X", datatype, array)
    request = decode_infer_request(body, header_length, "m", "")
    [tensor] = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", datatype, array.shape)
    _same(datatype, tensor.data, array)


@BOUNDED
@given(numeric_arrays(JSON_NUMERIC))
def test_json_request_round_trip(case: tuple[str, Any]) -> None:
    datatype, array = case
    body = json.dumps(
        {
            "id": "r",
            "inputs": [
                {
                    "name": "X",
                    "shape": list(array.shape),
                    "datatype": datatype,
                    "data": array.tolist(),
                }
            ],
        }
    ).encode()
    request = decode_infer_request(body, None, "m", "")
    [tensor] = request.inputs
    assert request.id == "r"
    _same(datatype, np.asarray(tensor.data, dtype=array.dtype).reshape(array.shape), array)


@BOUNDED
@given(st.lists(st.text(max_size=8), max_size=8))
def test_json_bytes_request_round_trip(items: list[str]) -> None:
    body = json.dumps(
        {"inputs": [{"name": "S", "shape": [len(items)], "datatype": "BYTES", "data": items}]}
    ).encode()
    [tensor] = decode_infer_request(body, None, "m", "").inputs
    assert [bytes(x) for x in tensor.data.reshape(-1)] == [s.encode() for s in items]


@BOUNDED
@given(numeric_arrays(), st.booleans())
def test_raw_request_round_trip(case: tuple[str, Any], batching: bool) -> None:
    datatype, array = case
    flat = array.reshape(-1)
    request = decode_raw_request(flat.tobytes(), "X", datatype, (-1,), batching, "m", "")
    [tensor] = request.inputs
    _same(datatype, np.asarray(tensor.data).reshape(-1), flat)
    assert tensor.shape == ((1, flat.size) if batching else (flat.size,))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
input_like = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=4) | json_values,
        "shape": st.lists(st.integers(-2, 5), max_size=3) | json_values,
        "datatype": st.sampled_from([*DATATYPES, "FP8", ""]) | json_values,
        "data": json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_size", "shared_memory_region", "x"]),
            st.integers(-1, 64) | json_values,
            max_size=2,
        ),
    },
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "inputs": st.lists(input_like, max_size=3) | json_values,
        "outputs": st.lists(st.dictionaries(st.sampled_from(["name", "parameters"]), json_values))
        | json_values,
        "parameters": st.dictionaries(st.text(max_size=12), json_values, max_size=3) | json_values,
    },
)


@BOUNDED
@given(request_like | json_values, st.binary(max_size=64), st.booleans())
def test_any_request_document_is_decoded_or_refused(
    document: Any, tail: bytes, binary: bool
) -> None:
    header = json.dumps(document).encode()
    with contextlib.suppress(TritonError):
        decode_infer_request(
            header + tail if binary else header, len(header) if binary else None, "m", ""
        )


@BOUNDED
@given(st.binary(max_size=200), st.none() | st.integers(0, 220))
def test_any_body_is_decoded_or_refused(body: bytes, header_length: int | None) -> None:
    if header_length is not None and header_length > len(body):
        header_length = len(body)
    with contextlib.suppress(TritonError):
        decode_infer_request(body, header_length, "m", "")


@BOUNDED
@given(
    st.binary(max_size=64),
    st.sampled_from(DATATYPES),
    st.lists(st.integers(-1, 4), min_size=1, max_size=3),
    st.booleans(),
)
def test_any_raw_body_is_decoded_or_refused(
    body: bytes, datatype: str, dims: list[int], batching: bool
) -> None:
    with contextlib.suppress(TritonError):
        decode_raw_request(body, "X", datatype, tuple(dims), batching, "m", "")


# --- responses ---------------------------------------------------------------------------------


def _decode_response(body: bytes, header_length: int | None) -> dict[str, Any]:
    """Read a response as a client does: its JSON, each binary output's data in `raw`."""
    header = body if header_length is None else body[:header_length]
    document = json.loads(header)
    position = len(header)
    for output in document["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            output["raw"] = body[position : position + size]
            position += size
    assert position == len(body)
    return document


@BOUNDED
@given(numeric_arrays() | st.tuples(st.just("BYTES"), bytes_arrays()), st.booleans())
def test_response_round_trip(case: tuple[str, Any], binary: bool) -> None:
    datatype, array = case
    request = InferenceRequest(model_name="m", id="q")
    if binary:
        request.context[BINARY_DATA_OUTPUT] = True
    response = InferenceResponse(
        model_name="m",
        model_version="1",
        id="q",
        outputs=[Tensor("Y", datatype, tuple(array.shape), array)],
    )
    body, header_length = encode_infer_response(response, request)
    document = _decode_response(body, header_length)
    assert (document["model_name"], document["model_version"], document["id"]) == ("m", "1", "q")
    [output] = document["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == (
        "Y",
        datatype,
        list(array.shape),
    )
    if "raw" in output:
        raw = output["raw"]
        got = (
            deserialize_bytes(raw).reshape(array.shape)
            if datatype == "BYTES"
            else np.frombuffer(raw, dtype=array.dtype).reshape(array.shape)
        )
    else:
        assert datatype not in BINARY_ONLY and not binary
        values = output["data"]
        if datatype == "BYTES":
            got = np.array([s.encode() for s in values] or [], dtype=object).reshape(array.shape)
        else:
            got = np.array(values, dtype=array.dtype).reshape(array.shape)
    _same(datatype, got, array)


@BOUNDED
@given(numeric_arrays(JSON_NUMERIC), st.booleans())
def test_requested_output_form_is_honoured(case: tuple[str, Any], binary: bool) -> None:
    datatype, array = case
    request = InferenceRequest(
        model_name="m", outputs=[RequestedOutput("Y", {"binary_data": binary})]
    )
    response = InferenceResponse(
        model_name="m", model_version="1", outputs=[Tensor("Y", datatype, array.shape, array)]
    )
    body, header_length = encode_infer_response(response, request)
    assert (header_length is not None) == binary
    if binary:
        assert body[header_length:] == array.tobytes()


def test_length_prefix_is_little_endian() -> None:
    """A fixed point beside the properties: the wire layout itself."""
    array = np.array([b"ab", b""], dtype=object)
    assert serialize_bytes(array) == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_binary_only_types_refuse_json_data(datatype: str) -> None:
    body = json.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": datatype, "data": [1.0]}]}
    ).encode()
    with pytest.raises(TritonError):
        decode_infer_request(body, None, "m", "")
