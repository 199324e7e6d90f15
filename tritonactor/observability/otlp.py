"""Finished spans written straight to OTLP protobuf bytes, for the OTLP exporters.

The SDK's exporters build a protobuf object per span, per attribute and per value before
serializing them: ~16 µs a span, ~80 µs for the five spans of a traced request, which made
tracing every request cost 30 % of the throughput. `encode_export_request` writes the same
`ExportTraceServiceRequest` (opentelemetry/proto/collector/trace/v1) field by field, keeping
the bytes of what repeats (a resource, a scope, a span name, a model's attributes), in a few
µs a span. What it does not know how to write (an attribute value of another type, an integer
beyond int64) makes it return None, and the exporter encodes that batch the SDK's way: the
bytes are the SDK's either way (tests/unit/test_otlp.py parses both and compares them).

`OtlpHttpExporter` and `OtlpGrpcExporter` are the SDK's OTLP exporters (their settings, OTEL_*
variables, retries, TLS and compression) with this encoding. The exporter process
(span_exporter.py) hands `OtlpHttpExporter.export_records` its records as they came, without
making SDK spans of them first: the same bytes, for a third of the work.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import requests
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as _GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as _HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind

__all__ = ["OtlpGrpcExporter", "OtlpHttpExporter", "encode_export_request"]

log = logging.getLogger(__name__)

_INT64 = 1 << 63
_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_FIXED32 = struct.Struct("<I")
_SMALL = [bytes((n,)) for n in range(128)]

# OTLP's SpanKind: UNSPECIFIED 0, INTERNAL 1, SERVER 2, CLIENT 3, PRODUCER 4, CONSUMER 5.
_KIND = {
    SpanKind.INTERNAL: b"\x30\x01",
    SpanKind.SERVER: b"\x30\x02",
    SpanKind.CLIENT: b"\x30\x03",
    SpanKind.PRODUCER: b"\x30\x04",
    SpanKind.CONSUMER: b"\x30\x05",
}
# The same by SpanKind's value (a record's kind).
_KIND_OF = {kind.value: field for kind, field in _KIND.items()}
_ERROR = 2  # StatusCode.ERROR: the only status with a description
# SpanFlags: the context's is-remote bit is known (0x100), and set (0x200) for a remote parent.
_FLAGS_LOCAL = _FIXED32.pack(0x100)
_FLAGS_REMOTE = _FIXED32.pack(0x300)
_SPAN_FLAGS_TAG = b"\x85\x01"  # field 16, fixed32
_LINK_FLAGS_TAG = b"\x35"  # field 6, fixed32

# The bytes of attributes and names seen before (a model's name, a span's name): bounded, in
# entries and in the length of a string value kept.
_CACHE_LIMIT = 4096
_CACHED_TEXT = 128


class _Unencodable(Exception):
    """A value this encoder does not write: the SDK's encoder takes the batch."""


def _varint(value: int) -> bytes:
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, its length, its bytes."""
    return tag + _varint(len(payload)) + payload


def _string(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode()) if text else b""


def _value(value: Any) -> bytes:
    """An AnyValue's fields (a oneof: written even when zero, so that it is set)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise _Unencodable(value)
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(item)) for item in value))
    if isinstance(value, Mapping):
        pairs = b"".join(_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items())
        return _field(b"\x32", pairs)
    raise _Unencodable(value)


def _key_value(key: str, value: Any) -> bytes:
    return _string(b"\x0a", key) + _field(b"\x12", _value(value))


