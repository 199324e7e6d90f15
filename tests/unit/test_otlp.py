"""The direct OTLP encoder (observability/otlp.py) against the SDK's: the same spans must
give the same ExportTraceServiceRequest, whatever they hold; and the exporters built on it
deliver to a real OTLP receiver over HTTP and gRPC."""

from __future__ import annotations

import base64
import http.server
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from tests.otlp_receiver import OtlpReceiver
from tritonactor.core.errors import invalid_arg
from tritonactor.core.types import InferenceRequest, Tensor
from tritonactor.observability.exporters import build_exporters
from tritonactor.observability.otlp import (
    OtlpGrpcExporter,
    OtlpHttpExporter,
    SettledSession,
    _Encoder,
    encode_export_request,
)
from tritonactor.observability.trace_settings import TraceSettings
from tritonactor.observability.tracing import BatchTrace, Tracing

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C


def same_as_sdk(spans: list[ReadableSpan], encoder: _Encoder | None = None) -> bytes:
    """The direct encoding of `spans`, checked to decode to what the SDK's encoder builds."""
    encoded = encode_export_request(spans, encoder)
    assert encoded is not None
    assert ExportTraceServiceRequest.FromString(encoded) == encode_spans(spans)
    return encoded


def request_spans(count: int = 3, tracing: Tracing | None = None) -> list[ReadableSpan]:
    """What the server's own tracing classes export for `count` requests: the front end's
    span, router, queue, execute and compute; one request failing, one continuing a
    client's trace; then a control-plane operation. With `tracing`, through that one too."""
    memory = InMemorySpanExporter()
    if tracing is None:
        tracing = Tracing(
            TracerProvider(shutdown_on_exit=False), TraceSettings(level=("TIMESTAMPS",), rate=1)
        )
    tracing.add_processor(SimpleSpanProcessor(memory))
    data = np.zeros((1, 16), np.int32)
    for index in range(count):
        carrier = None
        if index == 1:
            carrier = {"traceparent": f"00-{TRACE_ID:032x}-b7ad6b7169203331-01"}
            carrier["tracestate"] = "vendor=value,other=1"
        trace = tracing.start_request("simple", "1" if index else "", carrier, "HTTP")
        assert trace is not None
        request = InferenceRequest(
            "simple", id=f"r{index}", inputs=[Tensor("INPUT0", "INT32", (1, 16), data)]
        )
        request.trace = trace
        trace.describe(request)
        request.resolved_version = 1
        trace.routed(request, time.time_ns())
        BatchTrace([request], 1).end(time.perf_counter_ns(), time.perf_counter_ns())
        trace.end(invalid_arg("bad input") if index == 2 else None)
    with tracing.operation("load", {"triton.model_name": "simple", "retries": 2}) as span:
        span.add_event("loaded", {"seconds": 0.5, "ok": True})
    return list(memory.get_finished_spans())


def test_the_servers_request_spans_encode_as_the_sdk_does() -> None:
    spans = request_spans()
    assert {span.name for span in spans} >= {"InferRequest", "router", "queue", "execute"}
    assert any(span.parent is not None and span.parent.is_remote for span in spans)
    assert any(span.status.status_code is StatusCode.ERROR for span in spans)
    assert any(span.links for span in spans)
    assert any(span.get_span_context().trace_state for span in spans)
    same_as_sdk(spans)


def test_the_encoder_keeps_its_cache_true_across_batches() -> None:
    """What it remembers between batches (a resource's, a scope's, attributes' bytes) never
    stands in for something else: resources and scopes change, attribute values of equal
    value but another type (True, 1, 1.0) stay apart, and the caches' bound is crossed."""
    encoder = _Encoder()
    context = SpanContext(TRACE_ID, 1, False, TraceFlags(1))
    for round_ in range(3):
        # The same attributes on the resource, the scope, spans, events and links: each is
        # written with its own field number.
        resource = Resource({"service.name": f"s{round_}", "round": round_, "v": True})
        scope = InstrumentationScope(f"scope{round_}", f"{round_}.0", "https://s", {"v": 1})
        spans = [
            ReadableSpan(
                f"name{index % 7}",
                context,
                resource=resource,
                attributes={"v": value, "i": index + round_ * 5000},
                events=[Event("e", {"v": value}, 5)],
                links=[Link(context, {"v": value})],
                instrumentation_scope=scope,
                start_time=index,
                end_time=index + 1,
            )
            for index, value in enumerate([True, 1, 1.0, "1", False, 0, 0.0, ""] * 700)
        ]
        same_as_sdk(spans, encoder)


