"""The HTTP inference codec on its own, and against the real tritonclient request/response code."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest

from tritonactor.core.datatypes import DATATYPES, serialize_bytes, to_numpy_dtype
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.tensors import DATA_ERROR
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.frontends.http.codec import BINARY_DATA_OUTPUT, decode_infer_request
from tritonactor.frontends.http.json_body import decode_json, encode_json
from tritonactor.frontends.http.raw import decode_raw_request
from tritonactor.frontends.http.responses import encode_infer_response

JSON_DATATYPES = [datatype for datatype in DATATYPES if datatype not in ("FP16", "BF16")]


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    """Values that exercise each type: extremes for integers, fractions for floats."""
    count = int(np.prod(shape))
    if datatype == "BYTES":
        pool = [b"", b"abc", "h\u00e9llo \u4e16\u754c".encode(), b"x" * 300]
        values = np.empty(count, dtype=np.object_)
        values[:] = [pool[i % len(pool)] for i in range(count)]
        return values.reshape(shape)
    dtype = to_numpy_dtype(datatype)
    if datatype == "BOOL":
        return (np.arange(count) % 3 == 0).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = np.arange(count, dtype=np.int64) % 100
        array = values.astype(dtype)
        array[0], array[-1] = info.min, info.max
        return array.reshape(shape)
    return (np.arange(count, dtype=np.float64) * 0.37 - 1.5).astype(dtype).reshape(shape)


def binary_body(
    inputs: list[tuple[str, str, np.ndarray]],
    extra: dict[str, Any] | None = None,
    trailing: bytes = b"",
) -> tuple[bytes, int]:
    chunks = []
    entries = []
    for name, datatype, array in inputs:
        raw = serialize_bytes(array) if datatype == "BYTES" else array.tobytes()
        chunks.append(raw)
        entries.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
    header = orjson.dumps({"inputs": entries, **(extra or {})})
    return header + b"".join(chunks) + trailing, len(header)


def json_body(document: dict[str, Any]) -> bytes:
    return orjson.dumps(document)


def decode(body: bytes, header_length: int | None = None, **kwargs: Any) -> InferenceRequest:
    return decode_infer_request(body, header_length, "model", "1", **kwargs)


def json_input(name: str, datatype: str, shape: list[int], data: Any, **extra: Any) -> bytes:
    entry = {"name": name, "datatype": datatype, "shape": shape, "data": data, **extra}
    return json_body({"inputs": [entry]})


def assert_invalid(match: str, body: bytes, header_length: int | None = None) -> TritonError:
    """The error decoding `body` raises, or keeps for the model's signature to raise (data that
    do not fit their shape: DATA_ERROR)."""
    try:
        request = decode(body, header_length)
    except TritonError as raised:
        error = raised
    else:
        error = request.context[DATA_ERROR]
    assert re.search(match, error.message), error.message
    assert error.code is ErrorCode.INVALID_ARG
    return error


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    if expected.dtype == np.object_:
        assert actual.dtype == np.object_
        assert actual.tolist() == expected.tolist()
    else:
        assert actual.dtype == expected.dtype
        assert actual.tobytes() == expected.tobytes()


# --- decoding: binary --------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
def test_binary_input_round_trips(datatype: str) -> None:
    array = sample(datatype)
    body, header_length = binary_body([("INPUT0", datatype, array)])

    request = decode(body, header_length)

    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", datatype, (2, 3))
    assert_same(tensor.data, array)
    assert tensor.parameters == {}  # binary_data_size is transport, not tensor metadata


def test_binary_inputs_take_their_bytes_in_order() -> None:
    first, second, third = sample("INT32"), sample("BYTES", (4,)), sample("FP64", (1, 2))
    body, header_length = binary_body(
        [("A", "INT32", first), ("B", "BYTES", second), ("C", "FP64", third)]
    )

    request = decode(body, header_length)

    for tensor, expected in zip(request.inputs, [first, second, third], strict=True):
        assert_same(tensor.data, expected)


def test_binary_input_is_a_read_only_view_of_the_body() -> None:
    body, header_length = binary_body([("INPUT0", "FP32", sample("FP32"))])

    data = decode(body, header_length).inputs[0].data

    assert not data.flags.writeable
    assert data.base is not None


def test_json_and_binary_inputs_mix() -> None:
    array = sample("UINT16")
    body, header_length = binary_body([("B", "UINT16", array)])
    document = orjson.loads(body[:header_length])
    document["inputs"].insert(0, {"name": "J", "datatype": "INT8", "shape": [2], "data": [1, 2]})
    header = orjson.dumps(document)

    request = decode(header + body[header_length:], len(header))

    assert request.inputs[0].data.tolist() == [1, 2]
    assert_same(request.inputs[1].data, array)


def test_binary_bool_bytes_other_than_one_read_as_true() -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "B",
                    "datatype": "BOOL",
                    "shape": [3],
                    "parameters": {"binary_data_size": 3},
                }
            ]
        }
    )

    data = decode(header + b"\x00\x01\x07", len(header)).inputs[0].data

    assert data.dtype == np.bool_
    assert data.tolist() == [False, True, True]


def test_binary_section_longer_than_the_inputs_is_rejected() -> None:
    body, header_length = binary_body([("INPUT0", "INT32", sample("INT32"))], trailing=b"\0")
    assert_invalid("unexpected additional input data for model 'model'", body, header_length)


def test_binary_section_shorter_than_the_inputs_is_rejected() -> None:
    body, header_length = binary_body([("INPUT0", "INT32", sample("INT32"))])
    assert_invalid(
        "unexpected size for input 'INPUT0', expecting 1 additional bytes for model 'model'",
        body[:-1],
        header_length,
    )


def test_binary_data_without_header_length_is_rejected() -> None:
    body, header_length = binary_body([("INPUT0", "INT32", sample("INT32"))])
    assert_invalid("'INPUT0'.*Inference-Header-Content-Length", body[:header_length], None)


def test_binary_size_must_match_the_shape() -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [2],
                    "parameters": {"binary_data_size": 4},
                }
            ]
        }
    )
    error = assert_invalid(
        "input byte size mismatch for input 'X' for model 'model'", header + b"\0" * 4, len(header)
    )
    assert "Expected 8, got 4" in error.message


def test_binary_bytes_element_count_must_match_the_shape() -> None:
    raw = serialize_bytes(np.array([b"a", b"b"], dtype=np.object_))
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "S",
                    "datatype": "BYTES",
                    "shape": [3],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    assert_invalid(
        "expected 3 string elements for inference input 'S' for model 'model', got 2",
        header + raw,
        len(header),
    )


def test_truncated_bytes_element_is_rejected() -> None:
    raw = serialize_bytes(np.array([b"abcd"], dtype=np.object_))[:-1]
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "S",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    assert_invalid(
        "incomplete string data for inference input 'S', expecting string of length 4 but only "
        "3 bytes available",
        header + raw,
        len(header),
    )


@pytest.mark.parametrize("header_length", [-1, 10_000])
def test_header_length_outside_the_body_is_rejected(header_length: int) -> None:
    assert_invalid("Inference-Header-Content-Length", b'{"inputs": []}', header_length)


def test_data_and_binary_data_together_are_rejected() -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "INT8",
                    "shape": [1],
                    "data": [1],
                    "parameters": {"binary_data_size": 1},
                }
            ]
        }
    )
    assert_invalid(
        "Input must set only one of .* But set 'data' 'binary_data_size'$",
        header + b"\1",
        len(header),
    )


# --- decoding: JSON ----------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
def test_json_input_round_trips(datatype: str) -> None:
    array = sample(datatype)
    flat = array.reshape(-1).tolist()
    if datatype == "BYTES":
        flat = [item.decode() for item in flat]

    (tensor,) = decode(json_input("INPUT0", datatype, [2, 3], flat)).inputs

    assert (tensor.datatype, tensor.shape) == (datatype, (2, 3))
    assert_same(tensor.data, array)


@pytest.mark.parametrize("datatype", ["INT32", "FP32", "BOOL", "BYTES"])
def test_nested_json_data_equals_flat(datatype: str) -> None:
    array = sample(datatype)
    nested = array.tolist()
    if datatype == "BYTES":
        nested = [[item.decode() for item in row] for row in nested]

    (tensor,) = decode(json_input("INPUT0", datatype, [2, 3], nested)).inputs

    assert_same(tensor.data, array)


def test_ragged_nesting_is_flattened_in_order() -> None:
    (tensor,) = decode(json_input("X", "INT64", [2, 2], [[1], [2, [3, 4]]])).inputs
    assert tensor.data.tolist() == [[1, 2], [3, 4]]


def test_json_bytes_keep_empty_and_non_ascii_strings() -> None:
    strings = ["", "\u00fcber", "\U0001f600", "plain"]

    (tensor,) = decode(json_input("S", "BYTES", [4], strings)).inputs

    assert tensor.data.dtype == np.object_
    assert tensor.data.tolist() == [s.encode() for s in strings]


def test_json_element_count_must_match_the_shape() -> None:
    error = assert_invalid(
        "unexpected shape for input 'INPUT0'", json_input("INPUT0", "INT32", [2, 2], [1, 2, 3])
    )
    assert "4 elements" in error.message and "has 3" in error.message


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_json_data_for_half_floats_is_rejected(datatype: str) -> None:
    assert_invalid(
        f"receiving {datatype} data via JSON is not supported. Please use the binary data format "
        "for input H",
        json_input("H", datatype, [1], [1.0]),
    )


@pytest.mark.parametrize(
    ("datatype", "data", "match"),
    [
        ("INT32", ["1"], "must hold INT32 values"),
        ("INT32", [1.5], "must hold INT32 values"),
        ("INT32", [True], "must hold INT32 values"),
        ("UINT8", [256], "outside the UINT8 range"),
        ("INT8", [-129], "outside the INT8 range"),
        ("UINT64", [-1], "outside the UINT64 range"),
        ("INT64", [2**63], "outside the INT64 range"),
        ("UINT64", [2**64 - 1, -1], "outside the UINT64 range"),
        ("INT64", [2**64 - 1, 1], "outside the INT64 range"),
        ("UINT64", [2**64 - 1, 1.5], "must hold UINT64 values"),
        ("FP32", ["x"], "must hold FP32 values"),
        ("FP32", [None], "must hold FP32 values"),
        ("BOOL", [1], "must hold BOOL values"),
        ("BOOL", [True, 1], "must hold BOOL values"),
        # A JSON boolean among numbers (numpy would read it as 1 or 0; Triton refuses it).
        ("FP32", [1.5, True], "must hold FP32 values"),
        ("INT32", [5, True], "must hold INT32 values"),
        ("UINT8", [160, False], "must hold UINT8 values"),
        ("FP64", [[1.5], [False]], "must hold FP64 values"),
        ("BYTES", [1], "BYTES input 'X' must hold strings"),
        ("BYTES", [["a"], {"b": 1}], "BYTES input 'X' must hold strings"),
    ],
)
def test_json_values_of_the_wrong_type_are_rejected(
    datatype: str, data: list[Any], match: str
) -> None:
    assert_invalid(match, json_input("X", datatype, [len(data)], data))


def test_json_integers_accept_the_full_unsigned_range() -> None:
    (tensor,) = decode(json_input("X", "UINT64", [2], [0, 2**64 - 1])).inputs
    assert tensor.data.tolist() == [0, 2**64 - 1]


def test_json_floats_accept_integers() -> None:
    (tensor,) = decode(json_input("X", "FP64", [2], [1, 2.5])).inputs
    assert tensor.data.dtype == np.float64
    assert tensor.data.tolist() == [1.0, 2.5]


@pytest.mark.parametrize("data", ["abc", {"a": 1}, 3, None])
def test_data_that_is_not_an_array_is_rejected(data: Any) -> None:
    assert_invalid("'data' of input 'X' must be a JSON array", json_input("X", "INT32", [1], data))


def test_empty_tensor_needs_no_data() -> None:
    body = json_body({"inputs": [{"name": "E", "datatype": "FP32", "shape": [0, 4]}]})
    (tensor,) = decode(body).inputs
    assert tensor.data.shape == (0, 4)
    assert tensor.data.dtype == np.float32


def test_empty_json_data_for_an_empty_tensor() -> None:
    (tensor,) = decode(json_input("E", "BYTES", [0], [])).inputs
    assert tensor.data.shape == (0,)


def test_input_without_any_data_is_rejected() -> None:
    body = json_body({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1]}]})
    assert_invalid("Input must set only one of .* But no field is set$", body)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{not json", "failed to parse the request JSON buffer"),
        (b"[1, 2]", "must be a JSON object"),
        (b"{}", "has no 'inputs'"),
        (b'{"inputs": {}}', "'inputs' of the inference request must be a JSON array"),
        (b'{"inputs": [3]}', "input 0 must be a JSON object"),
        (b'{"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}', "input 0 has no 'name'"),
        (b'{"inputs": [{"name": "X", "shape": [1], "data": [1]}]}', "input 'X' has no 'datatype'"),
        (
            b'{"inputs": [{"name": "X", "datatype": "FP8", "shape": [1]}]}',
            "^invalid datatype for input X$",
        ),
        (
            b'{"inputs": [{"name": "X", "datatype": "FP32", "data": [1]}]}',
            "input 'X' has no 'shape'",
        ),
        (
            b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [-1], "data": [1]}]}',
            "negative",
        ),
        (
            b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1.0], "data": [1]}]}',
            "integers",
        ),
        (
            b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [true], "data": [1]}]}',
            "integers",
        ),
        (b'{"id": 5, "inputs": []}', "'id' must be a string"),
        # the request's parameters as Triton 2.51 words them
        (b'{"inputs": [], "parameters": []}', "attempt to get members for non-object"),
        (b'{"inputs": [], "parameters": {"a": null}}', "parameter 'a' has invalid type"),
        (b'{"inputs": [], "parameters": {"a": {"b": 1}}}', "parameter 'a' has invalid type"),
        (b'{"inputs": [], "parameters": {"binary_data_output": 1}}', "'binary_data_output'.*bool"),
        (b'{"inputs": [], "outputs": [{}]}', "requested output 0 has no 'name'"),
        (
            b'{"inputs": [], "outputs": [{"name": "Y", "parameters": {"binary_data": "yes"}}]}',
            "'Y'",
        ),
    ],
)
def test_malformed_requests_are_rejected(body: bytes, match: str) -> None:
    assert_invalid(match, body)


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        (
            {"priority": "1"},
            "Unable to parse 'priority': attempt to access JSON "
            "non-unsigned-integer as unsigned-integer",
        ),
        ({"priority": -1}, "Unable to parse 'priority'"),
        ({"priority": 1.5}, "Unable to parse 'priority'"),
        ({"priority": True}, "Unable to parse 'priority'"),
        ({"priority": 2**64}, "Unable to parse 'priority'"),
        ({"timeout": -5}, "Unable to parse 'timeout'"),
        ({"timeout": "x"}, "Unable to parse 'timeout'"),
        (
            {"sequence_start": 1},
            "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean",
        ),
        ({"sequence_end": "true"}, "Unable to parse 'sequence_end'"),
        ({"binary_data_output": 1}, "Unable to parse 'binary_data_output'"),
        (
            {"sequence_id": -3},
            "Unable to parse 'sequence_id': attempt to access JSON non-string as string",
        ),
        ({"sequence_id": 1.5}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": True}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": 2**64}, "Unable to parse 'sequence_id'"),
    ],
)
def test_parameters_the_server_acts_on_are_read_as_triton_reads_them(
    parameters: dict[str, Any], words: str
) -> None:
    """Whatever the model (a model with no sequence batcher or priority levels too), with
    Triton 2.51's words, answered 400 (Triton: 500)."""
    body = json.dumps({"inputs": [], "parameters": parameters}).encode()  # (2**64 too)
    with pytest.raises(TritonError) as raised:
        decode_infer_request(body, None, "m", "")
    assert raised.value.code is ErrorCode.INVALID_ARG
    assert raised.value.message.startswith(words)


