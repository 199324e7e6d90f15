"""What reaches a model besides its tensors, and who may call what, through the real server and
tritonclient: request parameters (reserved `triton_` keys, wire options kept from the model),
headers forwarded as parameters, Triton's restricted APIs, and the `triton_grpc_error` stream
mode. Triton 2.51 answered the same requests with the messages checked here."""

from __future__ import annotations

import json
import queue
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
RESERVED_HTTP = (
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
    "specified."
)
RESERVED_GRPC = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
    "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
)


def repository(root: Path) -> Path:
    repo = root / "models"
    for name in ("introspect", "bls_introspect", "faulty", "sequence_accumulate"):
        shutil.copytree(MODELS / name, repo / name)
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    (repo / "simple" / "config.pbtxt").write_text(
        'name: "simple"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    )
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("options")
    process = start_server(
        [repository(root)],
        root,
        {
            # Triton's L0_parameters patterns: case-insensitive by default, `(?-i)` turns it off.
            "TRITONACTOR_HTTP_HEADER_FORWARD_PATTERN": "MY_HEADER.*",
            "TRITONACTOR_GRPC_HEADER_FORWARD_PATTERN": "(?-i)my_header.*",
        },
    )
    yield process
    process.stop()


def introspect_inputs(module: Any) -> list[Any]:
    data = module.InferInput("INPUT0", [2], "FP32")
    data.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    return [data]


def seen_by_model(result: Any) -> dict[str, Any]:
    """What the introspect model saw of its request."""
    return json.loads(result.as_numpy("REQUEST")[0])


def inference_count(http: httpx.Client, model: str) -> int:
    stats = http.get(f"/v2/models/{model}/stats").json()
    return sum(entry["inference_stats"]["success"]["count"] for entry in stats["model_stats"])


# --- parameters ---------------------------------------------------------------------------------


def test_model_parameters_leave_out_what_the_server_acts_on(server: ServerProcess) -> None:
    parameters = {"custom": "x", "count": 3, "ratio": 0.5, "flag": True}
    # Sequence controls, priority and timeout are the server's (tritonclient refuses them in
    # `parameters`, so they are sent as the wire has them).
    scheduling = {"priority": 0, "timeout": 0}
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        "outputs": [{"name": "REQUEST", "parameters": {"binary_data": False}}],
        "parameters": {**parameters, **scheduling},
    }
    with httpx.Client(base_url=server.base) as http:
        response = http.post("/v2/models/introspect/infer", json=body)
    assert response.status_code == 200, response.text
    seen = json.loads(response.json()["outputs"][0]["data"][0])
    assert seen["parameters"] == parameters
    # The text the model reads is compact JSON, as Triton's server writes it.
    assert seen["parameters_text"] == json.dumps(parameters, separators=(",", ":"))

    assert seen["timeout"] == 0

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    over_grpc = grpc.infer(
        "introspect", introspect_inputs(grpcclient), parameters=parameters, timeout=10_000_000
    )
    grpc.close()
    assert seen_by_model(over_grpc)["parameters"] == parameters
    # The request's timeout is the model's `request.timeout()` (microseconds), as Triton's.
    assert seen_by_model(over_grpc)["timeout"] == 10_000_000


def test_a_bls_calls_parameters_are_the_called_models_alone(server: ServerProcess) -> None:
    """As Triton 2.51 (checked against it): names the server acts on in a BLS call's
    `parameters` are plain parameters of the called model; the call's own `correlation_id`,
    `flags` and `timeout` are what it sees of those (the parameters acted as controls, and the
    timeout was dropped)."""
    call = {
        "parameters": {"sequence_id": 5, "sequence_start": True, "priority": 1, "x": "y"},
        "timeout": 1_000_000,
        "correlation_id": 7,
    }
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        "outputs": [{"name": "REQUEST", "parameters": {"binary_data": False}}],
        "parameters": {"call": json.dumps(call)},
    }
    with httpx.Client(base_url=server.base) as http:
        response = http.post("/v2/models/bls_introspect/infer", json=body)
    assert response.status_code == 200, response.text
    seen = json.loads(response.json()["outputs"][0]["data"][0])
    assert seen["parameters"] == call["parameters"]
    assert (seen["correlation_id"], seen["flags"], seen["timeout"]) == (7, 0, 1_000_000)


def test_binary_data_output_is_a_wire_option_the_model_never_sees(server: ServerProcess) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        "outputs": [{"name": "REQUEST", "parameters": {"binary_data": False}}],
        "parameters": {"binary_data_output": True, "kept": 1},
    }
    with httpx.Client(base_url=server.base) as http:
        response = http.post("/v2/models/introspect/infer", json=body)

    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert json.loads(output["data"][0])["parameters"] == {"kept": 1}


