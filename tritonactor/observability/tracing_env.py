"""The tracing the environment configures: which exporters the standard OTEL_* variables name
(or an OTLP endpoint implies) and the protocol OTLP speaks, read once as the server starts so
that a variable tritonactor cannot use stops it before it serves. Tracing is off unless an
exporter is configured. The tracer these settings start is tracing.py's (`start_tracing`); this
module reads variables only and imports nothing of OpenTelemetry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PROTOCOLS = ("http/protobuf", "grpc")
EXPORTERS = ("otlp", "console")


class TracingConfigError(ValueError):
    """An OTEL_* variable tritonactor cannot use; names the variable."""

    def __init__(self, message: str, variable: str) -> None:
        super().__init__(message)
        self.variable = variable


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """What the OTEL_* variables ask for: which exporters, and OTLP's protocol."""

    exporters: tuple[str, ...]
    protocol: str


def tracing_config(environ: Mapping[str, str]) -> TracingConfig | None:
    """The tracing the environment configures, or None (off): tracing needs an exporter,
    named in OTEL_TRACES_EXPORTER or implied by an OTLP endpoint; OTEL_SDK_DISABLED=true or
    OTEL_TRACES_EXPORTER=none turn it off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    exporters = tuple(dict.fromkeys(n.strip() for n in named.split(",") if n.strip()))
    if exporters == ("none",):
        return None
    for exporter in exporters:
        if exporter not in EXPORTERS:
            raise TracingConfigError(
                f"OTEL_TRACES_EXPORTER={named!r}: tritonactor exports traces with "
                f"{', '.join(EXPORTERS)} or none",
                "OTEL_TRACES_EXPORTER",
            )
    if not exporters:
        endpoints = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
        if not any(environ.get(variable, "").strip() for variable in endpoints):
            return None
        exporters = ("otlp",)
    variable = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    protocol = environ.get(variable, "").strip().lower()
    if not protocol:
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
        protocol = environ.get(variable, "").strip().lower() or "http/protobuf"
    if "otlp" in exporters and protocol not in PROTOCOLS:
        raise TracingConfigError(
            f"{variable}={protocol!r}: tritonactor's OTLP exporter speaks {' or '.join(PROTOCOLS)}",
            variable,
        )
    return TracingConfig(exporters, protocol)
