"""The span exporters the OTEL_* variables configure, and the server's resource: shared by the
serving process that makes spans and the exporter process that sends them (span_export.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter


def service_resource() -> Resource:
    """The resource OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES describe; the service is
    called tritonactor unless they name it."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "tritonactor"}))
    return resource


def build_exporters(names: Sequence[str], protocol: str) -> list[SpanExporter]:
    """An exporter per name ("otlp", "console"); OTLP over `protocol` ("grpc" or
    "http/protobuf")."""
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "console":
            exporters.append(ConsoleSpanExporter())
            continue
        # The SDK's OTLP exporters, writing the protobuf bytes directly (otlp.py: 3x cheaper).
        from tritonactor.observability.otlp import OtlpGrpcExporter, OtlpHttpExporter

        exporters.append(OtlpGrpcExporter() if protocol == "grpc" else OtlpHttpExporter())
    return exporters


class HashedResource(Resource):
    """A resource with its hash computed once: the OTLP encoder groups spans by resource, and
    `Resource.__hash__` serialises every attribute to JSON each time."""

    def __init__(self, attributes: Mapping[str, Any], schema_url: str | None = None) -> None:
        super().__init__(attributes, schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash
