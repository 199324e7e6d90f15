"""The generate extension through the real server: `/generate` and `/generate_stream` read by
real HTTP clients (httpx, and requests streaming the Server-Sent Events as they come), for a
decoupled model, a plain one and a batching one; and the errors, framed as Triton 2.51 frames
them (the status and bodies here are what it answered to the same requests)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests

from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)
EVENT_STREAM = "text/event-stream; charset=utf-8"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("generate")
    repo = root / "models"
    models = (
        "generator",
        "add_sub",
        "class_batched",
        "class_scores",
        "cancellable",
        "cancel_probe",
    )
    for name in models:
        shutil.copytree(MODELS / name, repo / name)
    process = start_server([repo], root)
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, timeout=30) as client:
        yield client


def post(http: httpx.Client, model: str, body: Any, route: str = "generate") -> httpx.Response:
    content = body if isinstance(body, str | bytes) else json.dumps(body)
    return http.post(f"/v2/models/{model}/{route}", content=content)


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """The SSE events of a whole body, checking Triton's framing: `data: {...}` + blank line."""
    text = response.text
    assert text == "" or text.endswith("\n\n")
    chunks = [chunk for chunk in text.split("\n\n") if chunk]
    assert all(chunk.startswith("data: ") for chunk in chunks)
    return [json.loads(chunk[len("data: ") :]) for chunk in chunks]


def generated(index: int, text: str = "hi", parameters: str = "{}") -> dict[str, Any]:
    return {
        "ids_seen": [],
        "index": index,
        "model_name": "generator",
        "model_version": "1",
        "parameters_seen": parameters,
        "text_output": f"{text} {index}",
    }


# --- /generate ---------------------------------------------------------------------------------


def test_generate_one_response_with_sorted_keys(http: httpx.Client) -> None:
    response = post(http, "generator", {"text_input": "hi", "ids": [1, 2, 3]})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.text == (
        '{"ids_seen":[1,2,3],"index":0,"model_name":"generator","model_version":"1",'
        '"parameters_seen":"{}","text_output":"hi 0"}'
    )


def test_generate_on_a_plain_and_a_batching_model(http: httpx.Client) -> None:
    body = {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}
    response = post(http, "add_sub/versions/1", body)
    assert response.status_code == 200
    assert response.json() == {
        "OUTPUT0": [2.0, 3.0, 4.0, 5.0],
        "OUTPUT1": [0.0, 1.0, 2.0, 3.0],
        "model_name": "add_sub",
        "model_version": "1",
    }
    # The batch dimension and the fixed ones take their share of the elements given.
    response = post(http, "class_batched", {"SCORES": [1, 2, 3, 4], "GRID": [1, 2, 3, 4, 5, 6]})
    assert response.status_code == 200
    assert response.json()["GRID_OUT"] == [1, 2, 3, 4, 5, 6]


def test_keys_that_are_not_inputs_are_parameters(http: httpx.Client) -> None:
    body = {
        "text_input": "hi",
        "id": "7",
        "temp": 0.5,
        "n": 2,
        "flag": True,
        "parameters": {"p1": "x", "count": 1},  # `count` is an input of the model
    }
    response = post(http, "generator", body)
    assert response.status_code == 200
    answer = response.json()
    assert answer["id"] == "7"
    seen = json.loads(answer["parameters_seen"])
    assert seen == {"id": "7", "temp": 0.5, "n": 2, "flag": True, "p1": "x"}


@pytest.mark.parametrize("count", [0, 2])
def test_generate_on_other_than_one_response_is_200_with_an_error(
    http: httpx.Client, count: int
) -> None:
    response = post(http, "generator", {"text_input": "hi", "count": count})
    assert response.status_code == 200  # as Triton: the status of the first response
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": ONE_RESPONSE}


def test_generate_when_the_only_response_is_an_error(http: httpx.Client) -> None:
    response = post(http, "generator", {"text_input": "hi", "count": 2, "fail_after": 0})
    assert response.status_code == 400  # as Triton: any error the model answers is 400
    assert response.json() == {"error": "generator failed after 0 responses"}


# --- /generate_stream --------------------------------------------------------------------------


