"""OpenTelemetry tracing of inference requests and of control-plane operations.

The server builds one `Tracing` (its own `TracerProvider`, never the global one) when the
standard OTEL_* variables configure an exporter; otherwise tracing is off and `server.tracing`
is None. A traced request carries a `RequestTrace` (`InferenceRequest.trace`) through every
mailbox; an untraced one carries None, so each hop costs one `is None` check.

The spans of one request, all in the client's trace when it sent a W3C `traceparent`:

    InferRequest (SERVER, front end) ─┬─ router      resolve + validate
                                      ├─ queue       router -> an instance took the batch
                                      └─ execute     one per batch, linked to every request in it
                                           └─ compute  the backend's execute

A batch span's parent is the first traced request it carried; the other requests' spans link
to it, and it links to all of them. Which requests are traced is decided as they arrive: see
`Tracing.start_request` and docs/tracing.md.

Request spans are cheap on purpose: the SDK's span objects cost ~25 µs each (locks, bounded
attributes, a sampler call), and a request makes five. Once a request is sampled, its spans are
written down when they end as plain tuples for an exporter process (`span_export.py`), which
rebuilds and exports them with the SDK's exporters (their OTLP protobuf written by `otlp.py`);
stage spans nothing refers to get their id there. With span processors of this process
(`add_processor`: tests, benchmarks) they are built as finished `ReadableSpan`s, with the
provider's resource and id generator, and handed to those too. The control plane, which is
rare, uses the SDK tracer; its spans go the same way."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tritonactor import __version__
from tritonactor.observability.exporters import HashedResource, service_resource
from tritonactor.observability.span_export import (
    ShippingProcessor,
    SpanShipper,
    child_record,
    record,
)
from tritonactor.observability.trace_settings import TraceSettings

if TYPE_CHECKING:
    from tritonactor.core.types import InferenceRequest

log = logging.getLogger(__name__)

# Span names (Triton's OpenTelemetry mode calls the request's span InferRequest too).
REQUEST_SPAN = "InferRequest"
ROUTER_SPAN = "router"
QUEUE_SPAN = "queue"
EXECUTE_SPAN = "execute"
COMPUTE_SPAN = "compute"

# Attributes: Triton's names, plus what a batch is made of.
MODEL_NAME = "triton.model_name"
MODEL_VERSION = "triton.model_version"
REQUEST_ID = "triton.request_id"
BATCH_SIZE = "triton.batch_size"  # the batch the model ran with (the requests' batch sizes)
BATCH_REQUESTS = "triton.batch_requests"  # how many requests rode in it

PROTOCOLS = ("http/protobuf", "grpc")
EXPORTERS = ("otlp", "console")

_ROOT = Context()
_PROPAGATOR = TraceContextTextMapPropagator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)


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


def start_tracing(config: TracingConfig, settings: TraceSettings) -> Tracing:
    """A `Tracing` whose spans an exporter process of its own exports (span_export.py) with
    each configured exporter. span_export.py reads OTEL_BSP_SCHEDULE_DELAY,
    OTEL_BSP_MAX_QUEUE_SIZE and OTEL_BSP_MAX_EXPORT_BATCH_SIZE; the SDK reads the rest of
    OTEL_*: endpoints, headers, timeouts, OTEL_TRACES_SAMPLER[_ARG], OTEL_SERVICE_NAME,
    OTEL_RESOURCE_ATTRIBUTES."""
    resource = service_resource()
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracing = Tracing(provider, settings)
    tracing.ship_to(SpanShipper(config.exporters, config.protocol, resource))
    log.info(
        "tracing with OpenTelemetry: exporters %s (OTLP over %s), sampler %s",
        ", ".join(config.exporters),
        config.protocol,
        provider.sampler.get_description(),
    )
    return tracing


class Tracing:
    """The server's tracer and the trace settings that pick which requests it traces."""

    def __init__(self, provider: TracerProvider, settings: TraceSettings) -> None:
        self.provider = provider
        self.settings = settings
        self.tracer = provider.get_tracer("tritonactor", __version__)
        self.sampler = provider.sampler
        # A parent-based sampler (the SDK's default) lets a client's sampled flag decide.
        self.client_decides = isinstance(provider.sampler, ParentBased)
        self._ids = provider.id_generator
        self._resource = HashedResource(provider.resource.attributes, provider.resource.schema_url)
        self._scope = InstrumentationScope("tritonactor", __version__)
        self._processors: list[SpanProcessor] = []
        self._shipper: SpanShipper | None = None

    def add_processor(self, processor: SpanProcessor) -> None:
        """Where spans go, in this process: the SDK's spans (through the provider) and request
        spans alike."""
        self.provider.add_span_processor(processor)
        self._processors.append(processor)

    def ship_to(self, shipper: SpanShipper) -> None:
        """Where spans go: to an exporter process, the SDK's spans and request spans alike."""
        self.provider.add_span_processor(ShippingProcessor(shipper))
        self._shipper = shipper

    def continued(self, carrier: Mapping[str, str]) -> RequestTrace | None:
        """The trace of a request whose front end runs in another process and sent its span's
        context (`RequestTrace.carrier`): the stages here nest under that span."""
        remote = get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
        if not remote.is_valid:
            return None
        # A stand-in for the front end's span, never exported here: what the stages add to it
        # (a batch's link) goes back with the answer (`links_back`).
        stand_in = LiveSpan(REQUEST_SPAN, remote, None, SpanKind.SERVER, {}, [], 0)
        trace = RequestTrace(self, remote, stand_in)
        trace._ended = True
        return trace

    def start_request(
        self,
        model: str,
        version: str,
        carrier: Mapping[str, Any] | None,
        protocol: str,
    ) -> RequestTrace | None:
        """The front end's span for a request of `model` that just arrived, continuing the
        client's `traceparent` from `carrier` (HTTP headers, gRPC metadata); None when the
        request is not traced. A client's sampled flag decides for its request (with a
        parent-based sampler), unless trace_level is OFF for the model; otherwise the trace
        settings decide (level, rate, count), and then the sampler."""
        parent: SpanContext | None = None
        traceparent = carrier.get("traceparent") if carrier is not None else None
        if traceparent:
            remote = get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
            if remote.is_valid:
                parent = remote
        use_up: Callable[[], None] | None = None
        if parent is not None and self.client_decides:
            if not (parent.trace_flags.sampled and self.settings.enabled(model)):
                return None
        else:
            use_up = self.settings.sample(model)
            if use_up is None:
                return None
        attributes: dict[str, Any] = {MODEL_NAME: model, "triton.protocol": protocol}
        if version:
            attributes[MODEL_VERSION] = version
        trace_id = parent.trace_id if parent is not None else self._ids.generate_trace_id()
        decision = self.sampler.should_sample(
            None if parent is None else set_span_in_context(NonRecordingSpan(parent), _ROOT),
            trace_id,
            REQUEST_SPAN,
            SpanKind.SERVER,
            attributes,
        )
        if not decision.decision.is_sampled():
            return None
        if use_up is not None:
            use_up()  # trace_count counts the traces made, not the requests considered
        context = SpanContext(
            trace_id, self._ids.generate_span_id(), False, _SAMPLED, decision.trace_state
        )
        span = LiveSpan(REQUEST_SPAN, context, parent, SpanKind.SERVER, attributes)
        return RequestTrace(self, context, span)

    def emit(
        self,
        name: str,
        parent: SpanContext,
        start: int,
        end: int,
        attributes: Mapping[str, Any] | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Export a finished child span of `parent`, from `start` to `end` (ns since the
        epoch)."""
        shipper = self._shipper
        if shipper is not None and not self._processors:
            # Nothing here refers to the span: the exporter process gives it its id.
            status, attributes = _outcome(attributes, error)
            shipper.put(child_record(name, parent, start, end, attributes, status))
            return
        context = SpanContext(
            parent.trace_id, self._ids.generate_span_id(), False, _SAMPLED, parent.trace_state
        )
        self._export(name, context, parent, SpanKind.INTERNAL, attributes, (), start, end, error)

    def open_span(
        self,
        name: str,
        parent: SpanContext,
        start: int,
        attributes: dict[str, Any],
        links: list[Link],
    ) -> LiveSpan:
        """A child span of `parent` that `end_span` exports once it is over."""
        context = SpanContext(
            parent.trace_id, self._ids.generate_span_id(), False, _SAMPLED, parent.trace_state
        )
        return LiveSpan(name, context, parent, SpanKind.INTERNAL, attributes, links, start)

    def end_span(self, span: LiveSpan, error: BaseException | None = None) -> None:
        """The span is over now: export it."""
        self._export(
            span.name,
            span.context,
            span.parent,
            span.kind,
            span.attributes,
            span.links,
            span.start,
            time.time_ns(),
            error,
        )

    def _export(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: Mapping[str, Any] | None,
        links: Sequence[Link],
        start: int,
        end: int,
        error: BaseException | None,
    ) -> None:
        status, attributes = _outcome(attributes, error)
        shipper = self._shipper
        if shipper is not None:
            shipper.put(record(name, context, parent, kind, attributes, links, start, end, status))
        if not self._processors:
            return
        span = ReadableSpan(
            name,
            context,
            parent,
            self._resource,
            attributes,
            links=links,
            kind=kind,
            status=status,
            start_time=start,
            end_time=end,
            instrumentation_scope=self._scope,
        )
        for processor in self._processors:
            processor.on_end(span)

    @contextmanager
    def operation(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
        """A span of its own trace around a control-plane operation; an exception marks it
        failed on its way out. The trace settings do not apply (they pick inference
        requests); the sampler does."""
        span = self.tracer.start_span(name, context=_ROOT, attributes=attributes)
        try:
            yield span
        except BaseException as error:
            fail(span, error)
            raise
        finally:
            span.end()

    def shutdown(self) -> None:
        """Export what is pending and stop the exporters (blocks: call off the loop)."""
        self.provider.shutdown()


class LiveSpan:
    """A span still open (a request's, a batch's): what it will be exported with."""

    __slots__ = ("attributes", "context", "kind", "links", "name", "parent", "start")

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: list[Link] | None = None,
        start: int | None = None,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.attributes = attributes
        self.links = links if links is not None else []
        self.start = time.time_ns() if start is None else start


class RequestTrace:
    """The trace context one request carries: the span context its stage spans are children
    of, and the span its front end owns (None for a child request, whose context is its
    parent's: an ensemble step, a BLS call)."""

    __slots__ = ("_ended", "queued_at", "span", "span_context", "tracing")

    def __init__(
        self, tracing: Tracing, span_context: SpanContext, span: LiveSpan | None = None
    ) -> None:
        self.tracing = tracing
        self.span_context = span_context
        self.span = span
        # When the router handed the request to its scheduler (ns since the epoch).
        self.queued_at = 0
        self._ended = False

    def child(self) -> RequestTrace:
        """The trace of a request made on behalf of this one: its spans nest under this
        request's span."""
        return RequestTrace(self.tracing, self.span_context)

    def carrier(self) -> dict[str, str]:
        """The W3C trace context of this request, as a python model reads it."""
        context = self.span_context
        carrier = {
            "traceparent": (
                f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
            )
        }
        state = context.trace_state.to_header()
        if state:
            carrier["tracestate"] = state
        return carrier

    def links_back(self) -> list[tuple[int, int]]:
        """The (trace id, span id) of each span the request's own span links to."""
        span = self.span
        if span is None:
            return []
        return [(link.context.trace_id, link.context.span_id) for link in span.links]

    def link_to(self, links: Sequence[tuple[int, int]]) -> None:
        """Link the request's span to these spans (`links_back` of its stages elsewhere)."""
        if self.span is not None:
            for trace_id, span_id in links:
                self.span.links.append(Link(SpanContext(trace_id, span_id, True, _SAMPLED)))

    def describe(self, request: InferenceRequest) -> None:
        """Name the request on the front end's span once it is decoded."""
        if self.span is not None and request.id:
            self.span.attributes[REQUEST_ID] = request.id

    def routed(
        self, request: InferenceRequest, started: int, error: BaseException | None = None
    ) -> None:
        """The router's span, from `started` (ns since the epoch) to now; the request then
        queues from now."""
        now = time.time_ns()
        attributes = stage_attributes(request)
        self.tracing.emit(ROUTER_SPAN, self.span_context, started, now, attributes, error)
        self.queued_at = now
        self.resolved(request)

    def resolved(self, request: InferenceRequest) -> None:
        """Name the version that serves the request on the front end's span (once routed)."""
        span = self.span
        if span is not None and MODEL_VERSION not in span.attributes and request.resolved_version:
            span.attributes[MODEL_VERSION] = str(request.resolved_version)

    def end(self, error: BaseException | None = None) -> None:
        """The front end answered: export the request's span (once; a child has none)."""
        span = self.span
        if self._ended or span is None:
            return
        self._ended = True
        self.tracing.end_span(span, error)


class BatchTrace:
    """The spans of one execute: each traced request's queue span (ended as the instance takes
    the batch), the batch's execute span and its compute span."""

    __slots__ = ("_epoch", "_perf", "_tracing", "span")

    def __init__(self, requests: Sequence[InferenceRequest], batch_size: int) -> None:
        # One reading of both clocks, to place perf_counter times on the epoch.
        self._epoch = now = time.time_ns()
        self._perf = time.perf_counter_ns()
        traced = [request for request in requests if request.trace is not None]
        leader = traced[0].trace
        assert leader is not None
        tracing = self._tracing = leader.tracing
        links = []
        for request in traced:
            trace = request.trace
            assert trace is not None
            if trace.queued_at:
                attributes = stage_attributes(request)
                tracing.emit(QUEUE_SPAN, trace.span_context, trace.queued_at, now, attributes)
            links.append(Link(trace.span_context))
        first = traced[0]
        attributes = {
            MODEL_NAME: first.model_name,
            BATCH_SIZE: batch_size,
            BATCH_REQUESTS: len(requests),
        }
        if first.resolved_version:
            attributes[MODEL_VERSION] = str(first.resolved_version)
        self.span = tracing.open_span(EXECUTE_SPAN, leader.span_context, now, attributes, links)
        batch = self.span.context
        for request in traced[1:]:
            trace = request.trace
            assert trace is not None
            # A request of another trace sees the batch that carried it from its own span.
            if trace.span is not None and trace.span_context.trace_id != batch.trace_id:
                trace.span.links.append(Link(batch))

    def end(
        self,
        backend_started: int | None = None,
        backend_finished: int | None = None,
        error: BaseException | None = None,
    ) -> None:
        """The batch is answered. `backend_*` (perf_counter_ns) bound the backend's execute,
        None when it did not run to completion."""
        if backend_started is not None and backend_finished is not None:
            start, end = self._epoch_of(backend_started), self._epoch_of(backend_finished)
            self._tracing.emit(COMPUTE_SPAN, self.span.context, start, end)
        self._tracing.end_span(self.span, error)

    def _epoch_of(self, perf_ns: int) -> int:
        return self._epoch + perf_ns - self._perf


def stage_attributes(request: InferenceRequest) -> dict[str, Any]:
    """The attributes of a request's stage spans: its model and the version serving it (a
    child request's model is not its parent's). The request's id is on the request's span:
    each attribute costs a few µs to export."""
    attributes: dict[str, Any] = {MODEL_NAME: request.model_name}
    if request.resolved_version:
        attributes[MODEL_VERSION] = str(request.resolved_version)
    elif request.model_version:
        attributes[MODEL_VERSION] = request.model_version
    return attributes


def _outcome(
    attributes: Mapping[str, Any] | None, error: BaseException | None
) -> tuple[Status, Mapping[str, Any] | None]:
    """A span's status and attributes: as they are without `error`; failed, and the error's
    kind added, with it."""
    if error is None:
        return _UNSET, attributes
    status, kind_of_error = _failure(error)
    return status, {**(attributes or {}), "error.type": kind_of_error}


def _failure(error: BaseException) -> tuple[Status, str]:
    """The status of a span that `error` failed, and the error's kind: a TritonError's code,
    a gRPC error's status, else the exception's type."""
    message = getattr(error, "message", None)
    if not isinstance(message, str) or not message:
        message = str(error) or type(error).__name__
    code = getattr(error, "code", None) or getattr(error, "status", None)
    return Status(StatusCode.ERROR, message), getattr(code, "name", None) or type(error).__name__


def fail(span: Span, error: BaseException) -> None:
    """Mark an SDK span failed (see `_failure`)."""
    status, kind = _failure(error)
    span.set_status(status)
    span.set_attribute("error.type", kind)
