"""The statistics extension end to end: a real server, tritonclient over HTTP and gRPC.

Only requests that reach a model count: a request refused by validation is not in its statistics
(as in Triton, whose validation runs before the scheduler). A model that fails at execution
counts as failed. Shapes and error messages are compared with what Triton 2.51 answers
(docs/reference/triton-2.51/http_none.md, grpc_none.md)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model, reshape_model
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

ORACLE = Path(__file__).parents[2] / "docs" / "reference" / "triton-2.51" / "http_none.md"

# Y = reshape(X, [-1, 4]): a request whose row is not 4 wide passes validation (dims [-1]) and
# fails inside onnxruntime, at execution.
RESHAPE_CONFIG = """
name: "reshape"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def stats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("stats") / "models"
    reshape_model(repo / "reshape" / "1" / "model.onnx")
    write_config(repo / "reshape", RESHAPE_CONFIG)
    for version in (1, 2):
        add_sub_model(repo / "simple" / str(version) / "model.onnx")
    write_config(
        repo / "simple",
        SIMPLE_CONFIG.format(name="simple", max_batch_size=8) + "version_policy { all { } }\n",
    )
    process = start_server([repo], tmp_path_factory.mktemp("stats_server"))
    yield process
    process.stop()


@pytest.fixture
def http(stats_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stats_server.base, timeout=30) as client:
        yield client


