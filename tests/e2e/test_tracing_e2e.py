"""Tracing end to end: a real server exporting OTLP to a test receiver, clients (tritonclient
HTTP and gRPC) sending a W3C traceparent, and the trace settings API changing what is traced."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

PYTHON_MODELS = Path(__file__).resolve().parent.parent / "python_models"
SPAN_KIND_SERVER = 2
STATUS_ERROR = 2
STAGES = {"InferRequest", "router", "queue", "execute", "compute"}
BATCHED = (
    SIMPLE_CONFIG.format(name="batched", max_batch_size=8)
    + "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 60000000 }\n"
)
# Two steps, `simple` then `other`: add_sub of add_sub.
PIPELINE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "simple" input_map [ { key: "INPUT0" value: "A" }, { key: "INPUT1" value: "B" } ]
    output_map [ { key: "OUTPUT0" value: "s" }, { key: "OUTPUT1" value: "d" } ] },
  { model_name: "other" input_map [ { key: "INPUT0" value: "s" }, { key: "INPUT1" value: "d" } ]
    output_map { key: "OUTPUT0" value: "SUM" } }
] }
"""
# Explicit mode loads every model at startup ("*") and lets the tests load and unload.
EXPLICIT = {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit", "TRITONACTOR_LOAD_MODEL": "*"}


def otlp_env(endpoint: str, **extra: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "tritonactor-e2e",
        **EXPLICIT,
        **extra,
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tracing") / "models"
    for name in ("simple", "other", "spare"):
        add_sub_model(root / name / "1" / "model.onnx")
        write_config(root / name, SIMPLE_CONFIG.format(name=name, max_batch_size=8))
    add_sub_model(root / "batched" / "1" / "model.onnx")
    write_config(root / "batched", BATCHED)
    shutil.copytree(PYTHON_MODELS / "trace_context", root / "trace_context")
    write_config(root / "pipeline", PIPELINE)
    (root / "pipeline" / "1").mkdir()
    return root


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    receiving = OtlpReceiver(grpc=True)
    yield receiving
    receiving.close()


@pytest.fixture(scope="module")
def server(
    repo: Path, receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server([repo], tmp_path_factory.mktemp("traced"), otlp_env(receiver.endpoint))
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, timeout=30) as client:
        yield client
        # Every test starts from the server's settings: global ones back to their defaults,
        # no model override left.
        reset = dict.fromkeys(("trace_level", "trace_rate", "trace_count", "log_frequency"))
        for path in ("/v2/trace/setting", *(f"/v2/models/{m}/trace/setting" for m in MODELS)):
            client.post(path, json=reset).raise_for_status()


MODELS = ("simple", "other", "batched", "trace_context")


def new_trace(sampled: bool = True) -> tuple[str, str, dict[str, str]]:
    """A client's trace id, span id and the traceparent header carrying them."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    flags = "01" if sampled else "00"
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-{flags}"}


def http_infer(
    url: str,
    model: str = "simple",
    request_id: str = "",
    headers: dict[str, str] | None = None,
    parameters: dict[str, Any] | None = None,
) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(url)
    try:
        return client.infer(
            model,
            _inputs(httpclient),
            request_id=request_id,
            headers=headers,
            parameters=parameters,
        )
    finally:
        client.close()


def _inputs(module: Any) -> list[Any]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        tensors.append(tensor)
    return tensors


def of_trace(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.trace_id == trace_id]


def wait_for_trace(receiver: OtlpReceiver, trace_id: str, names: set[str]) -> list[ReceivedSpan]:
    spans = receiver.wait_for(lambda s: names <= {x.name for x in of_trace(s, trace_id)})
    return of_trace(spans, trace_id)


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    (found,) = [span for span in spans if span.name == name]
    return found


def request_spans(receiver: OtlpReceiver, prefix: str) -> list[ReceivedSpan]:
    return [
        span
        for span in receiver.spans()
        if span.name == "InferRequest"
        and str(span.attributes.get("triton.request_id", "")).startswith(prefix)
    ]


def marker(url: str, receiver: OtlpReceiver, model: str = "simple") -> None:
    """A request the client samples, waited for: whatever the server exported before it has
    arrived too (the batch processor exports in order)."""
    trace_id, _, headers = new_trace()
    http_infer(url, model, headers=headers)
    wait_for_trace(receiver, trace_id, {"InferRequest"})


# -- one trace per request ----------------------------------------------------------------------


def check_stages(spans: list[ReceivedSpan], client_span: str, model: str) -> ReceivedSpan:
    """The stage spans of one request, each under the right parent; returns its root."""
    root = one(spans, "InferRequest")
    assert root.parent_span_id == client_span
    assert root.kind == SPAN_KIND_SERVER
    assert root.service_name == "tritonactor-e2e"
    for name in ("router", "queue", "execute"):
        stage = one(spans, name)
        assert stage.parent_span_id == root.span_id, name
        assert stage.attributes["triton.model_name"] == model
        assert stage.attributes["triton.model_version"] == "1"
        assert root.start_ns <= stage.start_ns <= stage.end_ns <= root.end_ns
    execute = one(spans, "execute")
    compute = one(spans, "compute")
    assert compute.parent_span_id == execute.span_id
    assert one(spans, "router").end_ns <= one(spans, "queue").start_ns
    assert one(spans, "queue").end_ns <= execute.start_ns <= compute.start_ns
    assert (root.trace_id, root.span_id) in execute.links
    return root


def test_an_http_request_is_one_trace_continuing_the_clients(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    trace_id, span_id, headers = new_trace()
    http_infer(server.url, request_id="http-1", headers=headers)
    spans = wait_for_trace(receiver, trace_id, STAGES)
    root = check_stages(spans, span_id, "simple")
    assert root.attributes == {
        "triton.model_name": "simple",
        "triton.model_version": "1",
        "triton.request_id": "http-1",
        "triton.protocol": "HTTP",
    }
    assert one(spans, "execute").attributes["triton.batch_size"] == 1


def test_a_clients_trace_state_reaches_every_span_of_its_request(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    """The client's tracestate travels with its trace context to the engine's stages (the
    request's context crosses to the engine process as plain values)."""
    trace_id, _, headers = new_trace()
    headers["tracestate"] = "vendor=v1,other=2"
    http_infer(server.url, headers=headers)
    spans = wait_for_trace(receiver, trace_id, STAGES)
    assert {span.name: span.trace_state for span in spans} == dict.fromkeys(
        STAGES, "vendor=v1,other=2"
    )


def test_grpc_unary_and_streamed_requests_continue_the_metadatas_trace(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    trace_id, span_id, headers = new_trace()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.infer("simple", _inputs(grpcclient), request_id="grpc-1", headers=headers)
        spans = wait_for_trace(receiver, trace_id, STAGES)
        root = check_stages(spans, span_id, "simple")
        assert root.attributes["triton.protocol"] == "GRPC"
        assert root.attributes["triton.request_id"] == "grpc-1"

        streamed, stream_span, stream_headers = new_trace()
        answers: list[Any] = []
        client.start_stream(
            lambda result, error: answers.append(error or result), headers=stream_headers
        )
        for index in range(2):
            client.async_stream_infer("simple", _inputs(grpcclient), request_id=f"stream-{index}")
        client.stop_stream()
    finally:
        client.close()
    assert len(answers) == 2 and not any(isinstance(a, Exception) for a in answers)
    spans = receiver.wait_for(
        lambda s: sum(x.name == "InferRequest" for x in of_trace(s, streamed)) == 2
    )
    roots = [s for s in of_trace(spans, streamed) if s.name == "InferRequest"]
    assert {r.attributes["triton.request_id"] for r in roots} == {"stream-0", "stream-1"}
    assert {r.parent_span_id for r in roots} == {stream_span}


def test_a_client_that_does_not_sample_gets_nothing_exported(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    trace_id, _, headers = new_trace(sampled=False)
    http_infer(server.url, headers=headers)
    marker(server.url, receiver)
    assert of_trace(receiver.spans(), trace_id) == []


def test_a_batch_links_every_request_it_carried(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    traces = [new_trace() for _ in range(4)]
    try:
        pending = [
            client.async_infer("batched", _inputs(httpclient), headers=headers)
            for _, _, headers in traces
        ]
        results = [p.get_result() for p in pending]
    finally:
        client.close()
    assert len(results) == 4
    ids = {trace_id for trace_id, _, _ in traces}
    spans = receiver.wait_for(
        lambda s: (
            {x.trace_id for x in s if x.name == "InferRequest"} >= ids
            and sum(len(x.links) for x in s if x.name == "execute" and x.trace_id in ids) >= 4
        )
    )
    roots = {
        (s.trace_id, s.span_id) for s in spans if s.name == "InferRequest" and s.trace_id in ids
    }
    batches = [s for s in spans if s.name == "execute" and s.trace_id in ids]
    # Every request rode in a batch that links to it; with a preferred size of 4 and a long
    # queue delay they rode together.
    assert {link for batch in batches for link in batch.links} == roots
    biggest = max(batches, key=lambda batch: len(batch.links))
    assert len(biggest.links) >= 2
    assert biggest.attributes["triton.batch_size"] == len(biggest.links)
    assert biggest.attributes["triton.model_name"] == "batched"
    # The requests of other traces link back to the batch from their own span.
    others = [
        s
        for s in spans
        if s.name == "InferRequest"
        and (s.trace_id, s.span_id) in biggest.links
        and s.trace_id != biggest.trace_id
    ]
    assert others and all((biggest.trace_id, biggest.span_id) in s.links for s in others)


def test_a_python_model_reads_the_trace_context_and_bls_joins_the_trace(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    trace_id, _, headers = new_trace()
    headers["tracestate"] = "vendor=v1"
    result = http_infer(
        server.url, "trace_context", headers=headers, parameters={"bls_model": "simple"}
    )
    context = json.loads(result.as_numpy("CONTEXT")[0])
    assert context["traceparent"].split("-")[1] == trace_id
    assert context["traceparent"].endswith("-01")  # sampled, as the engine continued it
    assert context["tracestate"] == "vendor=v1"
    spans = wait_for_trace(receiver, trace_id, STAGES)
    root = [s for s in spans if s.name == "InferRequest"]
    assert [r.attributes["triton.model_name"] for r in root] == ["trace_context"]
    # The model sees its request's span; its BLS call's stages nest under it.
    assert context["traceparent"].split("-")[2] == root[0].span_id
    bls = [s for s in spans if s.attributes.get("triton.model_name") == "simple"]
    assert {s.name for s in bls} >= {"router", "queue", "execute"}
    assert one(bls, "router").parent_span_id == root[0].span_id
    # Not traced: no context.
    _, _, unsampled = new_trace(sampled=False)
    result = http_infer(server.url, "trace_context", headers=unsampled)
    assert result.as_numpy("CONTEXT")[0] == b""


def test_load_and_unload_are_traced(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    http.post("/v2/repository/models/spare/unload").raise_for_status()
    http.post("/v2/repository/models/spare/load").raise_for_status()
    assert http.post("/v2/repository/models/nosuch/load").status_code == 500

    def operations(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [
            s
            for s in spans
            if s.name.startswith("model ")
            and s.attributes.get("tritonactor.source") == "api"
            and s.attributes["triton.model_name"] in ("spare", "nosuch")
        ]

    spans = operations(receiver.wait_for(lambda s: len(operations(s)) >= 3))
    unload, load, failed = sorted(spans, key=lambda s: s.start_ns)
    assert unload.name == "model unload" and load.name == "model load"
    for span, events in ((unload, "ModelUnloaded"), (load, "ModelLoaded")):
        assert span.parent_span_id == ""
        assert span.attributes["tritonactor.outcome"] == "done"
        assert span.attributes["tritonactor.versions"] == [1]
        assert events in span.events
    assert failed.attributes["triton.model_name"] == "nosuch"
    assert failed.attributes["tritonactor.outcome"] == "failed"
    assert failed.status_code == STATUS_ERROR
    assert "failed to poll from model repository" in failed.status_message


# -- the trace settings API ---------------------------------------------------------------------


def test_trace_settings_read_and_validate(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    assert "trace" in http.get("/v2").json()["extensions"]
    # Triton's answer in its OpenTelemetry mode, in its order: where spans go, how batched.
    answer = http.get("/v2/trace/setting").json()
    assert answer == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
        "url": receiver.endpoint + "/v1/traces",
        "bsp_schedule_delay": "50",
        "bsp_max_export_batch_size": "512",
        "bsp_max_queue_size": "65536",
    }
    assert list(answer)[:5] == ["trace_level", "trace_rate", "trace_count", "trace_mode", "url"]
    refused = http.post("/v2/trace/setting", json={"trace_rate": "0"})
    assert refused.status_code == 400
    assert refused.json() == {
        "error": "Attempting to set invalid trace setting :sample rate must be non-zero"
    }
    refused = http.post("/v2/trace/setting", json={"trace_file": None})
    assert refused.status_code == 501
    assert http.get("/v2/trace/setting").json() == answer
    assert http.post("/v2/trace/setting").json()["trace_rate"] == "1"  # no body: no change
    assert http.post("/v2/trace/setting", content=b"[1]").status_code == 400
    unknown = http.get("/v2/models/nosuch/trace/setting")
    assert unknown.status_code == 400
    assert unknown.json() == {"error": "Request for unknown model : nosuch"}


@pytest.mark.skipif(
    os.environ.get("TA_TEST_WORKERS", "1") not in ("0", "1"),
    reason="each front-end process counts trace_rate and trace_count for the requests it "
    "receives (docs/decisions.md)",
)
def test_trace_rate_and_count_pick_what_is_traced(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    assert http.post("/v2/trace/setting", json={"trace_rate": "2"}).json()["trace_rate"] == "2"
    for index in range(4):
        http_infer(server.url, request_id=f"rate-{index}")
    marker(server.url, receiver)
    traced = sorted(s.attributes["triton.request_id"] for s in request_spans(receiver, "rate-"))
    assert traced == ["rate-1", "rate-3"]

    http.post("/v2/trace/setting", json={"trace_rate": "1", "trace_count": "1"})
    for index in range(3):
        http_infer(server.url, request_id=f"count-{index}")
    assert http.get("/v2/trace/setting").json()["trace_count"] == "0"
    http.post("/v2/trace/setting", json={"trace_count": None})
    marker(server.url, receiver)
    traced = [s.attributes["triton.request_id"] for s in request_spans(receiver, "count-")]
    assert traced == ["count-0"]


def test_trace_level_off_silences_even_a_sampled_client(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    http.post("/v2/trace/setting", json={"trace_level": ["OFF"]}).raise_for_status()
    silenced, _, headers = new_trace()
    http_infer(server.url, headers=headers)
    http.post("/v2/trace/setting", json={"trace_level": None}).raise_for_status()
    marker(server.url, receiver)
    assert of_trace(receiver.spans(), silenced) == []


def test_a_model_override_applies_to_its_model_until_cleared(
    server: ServerProcess, receiver: OtlpReceiver, http: httpx.Client
) -> None:
    answer = http.post("/v2/models/simple/trace/setting", json={"trace_level": ["OFF"]}).json()
    assert answer["trace_level"] == ["OFF"]
    assert http.get("/v2/trace/setting").json()["trace_level"] == ["TIMESTAMPS"]
    silenced, _, headers = new_trace()
    http_infer(server.url, "simple", headers=headers)
    marker(server.url, receiver, model="other")
    assert of_trace(receiver.spans(), silenced) == []

    cleared = http.post("/v2/models/simple/trace/setting", json={"trace_level": None}).json()
    assert cleared["trace_level"] == ["TIMESTAMPS"]
    traced, _, headers = new_trace()
    http_infer(server.url, "simple", headers=headers)
    wait_for_trace(receiver, traced, STAGES)


def test_the_grpc_trace_setting_rpc(server: ServerProcess, http: httpx.Client) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        updated = client.update_trace_settings(
            model_name="other", settings={"trace_rate": "3"}, as_json=True
        )
        assert updated["settings"]["trace_rate"] == {"value": ["3"]}
        assert updated["settings"]["trace_level"] == {"value": ["TIMESTAMPS"]}
        assert http.get("/v2/models/other/trace/setting").json()["trace_rate"] == "3"
        cleared = client.update_trace_settings(
            model_name="other", settings={"trace_rate": None}, as_json=True
        )
        assert cleared["settings"]["trace_rate"] == {"value": ["1"]}
        assert client.get_trace_settings(as_json=True)["settings"]["trace_mode"] == {
            "value": ["opentelemetry"]
        }
        with pytest.raises(Exception, match="Expect only one trace level 'OFF' is specified"):
            client.update_trace_settings(settings={"trace_level": ["OFF", "TIMESTAMPS"]})
    finally:
        client.close()


# -- other configurations -----------------------------------------------------------------------


def test_otlp_over_grpc(
    repo: Path, receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> None:
    env = otlp_env(
        receiver.grpc_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        TRITONACTOR_LOAD_MODEL="simple",
    )
    process = start_server([repo], tmp_path_factory.mktemp("grpc_otlp"), env)
    try:
        trace_id, span_id, headers = new_trace()
        http_infer(process.url, headers=headers)
        check_stages(wait_for_trace(receiver, trace_id, STAGES), span_id, "simple")
    finally:
        process.stop()


def test_nothing_is_exported_when_tracing_is_off(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    silent = OtlpReceiver()
    # An endpoint, but no exporter: OTEL_TRACES_EXPORTER=none turns tracing off.
    env = otlp_env(silent.endpoint, OTEL_TRACES_EXPORTER="none", TRITONACTOR_LOAD_MODEL="simple")
    process = start_server([repo], tmp_path_factory.mktemp("untraced"), env)
    try:
        _, _, headers = new_trace()
        http_infer(process.url, headers=headers)
        with httpx.Client(base_url=process.base) as http:
            http.post("/v2/repository/models/other/load").raise_for_status()
            http.post("/v2/repository/models/other/unload").raise_for_status()
            settings = http.get("/v2/trace/setting")
            assert settings.status_code == 200
            assert settings.json()["trace_level"] == ["OFF"]
    finally:
        # A traced server sends every span it made before its stop returns (tested below).
        process.stop()
        silent.close()
    assert silent.requests == 0 and silent.spans() == []


def test_the_console_exporter_prints_on_the_servers_output(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """OTEL_TRACES_EXPORTER=console: the exporter process prints the spans as JSON on the
    output it shares with the server; spans wait up to 10 minutes in the exporter process
    here, so they are on it because the server, stopping, closed its socket and waited for
    them to be printed."""
    env = {
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
        "TRITONACTOR_LOAD_MODEL": "simple",
    }
    process = start_server([repo], tmp_path_factory.mktemp("console"), env)
    try:
        trace_id, _, headers = new_trace()
        http_infer(process.url, headers=headers)
    finally:
        assert process.stop() == 0
    output = process.log()
    for name in STAGES:
        assert f'"name": "{name}"' in output, output[-3000:]
    assert f'"trace_id": "0x{trace_id}"' in output


def test_ensemble_steps_nest_under_the_ensemble_request(
    server: ServerProcess, receiver: OtlpReceiver
) -> None:
    trace_id, _, headers = new_trace()
    client = httpclient.InferenceServerClient(server.url)
    inputs = []
    for name in ("A", "B"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)
    result = client.infer("pipeline", inputs, headers=headers)
    np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * np.arange(16).reshape(1, 16))
    spans = receiver.wait_for(
        lambda s: (
            len([x for x in of_trace(s, trace_id) if x.name == "compute"]) >= 2
            and any(x.name == "InferRequest" for x in of_trace(s, trace_id))
        )
    )
    spans = of_trace(spans, trace_id)
    (top,) = [span for span in spans if span.name == "InferRequest"]
    assert top.attributes["triton.model_name"] == "pipeline"
    # Each step's router, queue and execute spans are children of the ensemble's request span.
    for name in ("router", "queue", "execute"):
        steps = {
            span.attributes["triton.model_name"]
            for span in spans
            if span.name == name and span.parent_span_id == top.span_id
        }
        assert steps >= {"simple", "other"}, name
    by_id = {span.span_id: span for span in spans}
    for span in spans:  # one connected trace, rooted at the ensemble's request
        node = span
        while node.parent_span_id in by_id:
            node = by_id[node.parent_span_id]
        assert node is top, span.name