def test_generate_stream_read_as_it_comes(server: ServerProcess) -> None:
    url = f"{server.base}/v2/models/generator/generate_stream"
    body = {"text_input": ["hi"], "count": 3}
    with requests.post(url, json=body, stream=True, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == EVENT_STREAM
        lines = [line for line in response.iter_lines() if line]
    assert [json.loads(line[len(b"data: ") :]) for line in lines] == [
        generated(0),
        generated(1),
        generated(2),
    ]


def test_generate_stream_with_no_response_is_an_empty_200(http: httpx.Client) -> None:
    response = post(http, "generator", {"text_input": "hi", "count": 0}, "generate_stream")
    assert (response.status_code, response.headers["content-type"]) == (200, EVENT_STREAM)
    assert response.text == ""


def test_generate_stream_on_a_plain_model(http: httpx.Client) -> None:
    body = {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}
    response = post(http, "add_sub", body, "generate_stream")
    assert (response.status_code, response.headers["content-type"]) == (200, EVENT_STREAM)
    assert [e["OUTPUT0"] for e in events(response)] == [[2.0, 3.0, 4.0, 5.0]]


def test_an_error_mid_stream_is_one_more_event(http: httpx.Client) -> None:
    body = {"text_input": "hi", "count": 3, "fail_after": 1}
    response = post(http, "generator", body, "generate_stream")
    assert response.status_code == 200  # the first response succeeded
    assert events(response) == [
        generated(0, parameters='{"fail_after":1}'),
        {"error": "generator failed after 1 responses"},
    ]


def test_an_error_first_sets_the_status_of_the_stream(http: httpx.Client) -> None:
    body = {"text_input": "hi", "count": 3, "fail_after": 0}
    response = post(http, "generator", body, "generate_stream")
    assert (response.status_code, response.headers["content-type"]) == (400, EVENT_STREAM)
    assert events(response) == [{"error": "generator failed after 0 responses"}]


def test_a_client_that_leaves_mid_stream_leaves_the_server_serving(server: ServerProcess) -> None:
    url = f"{server.base}/v2/models/generator/generate_stream"
    with requests.post(url, json={"text_input": "x", "count": 50}, stream=True, timeout=30) as r:
        assert (r.status_code, r.headers["content-type"]) == (200, EVENT_STREAM)
        first = next(line for line in r.iter_lines() if line)
        assert json.loads(first[len(b"data: ") :])["index"] == 0
    with httpx.Client(base_url=server.base, timeout=30) as http:
        assert http.get("/v2/health/live").status_code == 200
        assert post(http, "generator", {"text_input": "hi"}).json() == generated(0)


def test_a_client_that_leaves_cancels_its_request(server: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "ended"
    url = f"{server.base}/v2/models/cancellable/generate_stream"
    # The model answers every 20 ms for up to 30 s unless it sees its request cancelled.
    body = {"INTERVAL_MS": 20, "marker": str(marker), "limit_s": 30}
    with requests.post(url, json=body, stream=True, timeout=30) as response:
        assert (response.status_code, response.headers["content-type"]) == (200, EVENT_STREAM)
        first = next(line for line in response.iter_lines() if line)
        assert json.loads(first[len(b"data: ") :])["INDEX"] == 0
    deadline = time.monotonic() + 60  # a bound on a hang, not a timing
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never saw its request cancelled"
        time.sleep(0.02)
    assert marker.read_text() == "cancelled"


FP16_OUT = (
    "sending FP16 data via JSON is not supported. Please use the binary data format for output"
)


def test_an_output_json_cannot_carry_is_400_on_both_endpoints(http: httpx.Client) -> None:
    # class_scores answers an (empty) FP16 output beside the FP32 one: as Triton, 400.
    response = post(http, "class_scores", {"FP32": [0.1, 0.2]})
    assert (response.status_code, response.headers["content-type"]) == (400, "application/json")
    assert response.json() == {"error": FP16_OUT}
    response = post(http, "class_scores", {"FP32": [0.1, 0.2]}, "generate_stream")
    assert (response.status_code, response.headers["content-type"]) == (400, EVENT_STREAM)
    assert events(response) == [{"error": FP16_OUT}]


def wait_for(path: Path) -> str:
    """The text of `path` once the model has written it (the model's own limit ends the wait
    when nothing cancels it)."""
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"the model never wrote {path.name}"
        time.sleep(0.01)
    return path.read_text()


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_a_client_that_leaves_before_the_answer_cancels_its_request(
    server: ServerProcess, tmp_path: Path, route: str
) -> None:
    started, marker = tmp_path / "started", tmp_path / "ended"
    body = json.dumps({"X": 1, "started": str(started), "marker": str(marker), "limit_s": 20})
    head = (
        f"POST /v2/models/cancel_probe/{route} HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.http_port)) as client:
        client.sendall(head.encode() + body.encode())
        assert wait_for(started) == "started"
    # The connection is closed while the model runs: it sees its request cancelled.
    assert wait_for(marker) == "cancelled"
    with httpx.Client(base_url=server.base, timeout=30) as http:
        assert http.get("/v2/health/live").status_code == 200


# --- errors: before the request runs, JSON on both endpoints -------------------------------------

ERRORS = [
    ("nope", {"text_input": "hi"}, 404, "Request for unknown model: 'nope' is not found"),
    (
        "generator/versions/9",
        {"text_input": "hi"},
        404,
        "Request for unknown model: 'generator' version 9 is not found",
    ),
    ("generator", "[1, 2]", 500, "attempt to get members for non-object"),
    (
        "generator",
        {"text_input": "hi", "x": [1]},
        400,
        "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'.",
    ),
    (
        "generator",
        {"text_input": "hi", "id": 5},
        500,
        "Unable to parse 'id': attempt to access JSON non-string as string",
    ),
    (
        "generator",
        {"text_input": 1},
        500,
        "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
    ),
    (
        "generator",
        {"text_input": "hi", "count": "3"},
        500,
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
    ),
    (
        "generator",
        {"text_input": "hi", "greedy": 1},
        500,
        "Unable to parse 'data': attempt to access JSON non-boolean as boolean",
    ),
    (
        "add_sub",
        {"INPUT0": ["x", 1, 2, 3], "INPUT1": [1, 2, 3, 4]},
        500,
        "Unable to parse 'data': attempt to access JSON non-number as double",
    ),
    (
        "generator",
        {"text_input": ["a", "b"]},
        400,
        "The schema can not convert input 'text_input' to tensor with proper shape",
    ),
    (
        "generator",
        '{"text_input": "a", "text_input": "b"}',
        400,
        "[request id: <id_unknown>] input 'text_input' already exists in request",
    ),
    (
        "generator",
        {"text_input": "hi", "parameters": 1},
        500,
        "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as "
        "object",
    ),
    (
        "generator",
        {"text_input": "hi", "parameters": {"a": {"b": 1}}},
        400,
        "Converting keyword: 'parameters': parameter 'a' has invalid type. It should be either "
        "'int', 'bool', or 'string'.",
    ),
    (
        "generator",
        {"count": 1},
        400,
        "[request id: <id_unknown>] model 'generator' got input(s) ['count'], but missing "
        "required input(s) ['text_input']. Please provide all required input(s).",
    ),
    (
        "generator",
        {"text_input": "hi", "count": 2**40},
        400,
        "'data' of input 'count' holds a value outside the INT32 range [-2147483648, 2147483647]",
    ),
]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(("model", "body", "status", "message"), ERRORS)
def test_errors_before_the_request_runs(
    http: httpx.Client, route: str, model: str, body: Any, status: int, message: str
) -> None:
    response = post(http, model, body, route)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": message}


def test_bad_json_and_content_encoding(http: httpx.Client) -> None:
    response = post(http, "generator", "{not json")
    assert response.status_code == 500
    assert response.json()["error"].startswith("failed to parse the request JSON buffer: ")
    for coding in ("gzip", "IDENTITY"):  # (Triton reads `identity` as it is written)
        response = http.post(
            "/v2/models/generator/generate",
            content=b"{}",
            headers={"Content-Encoding": coding},
        )
        assert response.status_code == 400
        assert response.json() == {
            "error": "Unsupported content-encoding, only 'identity' is supported."
        }
    assert http.get("/v2/models/generator/generate").status_code == 405