def test_parameters_the_server_acts_on_of_their_types_pass() -> None:
    parameters = {
        "priority": 2**64 - 1,
        "timeout": 0,
        "sequence_id": "s",
        "sequence_start": True,
        "sequence_end": False,
    }
    request = decode_infer_request(
        json_body({"inputs": [], "parameters": parameters}), None, "m", ""
    )
    assert request.parameters == parameters
    request = decode_infer_request(
        json_body({"inputs": [], "parameters": {"sequence_id": 2**64 - 1}}), None, "m", ""
    )
    assert request.parameters == {"sequence_id": 2**64 - 1}


def test_duplicate_input_names_are_rejected() -> None:
    entry = {"name": "X", "datatype": "INT8", "shape": [1], "data": [1]}
    assert_invalid(
        r"\[request id: <id_unknown>\] input 'X' already exists in request",
        json_body({"inputs": [entry, entry]}),
    )


def test_request_and_output_parameters_are_kept() -> None:
    body = json_body(
        {
            "id": "req-7",
            "parameters": {"binary_data_output": True, "priority": 2, "custom": "x"},
            "inputs": [
                {
                    "name": "X",
                    "datatype": "INT8",
                    "shape": [1],
                    "data": [1],
                    "parameters": {"tag": 1.5},
                }
            ],
            "outputs": [
                {"name": "A", "parameters": {"binary_data": False, "classification": 3}},
                {"name": "B"},
            ],
        }
    )

    request = decode(body)

    assert (request.model_name, request.model_version, request.id) == ("model", "1", "req-7")
    # binary_data_output is the front end's; the model sees the rest (priority is the
    # scheduler's, and InferenceRequest.model_parameters leaves it out for the model).
    assert request.parameters == {"priority": 2, "custom": "x"}
    assert request.context == {BINARY_DATA_OUTPUT: True}
    assert request.inputs[0].parameters == {"tag": 1.5}
    assert request.outputs == [
        RequestedOutput("A", {"binary_data": False, "classification": 3}),
        RequestedOutput("B", {}),
    ]


def test_shared_memory_inputs_are_read_through_the_reader() -> None:
    region = np.arange(8, dtype=np.int32).tobytes()
    calls = []

    def read(name: str, offset: int, size: int) -> memoryview:
        calls.append((name, offset, size))
        return memoryview(region)[offset : offset + size]

    parameters = {
        "shared_memory_region": "r0",
        "shared_memory_byte_size": 8,
        "shared_memory_offset": 4,
        "keep": True,
    }
    body = json_body(
        {"inputs": [{"name": "X", "datatype": "INT32", "shape": [2], "parameters": parameters}]}
    )

    (tensor,) = decode(body, shared_memory=read).inputs

    assert calls == [("r0", 4, 8)]
    assert tensor.data.tolist() == [1, 2]
    assert tensor.parameters == {"keep": True}


def test_shared_memory_inputs_without_a_reader_are_rejected() -> None:
    parameters = {"shared_memory_region": "r0", "shared_memory_byte_size": 8}
    body = json_body(
        {"inputs": [{"name": "X", "datatype": "INT32", "shape": [2], "parameters": parameters}]}
    )
    assert_invalid("input 'X' uses shared memory", body)


# --- decoding: a header seen before -------------------------------------------------------------


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """No header seen before; the JSON documents decoded from here on, in order."""
    from tritonactor.frontends.http import codec

    codec._PLANS.clear()
    decoded: list[object] = []

    def counted(body: Any, max_depth: int = 64) -> Any:
        document = decode_json(body, max_depth)
        decoded.append(document)
        return document

    monkeypatch.setattr(codec, "decode_json", counted)
    return decoded


def test_a_header_sent_again_is_decoded_once_unless_it_names_a_request_id(
    plans: list[object],
) -> None:
    body, length = binary_body([("A", "FP32", sample("FP32", (4,)))])
    for _ in range(3):
        decode(body, length)
    assert len(plans) == 1
    # A request id makes every header new (clients giving each request its own): not kept.
    named, named_length = binary_body([("A", "FP32", sample("FP32", (4,)))], {"id": "same"})
    for _ in range(2):
        assert decode(named, named_length).id == "same"
    assert len(plans) == 3
    # The JSON depth limit is part of what was found valid.
    with pytest.raises(TritonError, match="nesting depth exceeds"):
        decode(body, length, max_depth=1)


def test_a_header_sent_again_decodes_to_the_same_request_with_its_own_data_and_parameters(
    plans: list[object],
) -> None:
    extra = {
        "parameters": {"binary_data_output": True, "level": 2},
        "outputs": [{"name": "Y", "parameters": {"binary_data": False, "keep": "x"}}],
    }
    first_data, second_data = sample("INT32", (2, 2)), sample("INT32", (2, 2)) + 7
    words = sample("BYTES", (3,))
    body, length = binary_body([("A", "INT32", first_data), ("W", "BYTES", words)], extra)
    again, same_length = binary_body([("A", "INT32", second_data), ("W", "BYTES", words)], extra)
    assert body[:length] == again[:same_length]  # the same header, other data

    for request in (decode(body, length), decode(body, length)):  # decoded, then from before
        request.parameters["changed"] = True  # what one request's holder does stays there
        request.inputs[0].parameters["changed"] = True
        request.outputs[0].parameters["changed"] = True
    second = decode_infer_request(again, length, "other_model", "3")

    assert len(plans) == 1
    assert (second.model_name, second.model_version, second.id) == ("other_model", "3", "")
    assert_same(second.inputs[0].data, second_data)
    assert_same(second.inputs[1].data, words)
    assert [(t.name, t.datatype, t.shape, t.parameters) for t in second.inputs] == [
        ("A", "INT32", (2, 2), {}),
        ("W", "BYTES", (3,), {}),
    ]
    assert second.parameters == {"level": 2}
    assert second.outputs == [RequestedOutput("Y", {"binary_data": False, "keep": "x"})]
    assert second.context[BINARY_DATA_OUTPUT] is True


