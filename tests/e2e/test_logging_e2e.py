"""The logging extension against a real server: GET/POST /v2/logging and the gRPC LogSettings
RPC, and JSON request log lines that carry the client's trace id."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model
from tests.otlp_receiver import OtlpReceiver
from tests.server_process import ServerProcess, start_server, wait_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver()
    yield running
    running.close()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("logging") / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))
    env = {
        "TRITONACTOR_LOG_FORMAT": "json",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    process = start_server([repo], tmp_path_factory.mktemp("logging-server"), env)
    yield process
    process.stop()


def infer(server: ServerProcess, headers: dict[str, str] | None = None) -> None:
    client = httpclient.InferenceServerClient(server.url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    client.infer("simple", inputs, headers=headers)


def request_lines(server: ServerProcess) -> list[dict[str, object]]:
    lines = []
    for line in server.log().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("logger") == "tritonactor.requests":
                lines.append(record)
    return lines


def test_settings_over_http_and_grpc(server: ServerProcess) -> None:
    settings = httpx.get(f"{server.base}/v2/logging").json()
    assert settings["log_verbose_level"] == 0 and settings["log_info"] is True
    answer = httpx.post(f"{server.base}/v2/logging", json={"log_verbose_level": 2}).json()
    assert answer["log_verbose_level"] == 2
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc.get_log_settings(as_json=True)["settings"]["log_verbose_level"]["uint32_param"] == 2
    grpc.update_log_settings({"log_verbose_level": 0})
    assert httpx.get(f"{server.base}/v2/logging").json()["log_verbose_level"] == 0
    bad = httpx.post(f"{server.base}/v2/logging", json={"log_verbose_level": -1})
    assert bad.status_code == 400
    assert httpx.get(f"{server.base}/v2/logging").json()["log_verbose_level"] == 0  # unchanged
    assert "logging" in httpx.get(f"{server.base}/v2").json()["extensions"]


def test_request_lines_are_json_with_the_trace_id(server: ServerProcess) -> None:
    infer(server)  # verbose off: no request line
    httpx.post(f"{server.base}/v2/logging", json={"log_verbose_level": 1})
    try:
        infer(server, {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"})
        # The line may come after the answer: wait for the traced request's own line.
        wait_for(
            lambda: any(line.get("trace_id") == TRACE_ID for line in request_lines(server)),
            timeout=60,
            describe=lambda: f"no request line with the trace id:\n{server.log()}",
        )
    finally:
        httpx.post(f"{server.base}/v2/logging", json={"log_verbose_level": 0})
    # Only that one: the earlier request, sent with verbose off, logged none (not even late).
    [line] = request_lines(server)
    assert line["trace_id"] == TRACE_ID
    assert line["model"] == "simple" and line["status"] == 200
    assert line["message"] == "HTTP POST /v2/models/simple/infer"
