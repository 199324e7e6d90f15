"""The HTTP protocol end to end: what a client sees from `hypercorn tritonactor.app:app`.

tritonclient.http does what a client would do; httpx checks exact bodies and headers, some of
them byte for byte against what Triton 2.51 answered for the same request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import WIRE_DATATYPES
from tests.server_process import ServerProcess, wait_for
from tritonactor.core.datatypes import to_numpy_dtype

pytestmark = pytest.mark.e2e

A = list(range(16))
B = [1] * 16
GOOD = {
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B},
    ]
}
SUM = [a + b for a, b in zip(A, B, strict=True)]
DIFFERENCE = [a - b for a, b in zip(A, B, strict=True)]
# Triton 2.51's answer to GOOD on its `simple` model, byte for byte (the oracle's record).
TRITON_SIMPLE_BODY = (
    b'{"model_name":"simple","model_version":"1","outputs":['
    b'{"name":"OUTPUT0","datatype":"INT32","shape":[1,16],'
    b'"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},'
    b'{"name":"OUTPUT1","datatype":"INT32","shape":[1,16],'
    b'"data":[-1,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14]}]}'
)
SUM_BYTES = np.array(SUM, dtype=np.int32).tobytes()
DIFFERENCE_BYTES = np.array(DIFFERENCE, dtype=np.int32).tobytes()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, timeout=30) as http:
        yield http


def post_json(http: httpx.Client, path: str, document: Any) -> httpx.Response:
    return http.post(
        path, content=orjson.dumps(document), headers={"Content-Type": "application/json"}
    )


def split_binary(response: httpx.Response) -> tuple[dict[str, Any], bytes]:
    """The JSON header and the binary section of a binary-extension response."""
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    return orjson.loads(response.content[:length]), response.content[length:]


def simple_inputs(binary: bool) -> list[httpclient.InferInput]:
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([A], dtype=np.int32), binary_data=binary)
    inputs[1].set_data_from_numpy(np.array([B], dtype=np.int32), binary_data=binary)
    return inputs


# --- every datatype ----------------------------------------------------------------------------


def sample(datatype: str) -> np.ndarray:
    """A [2, 4] tensor of `datatype` with its awkward values: extremes, empty and non-ASCII
    strings, negative zero, values a half float holds exactly."""
    if datatype == "BYTES":
        values: list[Any] = ["", "a", "héllo", "日本語", "😀", "x y", "\\", '"quoted"']
        return np.array(values, dtype=np.object_).reshape(2, 4)
    if datatype == "BOOL":
        return np.array([True, False, False, True, True, True, False, False]).reshape(2, 4)
    if datatype == "BF16":
        return np.array([1, -2.5, 0.5, 256, -0.0, 3, 1024, -1], dtype=ml_dtypes.bfloat16).reshape(
            2, 4
        )
    dtype = np.dtype(datatype.lower().replace("fp", "float"))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([info.min, info.max, 0, 1, 2, info.max - 1, 7, 42], dtype=dtype).reshape(
            2, 4
        )
    info = np.finfo(dtype)
    values = [0.0, -0.0, 1.5, -2.25, float(info.max), float(info.tiny), 0.1, 65504.0]
    return np.array(values, dtype=dtype).reshape(2, 4)


ROUND_TRIPS = [
    pytest.param(datatype, binary, id=f"{datatype}-{'binary' if binary else 'json'}")
    for datatype in WIRE_DATATYPES
    for binary in (False, True)
    # FP16 and BF16 have no JSON form: clients must send them binary (see test_http_errors).
    if binary or datatype not in ("FP16", "BF16")
]


@pytest.mark.parametrize(("datatype", "binary"), ROUND_TRIPS)
def test_every_datatype_round_trips(
    client: httpclient.InferenceServerClient, datatype: str, binary: bool
) -> None:
    array = sample(datatype)
    tensor = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)

    result = client.infer(f"identity_{datatype.lower()}", [tensor], outputs=[output])

    echoed = result.as_numpy("OUTPUT0")
    (entry,) = result.get_response()["outputs"]
    assert entry["datatype"] == datatype
    assert entry["shape"] == [2, 4]
    if datatype == "BYTES":
        expected = [s.encode() for s in array.reshape(-1)]
        got = [s if isinstance(s, bytes) else s.encode() for s in echoed.reshape(-1)]
        assert got == expected
    else:
        assert echoed.dtype == array.dtype
        assert echoed.tobytes() == array.tobytes()  # bit for bit: -0.0 and extremes included
    if binary:
        assert "data" not in entry
        assert entry["parameters"]["binary_data_size"] > 0
    else:
        assert "parameters" not in entry  # Triton's C++ client reads any "parameters" as binary
        assert "data" in entry


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_nan_and_the_infinities_travel_in_json(
    client: httpclient.InferenceServerClient, http: httpx.Client, datatype: str
) -> None:
    """JSON has no number for them: Triton reads and writes the literals NaN, Infinity and
    -Infinity, as tritonclient (Python's json) does."""
    array = np.array([[np.nan, np.inf, -np.inf, 0.5]] * 2, dtype=to_numpy_dtype(datatype))
    tensor = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=False)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)

    result = client.infer(f"identity_{datatype.lower()}", [tensor], outputs=[output])

    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)
    document = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": datatype, "data": [0.5, 1.5, 2, 3]}
        ]
    }
    raw = orjson.dumps(document).replace(b"[0.5,1.5,2,3]", b"[NaN,Infinity,-Infinity,3]")
    response = http.post(f"/v2/models/identity_{datatype.lower()}/infer", content=raw)
    assert response.status_code == 200, response.text
    assert b'"data":[NaN,Infinity,-Infinity,3.0]' in response.content


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_floats_are_answered_binary_even_when_json_is_asked(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    # A deviation kept on purpose: Triton answers 400 ("sending FP16 data via JSON is not
    # supported"); every client reads binary outputs, so we answer in binary instead.
    array = sample(datatype)
    tensor = httpclient.InferInput("INPUT0", [2, 4], datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)

    result = client.infer(f"identity_{datatype.lower()}", [tensor], outputs=[output])

    assert result.as_numpy("OUTPUT0").tobytes() == array.tobytes()
    (entry,) = result.get_response()["outputs"]
    assert entry["parameters"] == {"binary_data_size": array.nbytes}


# --- BYTES -------------------------------------------------------------------------------------


def test_bytes_json_keeps_empty_and_non_ascii_strings(http: httpx.Client) -> None:
    strings = ["a", "héllo", "", "日本語 😀"]
    request = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "BYTES", "data": strings}]
    }

    response = post_json(http, "/v2/models/strings/infer", request)

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "model_name": "strings",
        "model_version": "1",
        "outputs": [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 4], "data": strings}],
    }
    # Non-ASCII text travels as UTF-8, not as \u escapes (as in Triton).
    assert "héllo".encode() in response.content