def test_a_header_sent_again_with_data_that_does_not_fit_is_refused_as_a_full_decode_refuses_it(
    plans: list[object],
) -> None:
    from tritonactor.frontends.http import codec

    def refusals(body: bytes, good: bytes, length: int, decoded_again: int) -> tuple[str, str]:
        codec._PLANS.clear()
        full = assert_invalid(".", body, length).message  # nothing seen before: a full decode
        decode(good, length)  # the header is now known
        seen = len(plans)
        again = assert_invalid(".", body, length).message
        assert len(plans) == seen + decoded_again
        return full, again

    good, length = binary_body([("A", "FP32", sample("FP32", (4,)))])
    # More data than the header says: decoded in full again, for the full decode's error.
    full, again = refusals(good + b"x", good, length, decoded_again=1)
    assert full == again and "unexpected additional input data for model 'model'" in full
    # Two BYTES inputs whose data hold two elements where their shapes say one: the last one
    # is reported, as by a full decode, naming the model.
    word = np.array([b"abcd"], dtype=object)
    good, length = binary_body([("V", "BYTES", word), ("W", "BYTES", word)])
    broken = good[:length] + b"\x00" * 16  # each: two empty elements, in the same 8 bytes
    full, again = refusals(broken, good, length, decoded_again=0)
    assert full == again and "input 'W' for model 'model'" in full


def test_a_header_naming_shared_memory_is_read_and_reserved_again_each_time(
    plans: list[object],
) -> None:
    region = bytearray(np.arange(4, dtype=np.int32).tobytes())
    reserved: list[tuple[str, str, int, int]] = []

    def read(name: str, offset: int, size: int) -> memoryview:
        return memoryview(region)[offset : offset + size]

    def reserve(name: str, region: str, offset: int, size: int) -> None:
        reserved.append((name, region, offset, size))

    parameters = {"shared_memory_region": "r0", "shared_memory_byte_size": 16}
    body, length = binary_body([("A", "INT32", sample("INT32", (2,)))])
    header = orjson.loads(body[:length])
    header["inputs"].append(
        {"name": "S", "datatype": "INT32", "shape": [4], "parameters": parameters}
    )
    document = orjson.dumps(header)
    whole = document + body[length:]

    assert decode(whole, len(document), shared_memory=read).inputs[1].data.tolist() == [0, 1, 2, 3]
    region[:] = np.arange(10, 14, dtype=np.int32).tobytes()
    assert decode(whole, len(document), shared_memory=read).inputs[1].data.tolist() == [
        10,
        11,
        12,
        13,
    ]
    # An output written to shared memory: reserved by every request, not only the first.
    out = {
        "outputs": [
            {"name": "O", "parameters": {"shared_memory_region": "o", "shared_memory_byte_size": 8}}
        ]
    }
    body, length = binary_body([("A", "INT32", sample("INT32", (2,)))], out)
    for _ in range(2):
        assert decode(body, length, shared_memory_outputs=reserve).outputs[0].name == "O"
    assert reserved == [("O", "o", 0, 8)] * 2


def test_headers_sent_once_each_are_not_all_kept(plans: list[object]) -> None:
    from tritonactor.frontends.http import codec

    for index in range(3 * codec._PLANS_LIMIT):
        body, length = binary_body(
            [("A", "FP32", sample("FP32", (2,)))], {"parameters": {"n": index}}
        )
        assert decode(body, length).parameters == {"n": index}
    assert 0 < len(codec._PLANS) <= codec._PLANS_LIMIT


# --- decoding: raw binary ----------------------------------------------------------------------


def raw(
    body: bytes, datatype: str, dims: tuple[int, ...], batching: bool = False
) -> InferenceRequest:
    return decode_raw_request(body, "RAW", datatype, dims, batching, "model", "")


def test_raw_request_with_a_fixed_shape() -> None:
    array = sample("FP32", (2, 3))

    request = raw(array.tobytes(), "FP32", (2, 3))

    assert_same(request.inputs[0].data, array)
    # The wire option stays with the front end: the model sees no parameter.
    assert request.parameters == {}
    assert request.context == {BINARY_DATA_OUTPUT: True}
    assert request.outputs == []


def test_raw_request_infers_the_variable_dimension() -> None:
    array = sample("INT16", (4, 3))

    (tensor,) = raw(array.tobytes(), "INT16", (-1, 3)).inputs

    assert tensor.shape == (4, 3)
    assert_same(tensor.data, array)


def test_raw_request_to_a_batching_model_is_a_batch_of_one() -> None:
    # Triton's rule: [1, *dims], the variable dimension of dims deduced (not the batch).
    array = sample("FP32", (1, 8))

    (tensor,) = raw(array.tobytes(), "FP32", (-1,), batching=True).inputs

    assert tensor.shape == (1, 8)
    assert_same(tensor.data, array)


@pytest.mark.parametrize(
    ("size", "dims", "batching", "match"),
    [
        (10, (-1,), False, "not a whole number of FP32 elements"),
        (20, (-1, 3), False, "do not fit shape"),
        (24, (-1, -1), False, "more than one variable-sized dimension"),
        (24, (-1, -1), True, "more than one variable-sized dimension"),
        (28, (2, 3), False, "needs 6"),
        (32, (4,), True, "needs 4"),
    ],
)
def test_raw_request_size_must_fit_the_shape(
    size: int, dims: tuple[int, ...], batching: bool, match: str
) -> None:
    with pytest.raises(TritonError, match=match) as caught:
        raw(b"\0" * size, "FP32", dims, batching)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert "'RAW'" in caught.value.message


@pytest.mark.parametrize(("batching", "shape"), [(False, (1,)), (True, (1, 1))])
def test_raw_bytes_request_is_one_element(batching: bool, shape: tuple[int, ...]) -> None:
    (tensor,) = raw(b"\xff\xd8 jpeg bytes", "BYTES", (1,), batching).inputs

    assert tensor.shape == shape
    assert tensor.data.reshape(-1).tolist() == [b"\xff\xd8 jpeg bytes"]