@pytest.fixture
def http_client(stats_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(stats_server.url)
    yield client
    client.close()


@pytest.fixture
def grpc_client(stats_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(stats_server.grpc_url) as client:
        yield client


def oracle_simple_stats() -> dict[str, Any]:
    """Triton's answer to GET /v2/models/simple/stats before any inference."""
    lines = ORACLE.read_text().splitlines()
    start = lines.index("#### GET /v2/models/simple/stats")
    body = next(line for line in lines[start:] if line.startswith('{"model_stats"'))
    return json.loads(body)


def reshape_inputs(module: Any, rows: int, width: int, wire: str = "FP32") -> list[Any]:
    tensor = module.InferInput("X", [rows, width], wire)
    dtype = np.float64 if wire == "FP64" else np.float32
    tensor.set_data_from_numpy(np.ones((rows, width), dtype=dtype))
    return [tensor]


# -- the shape of the answers -------------------------------------------------------------------


def test_an_unused_model_answers_exactly_what_triton_answers(http: httpx.Client) -> None:
    response = http.get("/v2/models/simple/versions/1/stats")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    # Same keys, in the same order, and the same zeros.
    ours = json.dumps(response.json())
    assert ours == json.dumps(oracle_simple_stats())


def test_every_ready_version_by_name_then_version(
    http: httpx.Client, grpc_client: grpcclient.InferenceServerClient
) -> None:
    everything = http.get("/v2/models/stats").json()["model_stats"]
    expected = [("reshape", "1"), ("simple", "1"), ("simple", "2")]
    assert [(s["name"], s["version"]) for s in everything] == expected
    simple = http.get("/v2/models/simple/stats").json()["model_stats"]
    assert [(s["name"], s["version"]) for s in simple] == expected[1:]
    answer = grpc_client.get_inference_statistics("")
    assert [(s.name, s.version) for s in answer.model_stats] == expected
    answer = grpc_client.get_inference_statistics("simple", "2")
    assert [(s.name, s.version) for s in answer.model_stats] == [("simple", "2")]


def test_the_extension_is_announced(http: httpx.Client) -> None:
    assert "statistics" in http.get("/v2").json()["extensions"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v2/models/nosuch/stats", "requested model 'nosuch' is not available"),
        ("/v2/models/nosuch/versions/1/stats", "requested model 'nosuch' is not available"),
        (
            "/v2/models/simple/versions/7/stats",
            "requested model version is not available for model 'simple'",
        ),
    ],
)
def test_http_unknown_model_or_version(http: httpx.Client, path: str, message: str) -> None:
    response = http.get(path)
    assert response.status_code == 400
    assert response.json() == {"error": message}


def test_grpc_unknown_model_or_version(grpc_client: grpcclient.InferenceServerClient) -> None:
    for name, version, message in (
        ("nosuch", "", "requested model 'nosuch' is not available"),
        ("simple", "7", "requested model version is not available for model 'simple'"),
    ):
        with pytest.raises(InferenceServerException) as caught:
            grpc_client.get_inference_statistics(name, version)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert caught.value.message() == message


HUGE = "99999999999999999999"
STOL = (
    f"failed to get model version from specified version string '{HUGE}' (details: stol), "
    "version should be an integral value > 0"
)


def test_a_version_past_int64_in_tritons_words(
    http: httpx.Client, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """Triton reads a version with `stol`: one past int64 is refused, in its words, wherever a
    version is given (seen on Triton 2.51); so is a negative one over gRPC."""
    for path in (
        f"/v2/models/simple/versions/{HUGE}/stats",
        f"/v2/models/simple/versions/{HUGE}/ready",
    ):
        response = http.get(path)
        assert response.status_code == 400
        assert response.json() == {"error": STOL}
    for call, version, message in (
        (grpc_client.get_inference_statistics, HUGE, STOL),
        (grpc_client.is_model_ready, HUGE, STOL),
        (
            grpc_client.is_model_ready,
            "-1",
            "invalid model version specified '-1' , version should be an integral value > 0",
        ),
    ):
        with pytest.raises(InferenceServerException) as caught:
            call("simple", version)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert caught.value.message() == message


def test_http_client_unknown_model(http_client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="requested model 'nosuch' is not available"):
        http_client.get_inference_statistics("nosuch")


# -- what is counted ----------------------------------------------------------------------------


def _duration(stats: dict[str, Any], name: str) -> tuple[int, int]:
    entry = stats["inference_stats"][name]
    return int(entry.get("count", 0)), int(entry.get("ns", 0))


def _batch_counts(stats: dict[str, Any]) -> dict[int, int]:
    return {
        int(b["batch_size"]): int(b["compute_infer"].get("count", 0))
        for b in stats.get("batch_stats", [])
    }


def _exercise(module: Any, client: Any, read: Callable[[], dict[str, Any]]) -> None:
    """3 requests of batch 1, 1 of batch 2, 2 that fail in the model and 1 refused by
    validation; the statistics move by exactly that."""
    before = read()
    for _ in range(3):
        client.infer("reshape", reshape_inputs(module, 1, 4))
    result = client.infer("reshape", reshape_inputs(module, 2, 4))
    assert result.as_numpy("Y").shape == (2, 4)
    for _ in range(2):
        with pytest.raises(InferenceServerException):
            client.infer("reshape", reshape_inputs(module, 1, 3))  # fails in onnxruntime
    with pytest.raises(InferenceServerException, match="data-type"):
        client.infer("reshape", reshape_inputs(module, 1, 4, "FP64"))  # validation: not counted
    after = read()

    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 5
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) == 4
    for name, moved in (("success", 4), ("fail", 2), ("queue", 4), ("compute_infer", 4)):
        count, ns = _duration(after, name)
        count_before, ns_before = _duration(before, name)
        assert count - count_before == moved, name
        assert ns > ns_before, name
    for name in ("compute_input", "compute_output"):
        assert _duration(after, name)[0] - _duration(before, name)[0] == 4
    assert _duration(after, "cache_hit") == _duration(after, "cache_miss") == (0, 0)
    counts, counts_before = _batch_counts(after), _batch_counts(before)
    assert counts[1] - counts_before.get(1, 0) == 3
    assert counts[2] - counts_before.get(2, 0) == 1
    assert int(after["last_inference"]) > 1_600_000_000_000  # ms since the epoch


def test_http_counts_what_ran(
    http_client: httpclient.InferenceServerClient, http: httpx.Client
) -> None:
    def read() -> dict[str, Any]:
        [stats] = http_client.get_inference_statistics("reshape", "1")["model_stats"]
        return stats

    _exercise(httpclient, http_client, read)
    # As Triton's JSON: 64-bit numbers as numbers, not strings.
    [raw] = http.get("/v2/models/reshape/stats").json()["model_stats"]
    assert isinstance(raw["inference_count"], int)
    assert isinstance(raw["inference_stats"]["success"]["ns"], int)


def test_grpc_counts_what_ran(grpc_client: grpcclient.InferenceServerClient) -> None:
    def read() -> dict[str, Any]:
        answer = grpc_client.get_inference_statistics("reshape", as_json=True)
        [stats] = answer["model_stats"]
        return stats

    _exercise(grpcclient, grpc_client, read)