def test_bytes_binary_keeps_empty_and_non_ascii_strings(http: httpx.Client) -> None:
    strings = [b"a", "héllo".encode(), b""]
    data = b"".join(len(s).to_bytes(4, "little") + s for s in strings)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 3],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )

    response = http.post(
        "/v2/models/strings/infer",
        content=header + data,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )

    assert response.status_code == 200
    document, binary = split_binary(response)
    assert binary == data  # the same 4-byte length prefixes, empty string included
    assert document["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "BYTES",
            "shape": [1, 3],
            "parameters": {"binary_data_size": len(data)},
        }
    ]


def test_empty_bytes_tensor(http: httpx.Client) -> None:
    request = {"inputs": [{"name": "INPUT0", "shape": [1, 0], "datatype": "BYTES", "data": []}]}
    response = post_json(http, "/v2/models/strings/infer", request)
    assert response.status_code == 200
    assert response.json()["outputs"][0] == {
        "name": "OUTPUT0",
        "datatype": "BYTES",
        "shape": [1, 0],
        "data": [],
    }


# --- the response: outputs, binary data, id, parameters ---------------------------------------


def test_json_response_is_byte_for_byte_tritons(http: httpx.Client) -> None:
    for headers in ({"Content-Type": "application/json"}, {}):  # tritonclient sends neither
        response = http.post("/v2/models/simple/infer", content=orjson.dumps(GOOD), headers=headers)
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.content == TRITON_SIMPLE_BODY


def test_request_id_is_echoed_first(
    http: httpx.Client, client: httpclient.InferenceServerClient
) -> None:
    response = post_json(http, "/v2/models/simple/infer", {**GOOD, "id": "my-id"})
    assert response.content == b'{"id":"my-id",' + TRITON_SIMPLE_BODY[1:]

    result = client.infer("simple", simple_inputs(binary=True), request_id="abc-é-1")
    assert result.get_response()["id"] == "abc-é-1"
    assert "id" not in client.infer("simple", simple_inputs(binary=True)).get_response()