@pytest.mark.parametrize("dims", [(-1,), (2,), (1, 1)])
def test_raw_bytes_request_needs_dims_of_one_element(dims: tuple[int, ...]) -> None:
    with pytest.raises(TritonError) as caught:
        raw(b"427", "BYTES", dims, batching=True)
    assert caught.value.message == (
        "[request id: <id_unknown>] For BYTE datatype raw input 'RAW', the model must have "
        "input shape [1]"
    )


# --- reserved and wire-only parameters ---------------------------------------------------------


def test_binary_data_output_is_kept_from_the_model() -> None:
    body = json_body(
        {
            "inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}],
            "parameters": {"binary_data_output": True, "custom": "kept"},
        }
    )

    request = decode_infer_request(body, None, "model", "")

    assert request.parameters == {"custom": "kept"}
    assert request.context == {BINARY_DATA_OUTPUT: True}


@pytest.mark.parametrize("key", ["triton_", "triton_x", "triton_enable_empty_final_response"])
def test_triton_prefixed_parameters_are_refused(key: str) -> None:
    body = json_body(
        {
            "inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}],
            "parameters": {key: True},
        }
    )
    assert_invalid(
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
        "be specified.",
        body,
    )


@pytest.mark.parametrize(
    ("parameters", "told"),
    [
        # a reserved key whatever it holds, before the type of another, in the JSON's order
        ({"triton_x": None}, "reserved"),
        ({"triton_x": 1, "custom": [1]}, "reserved"),
        ({"custom": [1], "triton_x": 1}, "'custom' has invalid type"),
        ({"priority": None, "custom": None}, "Unable to parse 'priority'"),
    ],
)
def test_the_request_parameters_are_told_in_their_order_before_the_tensors(
    parameters: dict[str, Any], told: str
) -> None:
    """As Triton 2.51 tells them (checked against it): one key after another, and before any
    fault of the request's tensors (here a datatype no one has)."""
    body = json_body(
        {
            "inputs": [{"name": "X", "datatype": "FP99", "shape": [1], "data": [1]}],
            "parameters": parameters,
        }
    )
    assert told in assert_invalid(".", body).message


def test_a_parameter_merely_containing_triton_is_accepted() -> None:
    body = json_body(
        {
            "inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}],
            "parameters": {"tritonx": 1, "TRITON_x": 2},
        }
    )
    assert decode_infer_request(body, None, "model", "").parameters == {"tritonx": 1, "TRITON_x": 2}


def test_several_bad_inputs_report_the_last_one_as_triton_does() -> None:
    strings = np.array([b"a", b"b"], dtype=np.object_)
    from tritonactor.core.datatypes import serialize_bytes

    chunk = serialize_bytes(strings)
    header = {
        "inputs": [
            {
                "name": name,
                "datatype": "BYTES",
                "shape": [3],
                "parameters": {"binary_data_size": len(chunk)},
            }
            for name in ("A", "B")
        ]
    }
    head = orjson.dumps(header)
    request = decode_infer_request(head + chunk + chunk, len(head), "m", "")
    assert request.context[DATA_ERROR].message == (
        "[request id: <id_unknown>] expected 3 string elements for inference input 'B' for "
        "model 'm', got 2"
    )


# --- JSON helpers ------------------------------------------------------------------------------


def test_decode_json_reports_malformed_json_as_invalid_arg() -> None:
    with pytest.raises(TritonError, match="failed to parse the request JSON buffer") as caught:
        decode_json(b'{"a": ')
    assert caught.value.code is ErrorCode.INVALID_ARG


def test_encode_json_writes_numpy_arrays() -> None:
    assert decode_json(encode_json({"a": np.array([1, 2], dtype=np.int32)})) == {"a": [1, 2]}


def test_decode_json_with_nan_reads_integers_past_64_bits_as_orjson_does() -> None:
    assert decode_json(b'{"a": [18446744073709551616, NaN]}')["a"][0] == 2.0**64
    assert decode_json(b'{"a": [18446744073709551615, NaN]}')["a"][0] == 2**64 - 1


def test_decode_json_reads_nan_and_the_infinities_as_triton_does() -> None:
    document = decode_json(b'{"data": [NaN, Infinity, -Infinity, 1.5], "name": "NaN"}')
    data = document["data"]
    assert math.isnan(data[0]) and data[1:] == [math.inf, -math.inf, 1.5]
    assert document["name"] == "NaN"


@pytest.mark.parametrize(
    "body",
    [
        b'{"data": [NaN, }',  # broken whatever its numbers
        b'{"data": [nan]}',  # Python's and Triton's words only
        b'{"id": "\xff", "data": [NaN]}',  # not UTF-8
        b'{"data": [Inf]}',  # Triton's parser takes this short form too: docs/decisions.md
        b'{"data": [1e999, NaN]}',  # too large for a float, as orjson and Triton have it
        b'{"id": "\\ud800", "data": [NaN]}',  # a lone surrogate, which orjson refuses
    ],
)
def test_decode_json_still_refuses_what_is_not_json_with_nan(body: bytes) -> None:
    with pytest.raises(TritonError, match="failed to parse the request JSON buffer") as caught:
        decode_json(body)
    assert caught.value.code is ErrorCode.INVALID_ARG


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_nan_and_the_infinities_are_written_as_triton_writes_them(datatype: str) -> None:
    dtype = to_numpy_dtype(datatype)
    array = np.array([[math.nan, math.inf], [-math.inf, 0.25]], dtype=dtype)
    body, header_length = encode_infer_response(
        make_response(tensor_of("OUT", datatype, array)), make_request()
    )
    assert header_length is None
    assert isinstance(body, bytes)
    assert b'"data":[NaN,Infinity,-Infinity,0.25]' in body
    read = json.loads(body)["outputs"][0]["data"]  # what tritonclient reads it with
    np.testing.assert_array_equal(np.array(read, dtype=dtype), array.reshape(-1))