@pytest.mark.parametrize("key", ["triton_", "triton_custom", "triton_enable_empty_final_response"])
def test_triton_prefixed_parameters_are_refused_over_http(server: ServerProcess, key: str) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        "parameters": {key: True},
    }
    with httpx.Client(base_url=server.base) as http:
        before = inference_count(http, "introspect")
        response = http.post("/v2/models/introspect/infer", json=body)
        assert response.status_code == 400
        assert response.json() == {"error": RESERVED_HTTP}
        # Refused before the model: it ran nothing.
        assert inference_count(http, "introspect") == before


def test_triton_prefixed_parameters_are_refused_over_grpc(server: ServerProcess) -> None:
    # tritonclient refuses reserved keys itself, so the request is built by hand.
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        def request(key: str) -> Any:
            message = service_pb2.ModelInferRequest(model_name="introspect")
            message.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
            message.raw_input_contents.append(np.ones(1, np.float32).tobytes())
            message.parameters[key].bool_param = True
            return message

        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request("triton_custom"))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == RESERVED_GRPC

        # The one allowed key is the front end's: the model does not see it.
        answer = stub.ModelInfer(request("triton_enable_empty_final_response"))
        names = [output.name for output in answer.outputs]
        raw = answer.raw_output_contents[names.index("REQUEST")]
        assert json.loads(raw[4:])["parameters"] == {}


# --- header forwarding ----------------------------------------------------------------------