def test_requested_outputs_subset(
    client: httpclient.InferenceServerClient, http: httpx.Client
) -> None:
    outputs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    result = client.infer("simple", simple_inputs(binary=False), outputs=outputs)

    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [DIFFERENCE])

    response = post_json(
        http, "/v2/models/simple/infer", {**GOOD, "outputs": [{"name": "OUTPUT1"}]}
    )
    assert response.content == (
        b'{"model_name":"simple","model_version":"1","outputs":['
        b'{"name":"OUTPUT1","datatype":"INT32","shape":[1,16],'
        b'"data":[-1,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14]}]}'
    )


def test_binary_data_output_parameter(http: httpx.Client) -> None:
    response = post_json(
        http, "/v2/models/simple/infer", {**GOOD, "parameters": {"binary_data_output": True}}
    )

    assert response.status_code == 200
    document, binary = split_binary(response)
    assert document == {
        "model_name": "simple",
        "model_version": "1",
        "outputs": [
            {
                "name": name,
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {"binary_data_size": 64},
            }
            for name in ("OUTPUT0", "OUTPUT1")
        ],
    }
    assert binary == SUM_BYTES + DIFFERENCE_BYTES


def test_per_output_binary_data_overrides_binary_data_output(http: httpx.Client) -> None:
    request = {
        **GOOD,
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": False}},
            {"name": "OUTPUT1", "parameters": {"binary_data": True}},
        ],
        "parameters": {"binary_data_output": True},
    }

    response = post_json(http, "/v2/models/simple/infer", request)

    # Triton 2.51's answer, byte for byte.
    header = (
        b'{"model_name":"simple","model_version":"1","outputs":['
        b'{"name":"OUTPUT0","datatype":"INT32","shape":[1,16],'
        b'"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},'
        b'{"name":"OUTPUT1","datatype":"INT32","shape":[1,16],'
        b'"parameters":{"binary_data_size":64}}]}'
    )
    assert response.headers["inference-header-content-length"] == str(len(header))
    assert response.content == header + DIFFERENCE_BYTES


def test_a_listed_output_without_binary_data_is_json_whatever_binary_data_output(
    http: httpx.Client,
) -> None:
    """binary_data_output decides for the outputs a request does not list; a listed one is
    JSON unless its own binary_data says otherwise (Triton 2.51 answers so)."""
    request = {**GOOD, "outputs": [{"name": "OUTPUT0"}], "parameters": {"binary_data_output": True}}

    response = post_json(http, "/v2/models/simple/infer", request)

    assert response.status_code == 200, response.text
    assert "inference-header-content-length" not in response.headers
    assert response.json()["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": SUM}
    ]


def test_per_output_binary_data_with_tritonclient(client: httpclient.InferenceServerClient) -> None:
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    result = client.infer("simple", simple_inputs(binary=False), outputs=outputs)

    first, second = result.get_response()["outputs"]
    assert first["parameters"] == {"binary_data_size": 64} and "data" not in first
    assert second["data"] == DIFFERENCE and "parameters" not in second
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [SUM])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [DIFFERENCE])


def test_binary_inputs_json_outputs(http: httpx.Client) -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 64},
                }
                for name in ("INPUT0", "INPUT1")
            ]
        }
    )
    body = header + np.array(A, dtype=np.int32).tobytes() + np.array(B, dtype=np.int32).tobytes()

    response = http.post(
        "/v2/models/simple/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )

    assert response.content == TRITON_SIMPLE_BODY


def test_mixed_binary_and_json_inputs(http: httpx.Client) -> None:
    document = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "INT32",
                "parameters": {"binary_data_size": 64},
            },
            GOOD["inputs"][1],
        ]
    }
    header = orjson.dumps(document)
    response = http.post(
        "/v2/models/simple/infer",
        content=header + np.array(A, dtype=np.int32).tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.content == TRITON_SIMPLE_BODY


def test_nested_json_data_is_read_in_row_major_order(http: httpx.Client) -> None:
    request = {
        "inputs": [
            {**GOOD["inputs"][0], "data": [A[:8], A[8:]]},
            {**GOOD["inputs"][1], "data": [B]},
        ]
    }
    assert post_json(http, "/v2/models/simple/infer", request).content == TRITON_SIMPLE_BODY


def test_parameters_are_accepted_and_not_echoed(
    client: httpclient.InferenceServerClient, http: httpx.Client
) -> None:
    result = client.infer(
        "simple",
        simple_inputs(binary=True),
        parameters={"foo": "bar", "count": 3, "ratio": 0.5, "flag": True},
    )
    assert "parameters" not in result.get_response()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [SUM])

    request = {
        "inputs": [{**GOOD["inputs"][0], "parameters": {"foo": "bar"}}, GOOD["inputs"][1]],
        "outputs": [{"name": "OUTPUT0", "parameters": {"foo": "bar"}}],
        "parameters": {"foo": "bar"},
    }
    response = post_json(http, "/v2/models/simple/infer", request)
    assert response.content == (
        b'{"model_name":"simple","model_version":"1","outputs":['
        b'{"name":"OUTPUT0","datatype":"INT32","shape":[1,16],'
        b'"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}'
    )


def test_raw_binary_request(http: httpx.Client) -> None:
    # Inference-Header-Content-Length: 0 makes the whole body the only input's data (as in
    # Triton): a batching model gets a batch of one, and every output is binary.
    data = np.array([[1, 2, 3, 4]], dtype=np.float16)

    response = http.post(
        "/v2/models/half/infer",
        content=data.tobytes(),
        headers={
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": "0",
        },
    )

    assert response.status_code == 200
    document, binary = split_binary(response)
    assert document == {
        "model_name": "half",
        "model_version": "1",
        "outputs": [
            {
                "name": "OUTPUT0",
                "datatype": "FP16",
                "shape": [1, 4],
                "parameters": {"binary_data_size": 8},
            }
        ],
    }
    assert binary == data.tobytes()


def test_raw_binary_request_deduces_the_variable_dimension(
    http: httpx.Client, server: ServerProcess
) -> None:
    # Triton's rule: [1, *dims] for a batching model with the one -1 of dims from the body's
    # size (the body of Triton's L0_http test_raw_binary); no batch dimension is deduced.
    for count in (8, 32):
        data = np.arange(count, dtype=np.float32)
        response = http.post(
            "/v2/models/variable_fp32/infer",
            content=data.tobytes(),
            headers={"Inference-Header-Content-Length": "0"},
        )
        assert response.status_code == 200, response.text
        document, binary = split_binary(response)
        assert document["outputs"][0]["shape"] == [1, count]
        assert binary == data.tobytes()


