"""A test OTLP receiver: what an OpenTelemetry collector would get from the server.

It listens for OTLP over HTTP (`POST /v1/traces`, a protobuf ExportTraceServiceRequest, maybe
gzipped) and, on demand, OTLP over gRPC (the TraceService Export RPC), in threads of its own,
and keeps every span it receives, decoded with `opentelemetry-proto`."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: ids in hex, as a traceparent writes them ("" for no parent)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    status_code: int
    status_message: str
    events: list[str] = field(default_factory=list)
    service_name: str = ""
    trace_state: str = ""


class OtlpReceiver:
    def __init__(self, grpc: bool = False) -> None:
        self._lock = threading.Condition()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        # Every export request as it arrived (decoded), in order.
        self.messages: list[trace_service_pb2.ExportTraceServiceRequest] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver.take(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        self._grpc: Any = None
        self.grpc_endpoint = ""
        if grpc:
            import grpc as grpcio

            class Service(trace_service_pb2_grpc.TraceServiceServicer):
                def Export(self, request: Any, context: Any) -> Any:
                    receiver.take(request)
                    return trace_service_pb2.ExportTraceServiceResponse()

            self._grpc = grpcio.server(futures.ThreadPoolExecutor(max_workers=2))
            trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._grpc)
            port = self._grpc.add_insecure_port("127.0.0.1:0")
            self._grpc.start()
            self.grpc_endpoint = f"http://127.0.0.1:{port}"

    @property
    def endpoint(self) -> str:
        """The base URL for OTEL_EXPORTER_OTLP_ENDPOINT (the exporter adds /v1/traces)."""
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes=_attributes(span.attributes),
                            links=[
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ],
                            status_code=span.status.code,
                            status_message=span.status.message,
                            events=[event.name for event in span.events],
                            service_name=str(resource.get("service.name", "")),
                            trace_state=span.trace_state,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.messages.append(request)
            self._spans.extend(spans)
            self._lock.notify_all()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 60
    ) -> list[ReceivedSpan]:
        """The spans received, once `done(spans)` holds (AssertionError after `timeout`)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not done(self._spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({span.name for span in self._spans})
                    raise AssertionError(
                        f"the receiver did not get what was expected in {timeout}s; it has "
                        f"{len(self._spans)} spans: {names}"
                    )
                self._lock.wait(left)
            return list(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        if self._grpc is not None:
            self._grpc.stop(None)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {pair.key: _value(pair.value) for pair in value.kvlist_value.values}
    return getattr(value, kind) if kind else None