# --- encoding ----------------------------------------------------------------------------------


def make_response(*tensors: Tensor, **kwargs: Any) -> InferenceResponse:
    return InferenceResponse("model", "1", outputs=list(tensors), **kwargs)


def tensor_of(name: str, datatype: str, array: np.ndarray, **parameters: Any) -> Tensor:
    return Tensor(name, datatype, array.shape, array, dict(parameters))


def make_request(*outputs: RequestedOutput, **parameters: Any) -> InferenceRequest:
    """A request as decode_infer_request leaves it: binary_data_output in its context."""
    request = InferenceRequest("model", "1", outputs=list(outputs), parameters=dict(parameters))
    if request.parameters.pop("binary_data_output", False):
        request.context[BINARY_DATA_OUTPUT] = True
    return request


def split_response(body: bytes, header_length: int | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        return orjson.loads(body), b""
    return orjson.loads(body[:header_length]), body[header_length:]


def read_outputs(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """A small independent reader of our responses, to check the encoder byte by byte."""
    from tritonactor.core.datatypes import deserialize_bytes

    header, binary = split_response(body, header_length)
    values, offset = {}, 0
    for output in header["outputs"]:
        datatype, shape = output["datatype"], output["shape"]
        if "parameters" in output and "binary_data_size" in output["parameters"]:
            size = output["parameters"]["binary_data_size"]
            chunk, offset = binary[offset : offset + size], offset + size
            if datatype == "BYTES":
                array = deserialize_bytes(chunk)
            else:
                array = np.frombuffer(chunk, dtype=to_numpy_dtype(datatype))
        elif datatype == "BYTES":
            array = np.array([s.encode() for s in output["data"]] or [], dtype=np.object_)
        else:
            array = np.array(output["data"], dtype=to_numpy_dtype(datatype))
        values[output["name"]] = array.reshape(shape)
    assert offset == len(binary)
    return values


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_output_round_trips(datatype: str, binary: bool) -> None:
    array = sample(datatype)
    request = make_request(RequestedOutput("OUT", {"binary_data": binary}))

    body, header_length = encode_infer_response(
        make_response(tensor_of("OUT", datatype, array)), request
    )

    header, _ = split_response(body, header_length)
    travels_binary = binary or datatype in ("FP16", "BF16")
    assert (header_length is not None) == travels_binary
    assert ("data" in header["outputs"][0]) == (not travels_binary)
    assert_same(read_outputs(body, header_length)["OUT"], array)


def test_binary_choice_per_output() -> None:
    outputs = [tensor_of(name, "INT32", sample("INT32")) for name in "ABCD"]
    request = make_request(
        RequestedOutput("A", {"binary_data": True}),
        RequestedOutput("B", {"binary_data": False}),
        RequestedOutput("C", {}),
        binary_data_output=True,
    )

    body, header_length = encode_infer_response(make_response(*outputs), request)

    header, binary = split_response(body, header_length)
    kinds = {o["name"]: "data" if "data" in o else "binary" for o in header["outputs"]}
    # D was not listed: it follows binary_data_output. C was listed with no setting of its
    # own: JSON, as Triton 2.51 answers it (a listed output's kind is its own binary_data).
    assert kinds == {"A": "binary", "B": "data", "C": "data", "D": "binary"}
    assert len(binary) == 2 * 24


@pytest.mark.parametrize(
    ("request_parameters", "expect_binary"),
    [({}, False), ({"binary_data_output": False}, False), ({"binary_data_output": True}, True)],
)
def test_unlisted_outputs_follow_binary_data_output(
    request_parameters: dict[str, Any], expect_binary: bool
) -> None:
    response = make_response(tensor_of("OUT", "FP32", sample("FP32")))

    _, header_length = encode_infer_response(response, make_request(**request_parameters))

    assert (header_length is not None) == expect_binary


def test_header_length_covers_exactly_the_json() -> None:
    response = make_response(
        tensor_of("A", "FP32", sample("FP32")),
        tensor_of("B", "BYTES", sample("BYTES")),
        id="r1",
    )

    body, header_length = encode_infer_response(response, make_request(binary_data_output=True))

    assert header_length is not None
    header = orjson.loads(body[:header_length])
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert header_length + sum(sizes) == len(body)
    assert body[header_length : header_length + sizes[0]] == sample("FP32").tobytes()


def test_json_outputs_have_no_parameters_key() -> None:
    response = make_response(
        tensor_of("A", "INT64", sample("INT64")), tensor_of("B", "BYTES", sample("BYTES"))
    )

    body, header_length = encode_infer_response(response, make_request())

    assert header_length is None
    for output in orjson.loads(body)["outputs"]:
        assert list(output) == ["name", "datatype", "shape", "data"]


def test_output_parameters_are_carried() -> None:
    response = make_response(
        tensor_of("J", "INT8", sample("INT8"), note="x"),
        tensor_of("B", "INT8", sample("INT8"), note="y"),
    )
    request = make_request(RequestedOutput("B", {"binary_data": True}))

    body, header_length = encode_infer_response(response, request)

    json_output, binary_output = split_response(body, header_length)[0]["outputs"]
    assert json_output["parameters"] == {"note": "x"}
    assert binary_output["parameters"] == {"note": "y", "binary_data_size": 6}


def test_response_keys_are_in_triton_order_and_empty_ones_left_out() -> None:
    bare, _ = encode_infer_response(make_response(), make_request())
    full, _ = encode_infer_response(make_response(id="abc", parameters={"k": 1}), make_request())

    assert list(orjson.loads(bare)) == ["model_name", "model_version", "outputs"]
    # Triton 2.51 writes "id" first.
    assert list(orjson.loads(full)) == [
        "id",
        "model_name",
        "model_version",
        "parameters",
        "outputs",
    ]


def test_json_output_is_flat_row_major() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3).T  # not C-contiguous
    response = make_response(Tensor("T", "INT32", (3, 2), array))

    body, _ = encode_infer_response(response, make_request())

    output = orjson.loads(body)["outputs"][0]
    assert output["shape"] == [3, 2]
    assert output["data"] == [0, 3, 1, 4, 2, 5]


def test_json_bool_output_is_true_false() -> None:
    body, _ = encode_infer_response(
        make_response(tensor_of("B", "BOOL", np.array([True, False]))), make_request()
    )
    assert b'"data":[true,false]' in body


def test_bytes_output_that_is_not_utf8_goes_binary() -> None:
    array = np.array([b"ok", b"\xff\xfe"], dtype=np.object_)

    body, header_length = encode_infer_response(
        make_response(tensor_of("S", "BYTES", array)), make_request()
    )

    assert header_length is not None
    assert_same(read_outputs(body, header_length)["S"], array)


def test_bytes_output_may_hold_str() -> None:
    array = np.array(["caf\u00e9", "x"], dtype=np.object_)

    body, _ = encode_infer_response(make_response(tensor_of("S", "BYTES", array)), make_request())

    assert orjson.loads(body)["outputs"][0]["data"] == ["caf\u00e9", "x"]


def test_output_data_is_cast_to_its_datatype() -> None:
    response = make_response(Tensor("X", "INT32", (2,), np.array([1, 2], dtype=np.int64)))

    body, header_length = encode_infer_response(response, make_request(binary_data_output=True))

    assert header_length is not None
    assert body[header_length:] == np.array([1, 2], dtype=np.int32).tobytes()


def test_output_whose_data_does_not_fit_its_shape_is_an_internal_error() -> None:
    response = make_response(Tensor("X", "INT32", (3,), np.array([1, 2], dtype=np.int32)))
    with pytest.raises(TritonError, match="output 'X' holds 2 elements") as caught:
        encode_infer_response(response, make_request())
    assert caught.value.code is ErrorCode.INTERNAL


# --- interop with the real tritonclient --------------------------------------------------------

httpclient = pytest.importorskip("tritonclient.http")


def client_input(name: str, datatype: str, array: np.ndarray, binary: bool) -> Any:
    infer_input = httpclient.InferInput(name, list(array.shape), datatype)
    return infer_input.set_data_from_numpy(array, binary_data=binary)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_decodes_tritonclient_requests(datatype: str, binary: bool) -> None:
    if not binary and datatype == "BF16":
        pytest.skip("tritonclient refuses BF16 as JSON itself")
    array = sample(datatype)
    inputs = [
        client_input("IN", datatype, array, binary),
        client_input("I2", "INT32", sample("INT32"), binary),
    ]
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=False)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="abc", parameters={"custom": 3}
    )

    if not binary and datatype == "FP16":
        assert_invalid(
            "receiving FP16 data via JSON is not supported.* for input IN", body, json_size
        )
        return
    request = decode(body, json_size)

    assert request.id == "abc"
    assert request.parameters == {"custom": 3}
    assert request.outputs == [RequestedOutput("OUT", {"binary_data": False})]
    assert_same(request.inputs[0].data, array)
    assert_same(request.inputs[1].data, sample("INT32"))