def test_values_equal_but_encoded_apart_are_not_taken_for_each_other() -> None:
    """-0.0 == 0.0 (and protobuf's message equality agrees), but the bytes differ; a long
    string is written, not remembered."""
    encoder = _Encoder()
    context = SpanContext(TRACE_ID, 5, False)
    for value in (0.0, -0.0, 0.0, "x" * 1000, -0.0):
        spans = [ReadableSpan("s", context, attributes={"v": value})]
        decoded = ExportTraceServiceRequest.FromString(same_as_sdk(spans, encoder))
        written = decoded.resource_spans[0].scope_spans[0].spans[0].attributes[0].value
        if isinstance(value, float):
            assert math.copysign(1, written.double_value) == math.copysign(1, value)
        else:
            assert written.string_value == value
    assert all(len(str(key[3])) <= 128 for key in encoder._attributes)


def test_spans_of_two_resources_and_scopes_group_as_the_sdk_groups_them() -> None:
    first, second = Resource({"service.name": "a"}), Resource({"service.name": "b"})
    scopes = [InstrumentationScope("x"), None, InstrumentationScope("y", "2")]
    context = SpanContext(TRACE_ID, 7, False)
    spans = [
        ReadableSpan(f"s{i}", context, resource=resource, instrumentation_scope=scope)
        for i, (resource, scope) in enumerate(
            (resource, scope) for resource in (first, second, first) for scope in scopes
        )
    ]
    same_as_sdk(spans)


_scalar = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.floats(allow_nan=False),
)
_value = st.one_of(_scalar, st.lists(_scalar, max_size=4).map(tuple), st.binary(max_size=8))
_attributes = st.dictionaries(st.text(max_size=10), _value, max_size=5)
_ids = st.integers(min_value=1, max_value=(1 << 64) - 1)


@st.composite
def _spans(draw: st.DrawFn) -> ReadableSpan:
    trace_id = draw(st.integers(min_value=1, max_value=(1 << 128) - 1))
    state = draw(st.lists(st.sampled_from(["a=1", "b=x", "vendor=v2"]), max_size=2, unique=True))
    context = SpanContext(trace_id, draw(_ids), False, TraceFlags(1), TraceState.from_header(state))
    parent = draw(
        st.none() | st.builds(lambda i, r: SpanContext(trace_id, i, r), _ids, st.booleans())
    )
    links = draw(
        st.lists(
            st.builds(
                lambda t, s, r, a: Link(SpanContext(t, s, r), a),
                st.integers(min_value=1, max_value=(1 << 128) - 1),
                _ids,
                st.booleans(),
                st.none() | _attributes,
            ),
            max_size=2,
        )
    )
    events = draw(
        st.lists(
            st.builds(lambda n, a, t: Event(n, a, t), st.text(max_size=8), _attributes, _ids),
            max_size=2,
        )
    )
    status = draw(
        st.none()
        | st.builds(Status, st.sampled_from(list(StatusCode)), st.none() | st.text(max_size=8))
    )
    start = draw(st.none() | st.integers(min_value=0, max_value=(1 << 64) - 1))
    return ReadableSpan(
        draw(st.text(max_size=12)),
        context,
        parent=parent,
        resource=Resource(draw(_attributes)),
        attributes=draw(_attributes),
        events=events,
        links=links,
        kind=draw(st.sampled_from(list(SpanKind))),
        status=status if status is not None else Status(StatusCode.UNSET),
        start_time=start,
        end_time=draw(st.none() | st.integers(min_value=0, max_value=(1 << 64) - 1)),
        instrumentation_scope=draw(
            st.none()
            | st.builds(
                InstrumentationScope,
                st.text(max_size=6),
                st.none() | st.text(max_size=4),
                st.none() | st.text(max_size=4),
                st.none() | _attributes,
            )
        ),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_spans(), min_size=1, max_size=4))
def test_any_span_encodes_as_the_sdk_encodes_it(spans: list[ReadableSpan]) -> None:
    same_as_sdk(spans)


@pytest.mark.parametrize(
    "value",
    [1 << 63, -(1 << 63) - 1, object(), {"nested": "mapping"}, math.nan],
    ids=["above int64", "below int64", "an object", "a mapping", "nan"],
)
def test_what_it_does_not_write_goes_to_the_sdks_encoder(value: Any) -> None:
    """Values outside what OTLP's AnyValue holds are the SDK encoder's to judge (it logs and
    drops such an attribute); values it does hold are written as the SDK writes them."""
    span = ReadableSpan("s", SpanContext(TRACE_ID, 3, False), attributes={"v": value, "w": 1})
    encoded = encode_export_request([span])
    if isinstance(value, int) or type(value) is object:
        assert encoded is None
    else:
        assert encoded is not None
        decoded = ExportTraceServiceRequest.FromString(encoded)
        expected = encode_spans([span])
        if isinstance(value, float):  # NaN != NaN: compare the bytes
            assert decoded.SerializeToString() == expected.SerializeToString()
        else:
            assert decoded == expected


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver(grpc=True)
    yield receiver


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_exporters_deliver_what_the_sdk_would(receiver: OtlpReceiver, protocol: str) -> None:
    """Through a real OTLP receiver: the server's spans, and a batch the direct encoder
    leaves to the SDK's (an integer beyond int64: the SDK drops that attribute), arrive
    as the SDK's encoder makes them."""
    if protocol == "http":
        exporter: Any = OtlpHttpExporter(endpoint=f"{receiver.endpoint}/v1/traces")
    else:
        exporter = OtlpGrpcExporter(endpoint=receiver.grpc_endpoint, insecure=True)
    spans = request_spans()
    odd = [ReadableSpan("odd", SpanContext(TRACE_ID, 9, False), attributes={"n": 1 << 70, "k": 1})]
    try:
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        assert exporter.export(odd) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    received = receiver.wait_for(lambda got: len(got) == len(spans) + 1)
    assert receiver.messages == [encode_spans(spans), encode_spans(odd)]
    assert [span.attributes for span in received if span.name == "odd"] == [{"k": 1}]