class _Encoder:
    """Keeps the bytes of what repeats between spans and batches."""

    def __init__(self) -> None:
        # (the field's tag, key, the value's type, value) -> the field's bytes.
        self._attributes: dict[tuple[bytes, str, type, Any], bytes] = {}
        self._names: dict[str, bytes] = {}
        # (resource, scope) by their ids -> the objects themselves and their bytes.
        self._headers: dict[tuple[int, int], tuple[Any, Any, bytes, bytes]] = {}

    def attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
        if not attributes:
            return b""
        cache = self._attributes
        pieces = []
        for key, value in attributes.items():
            # Strings (not long ones: a client's request id may be as long as it likes),
            # integers and booleans; not floats (-0.0 == 0.0, but they encode differently).
            if isinstance(value, int) or (isinstance(value, str) and len(value) <= _CACHED_TEXT):
                # The type is part of the key: True == 1, but each encodes differently.
                known = (tag, key, type(value), value)
                cached = cache.get(known)
                if cached is None:
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    cached = cache[known] = _field(tag, _key_value(key, value))
                pieces.append(cached)
            else:
                pieces.append(_field(tag, _key_value(key, value)))
        return b"".join(pieces)

    def name(self, name: str) -> bytes:
        cached = self._names.get(name)
        if cached is None:
            if len(self._names) >= _CACHE_LIMIT:
                self._names.clear()
            cached = self._names[name] = _string(b"\x2a", name)
        return cached

    def span(self, span: ReadableSpan) -> bytes:
        context = span.get_span_context()
        parent = span.parent
        trace_state = context.trace_state
        pieces = [
            b"\x0a\x10",
            context.trace_id.to_bytes(16, "big"),
            b"\x12\x08",
            context.span_id.to_bytes(8, "big"),
        ]
        if trace_state:
            pieces.append(_string(b"\x1a", ",".join(f"{k}={v}" for k, v in trace_state.items())))
        if parent:
            pieces += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        pieces += (
            self.name(span.name),
            _KIND[span.kind],
            b"\x39",
            _FIXED64.pack(span.start_time or 0),
            b"\x41",
            _FIXED64.pack(span.end_time or 0),
            self.attributes(b"\x4a", span.attributes),
        )
        if span.dropped_attributes:
            pieces += (b"\x50", _varint(span.dropped_attributes))
        for event in span.events:
            fields = (
                b"\x09"
                + _FIXED64.pack(event.timestamp)
                + _string(b"\x12", event.name)
                + self.attributes(b"\x1a", event.attributes)
            )
            if event.dropped_attributes:
                fields += b"\x20" + _varint(event.dropped_attributes)
            pieces.append(_field(b"\x5a", fields))
        if span.dropped_events:
            pieces += (b"\x60", _varint(span.dropped_events))
        for link in span.links:
            linked = link.context
            fields = (
                b"\x0a\x10"
                + linked.trace_id.to_bytes(16, "big")
                + b"\x12\x08"
                + linked.span_id.to_bytes(8, "big")
                + self.attributes(b"\x22", link.attributes)
            )
            if link.dropped_attributes:
                fields += b"\x28" + _varint(link.dropped_attributes)
            fields += _LINK_FLAGS_TAG + (_FLAGS_REMOTE if linked.is_remote else _FLAGS_LOCAL)
            pieces.append(_field(b"\x6a", fields))
        if span.dropped_links:
            pieces += (b"\x70", _varint(span.dropped_links))
        status = span.status
        if status is not None:
            code = status.status_code.value
            fields = _string(b"\x12", status.description or "")
            if code:
                fields += b"\x18" + _varint(code)
            pieces.append(_field(b"\x7a", fields))
        pieces += (
            _SPAN_FLAGS_TAG,
            _FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL,
        )
        return _field(b"\x12", b"".join(pieces))  # ScopeSpans.spans

    def record(self, fields: tuple[Any, ...], new_span_id: Callable[[], int]) -> bytes:
        """`span`'s bytes for a record (span_export.py's `Record`): what `span` writes for the
        SDK span `span_exporter.span_of` makes of it, a new span's id from `new_span_id`."""
        (name, context, parent, kind, attributes, events, links, start, end, code, text) = fields
        if context is None:  # a new span of its parent's trace
            trace_id, _, _, _, state = parent
            span_id = new_span_id()
        else:
            trace_id, span_id, _, _, state = context
        pieces = [
            b"\x0a\x10",
            trace_id.to_bytes(16, "big"),
            b"\x12\x08",
            span_id.to_bytes(8, "big"),
        ]
        if state:
            pieces.append(_string(b"\x1a", ",".join(f"{k}={v}" for k, v in state)))
        if parent is not None:
            pieces += (b"\x22\x08", parent[1].to_bytes(8, "big"))
        pieces += (
            self.name(name),
            _KIND_OF[kind],
            b"\x39",
            _FIXED64.pack(start),
            b"\x41",
            _FIXED64.pack(end),
            self.attributes(b"\x4a", attributes),
        )
        for event_name, timestamp, event_attributes in events:
            fields = (
                b"\x09"
                + _FIXED64.pack(timestamp)
                + _string(b"\x12", event_name)
                + self.attributes(b"\x1a", event_attributes)
            )
            pieces.append(_field(b"\x5a", fields))
        for linked, link_attributes in links:
            fields = (
                b"\x0a\x10"
                + linked[0].to_bytes(16, "big")
                + b"\x12\x08"
                + linked[1].to_bytes(8, "big")
                + self.attributes(b"\x22", link_attributes)
                + _LINK_FLAGS_TAG
                + (_FLAGS_REMOTE if linked[2] else _FLAGS_LOCAL)
            )
            pieces.append(_field(b"\x6a", fields))
        # As the SDK's Status keeps it: a description for an error only.
        status = _string(b"\x12", text) if code == _ERROR and text else b""
        if code:
            status += b"\x18" + _varint(code)
        pieces += (
            _field(b"\x7a", status),
            _SPAN_FLAGS_TAG,
            _FLAGS_REMOTE if parent is not None and parent[2] else _FLAGS_LOCAL,
        )
        return _field(b"\x12", b"".join(pieces))  # ScopeSpans.spans

    def records(
        self,
        batch: Sequence[tuple[Any, ...]],
        resource: Any,
        scope: Any,
        new_span_id: Callable[[], int],
    ) -> bytes:
        """`request`'s bytes for records, all of one resource and scope."""
        resource_field, scope_field = self.headers(resource, scope)
        spans = b"".join([self.record(fields, new_span_id) for fields in batch])
        schema = _string(b"\x1a", scope.schema_url or "")
        resource_spans = (
            resource_field
            + _field(b"\x12", scope_field + spans + schema)
            + _string(b"\x1a", resource.schema_url or "")
        )
        return _field(b"\x0a", resource_spans)

    def headers(self, resource: Any, scope: Any) -> tuple[bytes, bytes]:
        """The encoded Resource (ResourceSpans.resource) and InstrumentationScope
        (ScopeSpans.scope) fields."""
        key = (id(resource), id(scope))
        cached = self._headers.get(key)
        if cached is None or cached[0] is not resource or cached[1] is not scope:
            encoded_resource = _field(b"\x0a", self.attributes(b"\x0a", resource.attributes))
            scope_fields = b""
            if scope is not None:
                scope_fields = (
                    _string(b"\x0a", scope.name)
                    + _string(b"\x12", scope.version or "")
                    + self.attributes(b"\x1a", scope.attributes)
                )
            if len(self._headers) >= _CACHE_LIMIT:
                self._headers.clear()
            # The objects themselves are kept with their bytes: an id is reused once freed.
            cached = (resource, scope, encoded_resource, _field(b"\x0a", scope_fields))
            self._headers[key] = cached
        return cached[2], cached[3]

    def request(self, spans: Sequence[ReadableSpan]) -> bytes:
        # Resource, then scope, in the order first met (as the SDK's encoder groups them).
        groups: dict[Any, dict[Any, list[bytes]]] = {}
        for span in spans:
            scope = span.instrumentation_scope or None
            by_scope = groups.setdefault(span.resource, {})
            by_scope.setdefault(scope, []).append(self.span(span))
        out = []
        for resource, by_scope in groups.items():
            resource_spans = []
            for scope, encoded in by_scope.items():
                resource_field, scope_field = self.headers(resource, scope)
                if not resource_spans:
                    resource_spans.append(resource_field)
                schema = _string(b"\x1a", scope.schema_url or "") if scope is not None else b""
                resource_spans.append(_field(b"\x12", scope_field + b"".join(encoded) + schema))
            resource_spans.append(_string(b"\x1a", resource.schema_url or ""))
            out.append(_field(b"\x0a", b"".join(resource_spans)))
        return b"".join(out)


