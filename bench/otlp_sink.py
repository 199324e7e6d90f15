"""An OTLP/HTTP receiver that only counts spans, in a process of its own: the collector of
bench/tracing.py, which must not take the interpreter lock of the benchmark's load threads
(a real collector runs elsewhere). Each `POST /v1/traces` is parsed by protobuf's C runtime
and its spans counted; `GET /spans` answers the count so far.

    python bench/otlp_sink.py     # prints the port it listens on, then serves until killed
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_ANSWER = ExportTraceServiceResponse().SerializeToString()


class _Sink(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.spans = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the exporter's session reuses its connection
    server: _Sink

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = ExportTraceServiceRequest.FromString(body)
        count = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self.server.lock:
            self.server.spans += count
        self._answer(_ANSWER, "application/x-protobuf")

    def do_GET(self) -> None:
        with self.server.lock:
            spans = self.server.spans
        self._answer(str(spans).encode(), "text/plain")

    def _answer(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> int:
    sink = _Sink()
    print(sink.server_address[1], flush=True)
    sink.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