def test_tritonclient_without_outputs_asks_for_binary() -> None:
    inputs = [client_input("IN", "FP32", sample("FP32"), True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs)

    request = decode(body, json_size)
    response = make_response(tensor_of("OUT", "FP32", sample("FP32")))
    _, header_length = encode_infer_response(response, request)

    assert header_length is not None


def client_parses(body: bytes, header_length: int | None) -> Any:
    return httpclient.InferenceServerClient.parse_response_body(body, header_length=header_length)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_tritonclient_reads_our_responses(datatype: str, binary: bool) -> None:
    array = sample(datatype)
    response = make_response(
        tensor_of("OUT", datatype, array), tensor_of("O2", "FP32", sample("FP32")), id="q"
    )
    request = make_request(
        RequestedOutput("OUT", {"binary_data": binary}), RequestedOutput("O2", {})
    )

    result = client_parses(*encode_infer_response(response, request))

    received = result.as_numpy("OUT")
    if datatype == "BYTES" and not binary:
        # tritonclient keeps JSON strings as str.
        assert received.tolist() == [[item.decode() for item in row] for row in array.tolist()]
    else:
        assert_same(received, array)
    if datatype == "BF16":
        assert received.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(result.as_numpy("O2"), sample("FP32"))
    assert result.get_response()["id"] == "q"


@pytest.mark.filterwarnings("error")
def test_a_json_value_past_fp32s_range_is_its_infinity_without_a_warning() -> None:
    # As Triton: 1e39 read as FP32 is infinity; numpy's overflow warning is no one's business.
    (tensor,) = decode(json_input("X", "FP32", [3], [1e39, -1e39, 0.5])).inputs
    assert tensor.data.tolist() == [math.inf, -math.inf, 0.5]
    assert tensor.data.dtype == np.float32