def encode_export_request(
    spans: Sequence[ReadableSpan], encoder: _Encoder | None = None
) -> bytes | None:
    """The serialized `ExportTraceServiceRequest` of `spans`; None when a span holds what
    this encoder does not write (the SDK's encoder then takes the batch)."""
    try:
        return (encoder or _Encoder()).request(spans)
    except _Unencodable:
        return None
    except Exception:  # a span of a kind not met before: the SDK's encoder says what is wrong
        log.debug("spans the direct encoder cannot write", exc_info=True)
        return None


class SettledSession(requests.Session):
    """A requests session that reads the environment's settings for a URL once, not at every
    request: the proxies (*_PROXY, NO_PROXY) and the CA bundle (REQUESTS_CA_BUNDLE,
    CURL_CA_BUNDLE). requests reads them for each request, walking every environment variable
    twice, which cost the span exporter process ~0.4 ms a post, more than encoding the post's
    512 spans; its environment does not change once it runs. The rest is requests' own, read
    at every post as before: .netrc's credentials (a file, which may change), a URL's."""

    def __init__(self) -> None:
        super().__init__()
        self._settled: dict[tuple[Any, ...], dict[str, Any]] = {}

    def merge_environment_settings(
        self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
    ) -> dict[str, Any]:
        key = (
            url,
            tuple(sorted((proxies or {}).items())),
            stream,
            verify,
            cert,
            tuple(sorted(self.proxies.items())),  # (the session's own, which requests merges)
            self.verify,
            self.cert,
            self.trust_env,
        )
        settled = self._settled.get(key)
        if settled is None:
            if len(self._settled) >= _CACHE_LIMIT:
                self._settled.clear()
            settled = super().merge_environment_settings(url, proxies, stream, verify, cert)
            self._settled[key] = settled
        return {**settled, "proxies": dict(settled["proxies"])}