def test_http_headers_matching_the_pattern_become_parameters(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    headers = {
        "my_header_1": "my_value_1",
        "My_Header_2": 'a "quoted" value\\ ',
        "header_3": "not forwarded",
    }

    result = http.infer(
        "introspect", introspect_inputs(httpclient), parameters={"key1": 1}, headers=headers
    )

    # Names arrive lower-cased over HTTP (Triton keeps the client's case), and values without
    # the whitespace around them (RFC 9110: it is not part of the value; Triton keeps it).
    assert seen_by_model(result)["parameters"] == {
        "key1": 1,
        "my_header_1": "my_value_1",
        "my_header_2": 'a "quoted" value\\',
    }


def test_grpc_metadata_matching_the_pattern_become_parameters(server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    # gRPC metadata values keep their whitespace, as in Triton.
    headers = {"my_header_1": "v1 ", "other": "o"}

    unary = grpc.infer("introspect", introspect_inputs(grpcclient), headers=headers)
    answers: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(lambda result, error: answers.put((result, error)), headers=headers)
    grpc.async_stream_infer("introspect", introspect_inputs(grpcclient))
    streamed, error = answers.get(timeout=60)
    grpc.stop_stream()
    grpc.close()

    assert error is None
    for result in (unary, streamed):
        assert seen_by_model(result)["parameters"] == {"my_header_1": "v1 "}


def test_a_header_does_not_replace_a_parameter_of_the_request(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)

    result = http.infer(
        "introspect",
        introspect_inputs(httpclient),
        parameters={"my_header_1": "from the request"},
        headers={"my_header_1": "from a header"},
    )

    assert seen_by_model(result)["parameters"] == {"my_header_1": "from the request"}


# --- the triton_grpc_error stream mode -----------------------------------------------------------


def faulty_input(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [tensor]


def test_without_triton_grpc_error_a_failure_leaves_the_stream_open(
    server: ServerProcess,
) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(lambda result, error: answers.put((result, error)))
    for value in (5, 1, 7):
        grpc.async_stream_infer("faulty", faulty_input(value))
        answers_now = answers.get(timeout=60)
        if value == 1:
            assert answers_now[0] is None
            assert "one is not allowed" in str(answers_now[1])
        else:
            assert answers_now[1] is None
            assert answers_now[0].as_numpy("OUTPUT0").tolist() == [value]
    grpc.stop_stream()
    grpc.close()


def test_triton_grpc_error_ends_the_stream_with_the_status(server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(
        partial(lambda q, result, error: q.put((result, error)), answers),
        headers={"triton_grpc_error": "true"},
    )
    grpc.async_stream_infer("faulty", faulty_input(5))
    result, error = answers.get(timeout=60)
    assert error is None and result.as_numpy("OUTPUT0").tolist() == [5]

    # As in Triton 2.51, a request refused before it reaches its model (here: a shape the
    # model does not take) is an error message in the stream, which goes on.
    wrong_shape = grpcclient.InferInput("INPUT0", [2], "INT32")
    wrong_shape.set_data_from_numpy(np.array([5, 6], dtype=np.int32))
    grpc.async_stream_infer("faulty", [wrong_shape])
    result, error = answers.get(timeout=60)
    assert result is None and "unexpected shape for input 'INPUT0'" in str(error)
    grpc.async_stream_infer("faulty", faulty_input(7))
    result, error = answers.get(timeout=60)
    assert error is None and result.as_numpy("OUTPUT0").tolist() == [7]
    # So is one its scheduler refuses as it arrives (here: a sequence's first request
    # without START; it ended the stream before).
    accumulated = grpcclient.InferInput("INPUT", [1], "INT32")
    accumulated.set_data_from_numpy(np.array([3], dtype=np.int32))
    grpc.async_stream_infer("sequence_accumulate", [accumulated], sequence_id=99)
    result, error = answers.get(timeout=60)
    assert result is None and "must specify the START flag" in str(error)
    grpc.async_stream_infer("faulty", faulty_input(8))
    result, error = answers.get(timeout=60)
    assert error is None and result.as_numpy("OUTPUT0").tolist() == [8]

    # The model's own error ends the stream with its status.
    grpc.async_stream_infer("faulty", faulty_input(1))
    result, error = answers.get(timeout=60)
    assert result is None
    assert str(error.status()) == "StatusCode.INVALID_ARGUMENT"
    assert "one is not allowed" in error.message()

    # The stream is over: the client refuses to send on it.
    with pytest.raises(InferenceServerException, match="no longer in valid state"):
        grpc.async_stream_infer("faulty", faulty_input(5))
    grpc.stop_stream()
    grpc.close()


# --- restricted APIs ---------------------------------------------------------------------------

ADMIN = {"admin-key": "admin-value"}
INFER = {"infer-key": "infer-value"}


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("restricted")
    restrictions = json.dumps(
        [
            "model-repository,health:admin-key=admin-value",
            "inference,metadata:infer-key=infer-value",
        ]
    )
    process = start_server(
        [repository(root)],
        root,
        {
            "TRITONACTOR_HTTP_RESTRICTED_API": restrictions,
            "TRITONACTOR_GRPC_RESTRICTED_PROTOCOL": restrictions,
        },
        probe_headers=ADMIN,
    )
    yield process
    process.stop()


def test_http_restricted_categories_need_their_header(restricted: ServerProcess) -> None:
    with httpx.Client(base_url=restricted.base) as http:
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
        for method, path, headers, expected in (
            ("GET", "/v2/health/ready", INFER, "admin-key"),
            ("GET", "/v2/models/simple/ready", {}, "admin-key"),  # model ready is "health"
            ("POST", "/v2/repository/index", INFER, "admin-key"),
            ("GET", "/v2/repository/events", {}, "admin-key"),
            ("GET", "/v2", ADMIN, "infer-key"),
            ("GET", "/v2/models/simple", {}, "infer-key"),
            ("POST", "/v2/models/introspect/infer", {"infer-key": "wrong"}, "infer-key"),
        ):
            response = http.request(method, path, headers=headers, json=body)
            assert response.status_code == 403, path
            assert response.json() == {
                "error": f"This API is restricted, expecting header '{expected}'"
            }

        assert http.get("/v2/health/ready", headers=ADMIN).status_code == 200
        assert http.post("/v2/repository/index", headers=ADMIN).status_code == 200
        assert http.get("/v2", headers=INFER).json()["name"] == "triton"
        answer = http.post("/v2/models/introspect/infer", headers=INFER, json=body)
        assert answer.status_code == 200
        # Categories nobody restricted stay open; metrics are never restricted.
        assert http.get("/v2/models/simple/config").status_code == 200
        assert http.get("/v2/models/simple/stats").status_code == 200
        assert http.get("/metrics").status_code == 200


def test_http_restriction_checks_come_before_the_operation(restricted: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(restricted.url)
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        client.unload_model("simple", headers=INFER)
    # With the header the call reaches the operation, which mode none refuses (Triton's order).
    with pytest.raises(InferenceServerException, match="explicit model load / unload"):
        client.unload_model("simple", headers=ADMIN)


def test_grpc_restricted_protocols_need_their_prefixed_header(restricted: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    prefixed = {f"triton-grpc-protocol-{k}": v for k, v in ADMIN.items()}
    prefixed_infer = {f"triton-grpc-protocol-{k}": v for k, v in INFER.items()}

    with pytest.raises(InferenceServerException) as refused:
        client.is_server_live(headers=prefixed_infer)
    assert str(refused.value.status()) == "StatusCode.UNAVAILABLE"
    assert refused.value.message() == (
        "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    )
    assert client.is_server_live(headers=prefixed)
    # The unprefixed HTTP header does not open the gRPC protocol.
    with pytest.raises(InferenceServerException, match="This protocol is restricted"):
        client.is_server_live(headers=ADMIN)
    with pytest.raises(InferenceServerException, match="This protocol is restricted"):
        client.infer("introspect", introspect_inputs(grpcclient))
    assert (
        seen_by_model(
            client.infer("introspect", introspect_inputs(grpcclient), headers=prefixed_infer)
        )["parameters"]
        == {}
    )
    # Open categories: statistics and model config.
    assert client.get_inference_statistics("simple") is not None
    assert client.get_model_config("simple") is not None
    client.close()


def test_grpc_restricted_stream_ends_at_once(restricted: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)), headers={"x": "1"})
    result, error = answers.get(timeout=60)
    assert result is None
    assert "This protocol is restricted" in str(error)
    client.stop_stream()
    client.close()
