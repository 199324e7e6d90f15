"""The generate extension's body ⇄ request mapping, without a server: how keys become inputs or
parameters, how a value is shaped by the model's metadata, and the response object."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tritonactor.config.model_config import parse_pbtxt
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceResponse, Tensor
from tritonactor.frontends.http.generate import decode_generate_request, encode_generate_response
from tritonactor.frontends.http.json_body import encode_json
from tritonactor.scheduling.signature import ModelSignature

CONFIG = """
name: "m"
max_batch_size: {batch}
input [
  {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "GRID" data_type: TYPE_INT32 dims: [ -1, 2, -1 ] optional: true }},
  {{ name: "U8" data_type: TYPE_UINT8 dims: [ -1 ] optional: true }},
  {{ name: "HALF" data_type: TYPE_FP16 dims: [ -1 ] optional: true }}
]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""


def decode(body: object, batch: int = 0):
    signature = ModelSignature.from_config(parse_pbtxt(CONFIG.format(batch=batch)))
    text = body if isinstance(body, str) else json.dumps(body)
    return decode_generate_request(text.encode(), signature, "m", "")


def test_inputs_parameters_and_the_id() -> None:
    request = decode(
        {"TEXT": "hi", "id": "r1", "big": 2**64, "f": 0.5, "parameters": {"U8": [1, 2], "p": "x"}}
    )
    assert request.id == "r1"
    assert request.parameters == {"id": "r1", "big": float(2**64), "f": 0.5, "p": "x"}
    text, u8 = request.inputs
    assert (text.shape, text.data.tolist()) == ((1,), [b"hi"])
    assert (u8.datatype, u8.shape, u8.data.dtype, u8.data.tolist()) == (
        "UINT8",
        (2,),
        np.uint8,
        [1, 2],
    )


@pytest.mark.parametrize(
    ("batch", "value", "shape"),
    [
        (0, [1, 2, 3, 4], (1, 2, 2)),  # innermost variable dim takes the rest, others 1
        (0, [[1, 2], [3, 4]], None),  # shaped [1, 2, 1] by its 2 elements, but holds 4 values
        (4, [1, 2, 3, 4, 5, 6], (1, 1, 2, 3)),  # the batch dimension is a variable one too
        (0, [1, 2, 3], None),
    ],
)
def test_values_are_shaped_by_the_metadata(batch: int, value: list, shape: tuple | None) -> None:
    body = {"TEXT": ["hi"], "GRID": value}
    if shape is None:
        with pytest.raises(TritonError) as caught:
            decode(body, batch)
        assert caught.value.code in (ErrorCode.INVALID_ARG, ErrorCode.INTERNAL)
        return
    grid = decode(body, batch).inputs[1]
    assert grid.shape == shape
    assert grid.data.reshape(-1).tolist() == value


def test_a_nested_array_is_read_flat_as_triton_does() -> None:
    # Two top-level elements for a [-1] input, four values inside: Triton's "Shape does not
    # match true shape of 'data' field".
    with pytest.raises(TritonError, match="Shape does not match true shape of 'data' field"):
        decode({"TEXT": "hi", "U8": [[1, 2], [3, 4]]})
    assert decode({"TEXT": [["hi"]]}).inputs[0].data.tolist() == [b"hi"]


def test_values_json_cannot_carry() -> None:
    with pytest.raises(TritonError, match="receiving FP16 data via JSON is not supported"):
        decode({"TEXT": "hi", "HALF": [1.0]})
    with pytest.raises(TritonError, match="non-unsigned-integer as unsigned-integer"):
        decode({"TEXT": "hi", "U8": [-1]})
    with pytest.raises(TritonError, match="outside the UINT8 range"):
        decode({"TEXT": "hi", "U8": [256]})


def test_parameters_cannot_hold_a_key_that_is_an_input_of_the_same_name() -> None:
    config = CONFIG.format(batch=0).replace('"GRID"', '"parameters"')
    signature = ModelSignature.from_config(parse_pbtxt(config))
    with pytest.raises(TritonError, match="Keyword 'parameters' for nested schema also given"):
        decode_generate_request(b'{"parameters": [1, 2]}', signature, "m", "")


def test_the_response_object() -> None:
    response = InferenceResponse(
        "m",
        "3",
        id="r1",
        outputs=[
            Tensor("b_list", "FP32", (2,), np.array([0.1, 2], np.float32)),
            Tensor("a_scalar", "BYTES", (1, 1), np.array([[b"x"]], np.object_)),
            Tensor("empty", "INT64", (0,), np.zeros(0, np.int64)),
            Tensor("model_name", "INT32", (1,), np.array([7], np.int32)),  # reserved key wins
            Tensor("flag", "BOOL", (1,), np.array([True])),
        ],
        parameters={"z": 1, "flag": "parameter first"},
    )
    encoded = encode_generate_response(response)
    assert list(encoded) == sorted(encoded)
    assert encoded == {
        "a_scalar": "x",
        "b_list": [float(np.float32(0.1)), 2.0],
        "empty": [],
        "flag": "parameter first",
        "id": "r1",
        "model_name": "m",
        "model_version": "3",
        "z": 1,
    }
    half = InferenceResponse("m", "1", outputs=[Tensor("h", "FP16", (1,), np.zeros(1, np.float16))])
    with pytest.raises(TritonError, match="sending FP16 data via JSON is not supported"):
        encode_generate_response(half)


def test_nan_and_the_infinities_are_written_as_triton_writes_them() -> None:
    """(They were written `null`; /infer already wrote Triton's literals.)"""
    values = np.array([np.nan, np.inf, -np.inf, 1.5], np.float32)
    response = InferenceResponse(
        "m",
        "1",
        outputs=[
            Tensor("many", "FP32", (4,), values),
            Tensor("one", "FP64", (1,), np.array([-np.inf])),
        ],
    )
    body = encode_json(encode_generate_response(response))
    assert b'"many":[NaN,Infinity,-Infinity,1.5]' in body
    assert b'"one":-Infinity' in body
    # the finite values beside them as without them (a float32 written as the double it is)
    tenth = InferenceResponse(
        "m", "1", outputs=[Tensor("f", "FP32", (2,), np.array([0.1, np.nan], np.float32))]
    )
    assert encode_json(encode_generate_response(tenth)) == (
        b'{"f":[0.10000000149011612,NaN],"model_name":"m","model_version":"1"}'
    )
    assert json.loads(body)["one"] == -np.inf  # (Python's json reads them back)


def test_bytes_that_are_not_utf8_are_written_with_replacement_characters() -> None:
    # A JSON document holds text: Triton copies the raw bytes into it (an invalid document);
    # here each undecodable byte is U+FFFD, so the body stays valid JSON (docs/generate.md).
    raw = np.array([b"ok \xff\xfe end"], np.object_)
    response = InferenceResponse("m", "1", outputs=[Tensor("t", "BYTES", (1,), raw)])
    assert encode_generate_response(response)["t"] == "ok \ufffd\ufffd end"