# The SDK's variables naming a credential provider, whose session the exporter then posts with.
_CREDENTIAL_PROVIDERS = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
)


class OtlpHttpExporter(_HttpSpanExporter):
    """The SDK's OTLP/HTTP span exporter, encoding with `encode_export_request`, posting
    with a `SettledSession` unless given a session or told to take a credential provider's."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("session") is None and not any(
            os.environ.get(name) for name in _CREDENTIAL_PROVIDERS
        ):
            kwargs["session"] = SettledSession()
        super().__init__(**kwargs)
        self._encoder = _Encoder()
        # The SDK's client that posts serialized bytes (its retries, headers, compression).
        self._poster = getattr(getattr(self, "_client", None), "export", None)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = None
        if not self._shutdown and self._poster is not None:
            data = encode_export_request(spans, self._encoder)
        if data is None:
            return super().export(spans)
        return self._post(data)

    def export_records(
        self,
        batch: Sequence[tuple[Any, ...]],
        resource: Any,
        scope: Any,
        new_span_id: Callable[[], int],
    ) -> SpanExportResult | None:
        """Export span_export.py's records of one resource and scope; None, having sent
        nothing, when this encoder cannot write them (then `export` their SDK spans)."""
        if self._shutdown or self._poster is None:
            return None
        try:
            data = self._encoder.records(batch, resource, scope, new_span_id)
        except _Unencodable:
            return None
        except Exception:  # a record of a kind not met before: the SDK's way says what is wrong
            log.debug("records the direct encoder cannot write", exc_info=True)
            return None
        return self._post(data)

    def _post(self, data: bytes) -> SpanExportResult:
        assert self._poster is not None
        result = self._poster(data)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE


class OtlpGrpcExporter(_GrpcSpanExporter):
    """The SDK's OTLP/gRPC span exporter, encoding with `encode_export_request` (parsed back
    into the message its stub sends, by protobuf's C runtime)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._encoder = _Encoder()

    def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
        encoded = encode_export_request(data, self._encoder)
        if encoded is None:
            return super()._translate_data(data)
        return ExportTraceServiceRequest.FromString(encoded)