def test_raw_binary_request_of_a_bytes_input(http: httpx.Client) -> None:
    # One element, the whole body, without a length prefix; a BYTES input whose dims are not
    # [1] is refused with Triton's message.
    response = http.post(
        "/v2/models/one_string/infer",
        content=b"427",
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert response.status_code == 200, response.text
    document, binary = split_binary(response)
    assert document["outputs"][0]["shape"] == [1, 1]
    assert binary == b"\x03\x00\x00\x00427"

    refused = http.post(
        "/v2/models/strings/infer",
        content=b"427",
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert refused.status_code == 400
    assert refused.json() == {
        "error": "[request id: <id_unknown>] For BYTE datatype raw input 'INPUT0', the model "
        "must have input shape [1]"
    }


def test_raw_binary_request_with_two_variable_dimensions_is_refused(
    http: httpx.Client,
) -> None:
    response = http.post(
        "/v2/models/variable_2d/infer",
        content=np.arange(4, dtype=np.float32).tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": "[request id: <id_unknown>] The shape of the raw input 'INPUT0' can not be "
        "deduced because there are more than one variable-sized dimension"
    }


# --- metadata, config, readiness ---------------------------------------------------------------


TRITON_EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


def test_server_metadata_and_health(
    client: httpclient.InferenceServerClient, http: httpx.Client
) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"
    assert metadata["version"]
    # Triton 2.51's extensions, in its order (docs/reference/triton-2.51/http_none.md), then ours.
    assert metadata["extensions"] == [*TRITON_EXTENSIONS, "repository_events"]
    assert client.is_server_live()
    # Triton's strict readiness: the broken model keeps the server from being ready.
    assert not client.is_server_ready()
    assert http.get("/v2/health/live").status_code == 200
    assert http.get("/v2/health/ready").status_code == 400


# Each model's metadata as a client reads it: versions, then (name, datatype, shape) per tensor.
EXPECTED_METADATA: dict[
    str, tuple[list[str], list[tuple[str, str, list[int]]], list[tuple[str, str, list[int]]]]
] = {
    "simple": (
        ["1"],
        [("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])],
        [("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])],
    ),
    "simple_nobatch": (
        ["1"],
        [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])],
        [("OUTPUT0", "INT32", [16]), ("OUTPUT1", "INT32", [16])],
    ),
    "autocomplete": (
        ["1"],
        [("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [-1, 16])],
        [("OUTPUT0", "FP32", [-1, 16]), ("OUTPUT1", "FP32", [-1, 16])],
    ),
    "strings": (["1"], [("INPUT0", "BYTES", [-1, -1])], [("OUTPUT0", "BYTES", [-1, -1])]),
    "half": (["1"], [("INPUT0", "FP16", [-1, 4])], [("OUTPUT0", "FP16", [-1, 4])]),
    "variable_fp32": (["1"], [("INPUT0", "FP32", [-1, -1])], [("OUTPUT0", "FP32", [-1, -1])]),
    "variable_2d": (
        ["1"],
        [("INPUT0", "FP32", [-1, -1, -1])],
        [("OUTPUT0", "FP32", [-1, -1, -1])],
    ),
    "one_string": (["1"], [("INPUT0", "BYTES", [-1, 1])], [("OUTPUT0", "BYTES", [-1, 1])]),
    "versioned": (
        ["1", "3"],
        [("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])],
        [("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])],
    ),
    "two_instances": (
        ["1"],
        [("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])],
        [("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])],
    ),
    "slow_one": (["1"], [("STEPS", "INT64", [1])], [("Y", "FP32", [1])]),
    "slow_two": (["1"], [("STEPS", "INT64", [1])], [("Y", "FP32", [1])]),
    **{
        f"identity_{datatype.lower()}": (
            ["1"],
            [("INPUT0", datatype, [-1, 4])],
            [("OUTPUT0", datatype, [-1, 4])],
        )
        for datatype in WIRE_DATATYPES
    },
}


def test_metadata_of_every_model(client: httpclient.InferenceServerClient) -> None:
    ready = {
        entry["name"]
        for entry in client.get_model_repository_index()
        if entry.get("state") == "READY"
    }
    assert ready == set(EXPECTED_METADATA)
    for name, (versions, inputs, outputs) in EXPECTED_METADATA.items():
        metadata = client.get_model_metadata(name)
        assert metadata["name"] == name
        assert metadata["versions"] == versions
        assert metadata["platform"] == "onnxruntime_onnx"
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == inputs, name
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["outputs"]] == outputs, (
            name
        )


def test_config_is_what_perf_analyzer_and_tritonclient_read(
    client: httpclient.InferenceServerClient,
) -> None:
    for name, (_, inputs, outputs) in EXPECTED_METADATA.items():
        config = client.get_model_config(name)
        assert config["name"] == name
        batching = name not in ("simple_nobatch", "slow_one", "slow_two")
        max_batch_size = config["max_batch_size"]
        assert type(max_batch_size) is int  # a JSON number, not a string (64-bit fields too)
        assert (max_batch_size > 0) == batching, name
        for tensor, (tensor_name, datatype, shape) in zip(config["input"], inputs, strict=True):
            assert tensor["name"] == tensor_name
            assert tensor["data_type"] == (
                "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
            )
            assert all(type(dim) is int for dim in tensor["dims"])
            assert tensor["dims"] == (shape[1:] if max_batch_size > 0 else shape)
        assert [t["name"] for t in config["output"]] == [t[0] for t in outputs]
        assert config["backend"] == "onnxruntime"
        assert config["platform"] == "onnxruntime_onnx"
    assert client.get_model_config("simple")["max_batch_size"] == 8
    assert client.get_model_config("autocomplete")["max_batch_size"] == 4  # auto-completed
    (group,) = client.get_model_config("two_instances")["instance_group"]
    assert group["count"] == 2 and group["kind"] == "KIND_CPU"
    policy = client.get_model_config("versioned")["version_policy"]
    assert policy == {"specific": {"versions": [1, 3]}}


def test_model_readiness(client: httpclient.InferenceServerClient, http: httpx.Client) -> None:
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert client.is_model_ready("versioned")
    assert client.is_model_ready("versioned", "1")
    assert client.is_model_ready("versioned", "3")
    assert not client.is_model_ready("versioned", "2")  # on disk, not in the version policy
    assert not client.is_model_ready("broken")
    assert not client.is_model_ready("nosuch")
    not_ready = http.get("/v2/models/broken/ready")
    assert (not_ready.status_code, not_ready.json()) == (400, {"error": "Model version not ready"})


def test_metadata_of_one_version_lists_that_version_over_grpc_too(server: ServerProcess) -> None:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        for version in ("1", "3"):
            assert grpc.get_model_metadata("versioned", version).versions == [version]
        assert grpc.get_model_metadata("versioned").versions == ["1", "3"]


def test_versions(client: httpclient.InferenceServerClient, http: httpx.Client) -> None:
    # The default is the highest ready version.
    assert (
        client.infer("versioned", simple_inputs(binary=True)).get_response()["model_version"] == "3"
    )
    for version in ("1", "3"):
        result = client.infer("versioned", simple_inputs(binary=True), model_version=version)
        assert result.get_response()["model_version"] == version
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [SUM])
        # the version asked for alone, as Triton 2.51 lists it (every ready one without)
        assert client.get_model_metadata("versioned", version)["versions"] == [version]
    assert client.get_model_metadata("versioned")["versions"] == ["1", "3"]
    for path in ("/v2/models/versioned/versions/2", "/v2/models/versioned/versions/2/config"):
        response = http.get(path)
        assert response.status_code == 404
        assert response.json() == {
            "error": "Request for unknown model: 'versioned' version 2 is not found"
        }
    response = post_json(http, "/v2/models/versioned/versions/2/infer", GOOD)
    assert response.status_code == 404


def test_repository_index(client: httpclient.InferenceServerClient, http: httpx.Client) -> None:
    index = client.get_model_repository_index()
    by_name: dict[str, list[dict[str, Any]]] = {}
    for entry in index:
        by_name.setdefault(entry["name"], []).append(entry)
    assert list(by_name) == sorted(by_name)
    (broken,) = by_name["broken"]
    assert broken["state"] == "UNAVAILABLE"
    assert "model.onnx" in broken["reason"]  # names what failed to load
    assert by_name["versioned"] == [
        {"name": "versioned", "version": "1", "state": "READY"},
        {"name": "versioned", "version": "3", "state": "READY"},
    ]
    assert by_name["simple"] == [{"name": "simple", "version": "1", "state": "READY"}]

    for body in (b"{}", b"", b'{"ready": false}'):
        response = http.post("/v2/repository/index", content=body)
        assert response.status_code == 200
        assert response.json() == index
    ready = http.post("/v2/repository/index", content=b'{"ready": true}').json()
    assert ready == [entry for entry in index if entry["name"] != "broken"]
    assert all(entry["state"] == "READY" for entry in ready)


# --- instances -------------------------------------------------------------------------------


def finishing_order(server: ServerProcess, model: str) -> list[str]:
    """Which of two requests answers first: a long one (about a second of work), and a short one
    (about a tenth of that) sent while the long one runs. The short one is not shorter still:
    the order is seen by two client threads, and on a busy machine the long one's thread may
    be late by milliseconds to note that its answer came."""
    finished: list[str] = []

    def send(label: str, steps: int) -> None:
        client = httpclient.InferenceServerClient(server.url, network_timeout=120)
        tensor = httpclient.InferInput("STEPS", [1], "INT64")
        tensor.set_data_from_numpy(np.array([steps], dtype=np.int64))
        try:
            client.infer(model, [tensor])
        finally:
            client.close()
        finished.append(label)

    long = threading.Thread(target=send, args=("long", LONG_STEPS))
    long.start()
    # The short request is sent once the server holds the long one (routed to the version:
    # queued or executing), not after a guess at how long that takes on a busy machine.
    wait_for(lambda: server.pending(model) >= 1, timeout=60)
    send("short", SHORT_STEPS)
    long.join()
    return finished


LONG_STEPS = 400  # about 1 s here; more where the CPU is busier, which only widens the margin
SHORT_STEPS = 40


def test_two_instances_execute_concurrently(server: ServerProcess) -> None:
    # A behavioural proof that does not rest on a speedup (two threads on this 2-vCPU machine
    # are barely faster than one): with a second instance the short request runs beside the
    # long one and answers first; with one instance it waits in the queue behind it.
    assert finishing_order(server, "slow_two") == ["short", "long"]
    assert finishing_order(server, "slow_one") == ["long", "short"]