def test_a_shut_down_exporter_refuses_as_the_sdks_does(receiver: OtlpReceiver) -> None:
    exporter = OtlpHttpExporter(endpoint=f"{receiver.endpoint}/v1/traces")
    exporter.shutdown()
    assert exporter.export(request_spans(1)) is SpanExportResult.FAILURE
    assert receiver.messages == []


@pytest.mark.parametrize(
    ("protocol", "kind"), [("http/protobuf", OtlpHttpExporter), ("grpc", OtlpGrpcExporter)]
)
def test_the_server_exports_with_the_direct_encoder(protocol: str, kind: type) -> None:
    exporters = build_exporters(("otlp", "console"), protocol)
    assert [type(exporter) for exporter in exporters] == [kind, ConsoleSpanExporter]
    for exporter in exporters:
        exporter.shutdown()


# -- the HTTP exporter's session ------------------------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers any POST with an empty OTLP response, keeping each request's Authorization."""

    seen: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Recorder.seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def environ_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs requests reads the environment's proxy settings for, as it reads them."""
    reads: list[str] = []
    original = requests.sessions.get_environ_proxies

    def counted(url: str, no_proxy: Any = None) -> dict[str, str]:
        reads.append(url)
        return original(url, no_proxy=no_proxy)

    monkeypatch.setattr(requests.sessions, "get_environ_proxies", counted)
    return reads


def test_the_session_reads_the_environment_once_and_as_requests_does(
    monkeypatch: pytest.MonkeyPatch, environ_reads: list[str]
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "collector.internal")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca.pem")
    session = SettledSession()
    for url in ("http://collector.internal:4318/v1/traces", "https://far.example/v1/traces"):
        expected = requests.Session().merge_environment_settings(url, {}, None, True, None)
        for _ in range(3):
            assert session.merge_environment_settings(url, {}, None, True, None) == expected
    assert expected["proxies"]["https"] == "http://proxy.example:3128"
    assert expected["verify"] == "/etc/ssl/certs/ca.pem"
    # Twice by the plain sessions (once each), twice by the settled one: once per URL.
    assert len(environ_reads) == 4


def test_the_exporter_posts_the_credentials_requests_would(
    recorder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """.netrc's credentials for the collector, read at every post (a rewritten file counts at
    once); without any for it, none, or those of the endpoint's URL."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login tracer password s3cret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    span = request_spans(1)[:1]
    exporter = OtlpHttpExporter(endpoint=recorder)
    assert exporter.export(span) is SpanExportResult.SUCCESS
    netrc.write_text("machine 127.0.0.1 login tracer password rotated\n")
    assert exporter.export(span) is SpanExportResult.SUCCESS
    netrc.write_text("machine elsewhere login other password x\n")
    assert exporter.export(span) is SpanExportResult.SUCCESS
    in_url = OtlpHttpExporter(endpoint=recorder.replace("http://", "http://u:p@"))
    assert in_url.export(span) is SpanExportResult.SUCCESS

    def basic(credentials: bytes) -> str:
        return "Basic " + base64.b64encode(credentials).decode()

    assert _Recorder.seen == [
        basic(b"tracer:s3cret"),
        basic(b"tracer:rotated"),
        None,
        basic(b"u:p"),
    ]


def test_the_exporter_reads_the_environment_once_unless_a_provider_gives_its_session(
    recorder: str, monkeypatch: pytest.MonkeyPatch, environ_reads: list[str]
) -> None:
    """Posts read the environment's proxy settings once; with a credential provider named,
    the exporter posts with the provider's session, which the SDK loads (here a provider no
    package offers: the SDK's own error says so)."""
    exporter = OtlpHttpExporter(endpoint=recorder)
    span = request_spans(1)[:1]
    for _ in range(3):
        assert exporter.export(span) is SpanExportResult.SUCCESS
    assert environ_reads == [recorder]
    monkeypatch.setenv("OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER", "nobody")
    with pytest.raises(RuntimeError, match="'nobody' not found"):
        OtlpHttpExporter(endpoint=recorder)
