"""OpenTelemetry tracing of inference requests and of control-plane operations.

The server builds one `Tracing` (its own `TracerProvider`, never the global one) when the
standard OTEL_* variables configure an exporter (`tracing_env.py` reads them); otherwise
tracing is off and `server.tracing` is None. A traced request carries a `RequestTrace`
(`InferenceRequest.trace`) through every mailbox; an untraced one carries None, so each hop
costs one `is None` check.

The spans of one request, all in the client's trace when it sent a W3C `traceparent`:

    InferRequest (SERVER, front end) ─┬─ router      resolve + validate
                                      ├─ queue       router -> an instance took the batch
                                      └─ execute     one per batch, linked to every request in it
                                           └─ compute  the backend's execute

A batch span's parent is the first traced request it carried; the other requests' spans link
to it, and it links to all of them. Which requests are traced is decided as they arrive: see
`Tracing.start_request` and docs/tracing.md.

Request spans are cheap on purpose: the SDK's span objects cost ~25 µs each (locks, bounded
attributes, a sampler call), and a request makes five. A request's trace holds its span
context as a record holds it (`span_export.Context`: ids, flags and trace state as plain
values), crosses to an engine process as that, and makes no OpenTelemetry object unless asked
(`RequestTrace.span_context`, for a log line); the SDK's default sampler is not called, since
it samples whatever the trace settings let through. Once a request is sampled, its spans are
written down when they end as plain tuples for an exporter process (`span_export.py`), which
exports them (their OTLP protobuf written by `otlp.py`); stage spans nothing refers to get
their id there. With span processors of this process (`add_processor`: tests, benchmarks) they
are built as finished `ReadableSpan`s from the same tuples (`span_of`), with the provider's
resource and id generator, and handed to those too. The control plane, which is rare, uses the
SDK tracer; its spans go the same way."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context as OtelContext
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tritonactor import __version__
from tritonactor.observability.exporters import HashedResource, service_resource
from tritonactor.observability.span_export import (
    Context,
    Record,
    ShippingProcessor,
    SpanShipper,
    child_record,
    context_fields,
    span_context,
    span_of,
)
from tritonactor.observability.trace_settings import TraceSettings

if TYPE_CHECKING:
    from tritonactor.core.types import InferenceRequest
    from tritonactor.observability.tracing_env import TracingConfig

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

_ROOT = OtelContext()
_PROPAGATOR = TraceContextTextMapPropagator()
_SAMPLED_FLAG = 1  # W3C's sampled flag, as a record's context holds it
_UNSET = Status(StatusCode.UNSET)
_SERVER = SpanKind.SERVER.value
_INTERNAL = SpanKind.INTERNAL.value
_DEFAULT_SAMPLER = DEFAULT_ON.get_description()


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
        sampler = self.sampler = provider.sampler
        # A parent-based sampler (the SDK's default) lets a client's sampled flag decide.
        self.client_decides = isinstance(sampler, ParentBased)
        # The SDK's default sampler (OTEL_TRACES_SAMPLER unset) samples every request the
        # settings let through, keeping the client's trace state: it need not be asked.
        self._always = (
            type(sampler) is ParentBased and sampler.get_description() == _DEFAULT_SAMPLER
        )
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

    def continued(self, crossed: Context) -> RequestTrace | None:
        """The trace of a request whose front end runs in another process and sent its span's
        context (`RequestTrace.crossing`): the stages here nest under that span."""
        trace_id, span_id, _, flags, state = crossed
        if not trace_id or not span_id:
            return None
        # A stand-in for the front end's span, never exported here: what the stages add to it
        # (a batch's link) goes back with the answer (`links_back`).
        remote = (trace_id, span_id, True, flags, state)
        stand_in = LiveSpan(REQUEST_SPAN, remote, None, _SERVER, {}, [], 0)
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
        parent_fields = None if parent is None else context_fields(parent)
        if self._always:
            state = () if parent_fields is None else parent_fields[4]
        else:
            decision = self.sampler.should_sample(
                None if parent is None else set_span_in_context(NonRecordingSpan(parent), _ROOT),
                trace_id,
                REQUEST_SPAN,
                SpanKind.SERVER,
                attributes,
            )
            if not decision.decision.is_sampled():
                return None
            trace_state = decision.trace_state
            state = tuple(trace_state.items()) if trace_state else ()
        if use_up is not None:
            use_up()  # trace_count counts the traces made, not the requests considered
        context = (trace_id, self._ids.generate_span_id(), False, _SAMPLED_FLAG, state)
        span = LiveSpan(REQUEST_SPAN, context, parent_fields, _SERVER, attributes)
        return RequestTrace(self, context, span)

    def emit(
        self,
        name: str,
        parent: Context,
        start: int,
        end: int,
        attributes: Mapping[str, Any] | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Export a finished child span of `parent` (a record's context), from `start` to
        `end` (ns since the epoch). Nothing refers to it: it gets its id where it is exported,
        unless processors here see it too (they and the exporter process see the same span)."""
        status, attributes = _outcome(attributes, error)
        context = self._child_of(parent) if self._processors else None
        self._put(child_record(name, parent, start, end, attributes, status, context))

    def open_span(
        self,
        name: str,
        parent: Context,
        start: int,
        attributes: dict[str, Any],
        links: list[Context],
    ) -> LiveSpan:
        """A child span of `parent` that `end_span` exports once it is over."""
        return LiveSpan(name, self._child_of(parent), parent, _INTERNAL, attributes, links, start)

    def _child_of(self, parent: Context) -> Context:
        """The context of a new span under `parent`: its trace and trace state, a new id."""
        return (parent[0], self._ids.generate_span_id(), False, _SAMPLED_FLAG, parent[4])

    def end_span(self, span: LiveSpan, error: BaseException | None = None) -> None:
        """The span is over now: export it."""
        status, attributes = _outcome(span.attributes, error)
        self._put(
            (
                span.name,
                span.context,
                span.parent,
                span.kind,
                attributes or None,
                (),
                tuple([(linked, None) for linked in span.links]),
                span.start,
                time.time_ns(),
                status.status_code.value,
                status.description,
            )
        )

    def _put(self, fields: Record) -> None:
        shipper = self._shipper
        if shipper is not None:
            shipper.put(fields)
        if self._processors:
            span = span_of(fields, self._resource, self._scope, self._ids)
            for processor in self._processors:
                try:
                    processor.on_end(span)
                except Exception:  # a processor's failure is not the request's (its answer)
                    log.exception("span processor %r failed on span %r", processor, span.name)

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
    """A span still open (a request's, a batch's): what it will be exported with. Contexts
    are held as records hold them (`span_export.Context`), the kind as SpanKind's value."""

    __slots__ = ("attributes", "context", "kind", "links", "name", "parent", "start")

    def __init__(
        self,
        name: str,
        context: Context,
        parent: Context | None,
        kind: int,
        attributes: dict[str, Any],
        links: list[Context] | None = None,
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
    of (`context`, as records hold it), and the span its front end owns (None for a child
    request, whose context is its parent's: an ensemble step, a BLS call)."""

    __slots__ = ("_ended", "_span_context", "context", "queued_at", "span", "stage", "tracing")

    def __init__(self, tracing: Tracing, context: Context, span: LiveSpan | None = None) -> None:
        self.tracing = tracing
        self.context = context
        self.span = span
        # When the router handed the request to its scheduler (ns since the epoch), and the
        # attributes of its stage spans (`stage_attributes`), set as it is routed.
        self.queued_at = 0
        self.stage: dict[str, Any] | None = None
        self._span_context: SpanContext | None = None
        self._ended = False

    @property
    def span_context(self) -> SpanContext:
        """The OpenTelemetry span context of `context` (what logs name)."""
        made = self._span_context
        if made is None:
            made = self._span_context = span_context(self.context)
        return made

    def child(self) -> RequestTrace:
        """The trace of a request made on behalf of this one: its spans nest under this
        request's span."""
        return RequestTrace(self.tracing, self.context)

    def crossing(self) -> Context:
        """What an engine in another process continues the trace from (`Tracing.continued`)."""
        return self.context

    def carrier(self) -> dict[str, str]:
        """The W3C trace context of this request, as a python model reads it."""
        trace_id, span_id, _, flags, state = self.context
        carrier = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"}
        if state:
            carrier["tracestate"] = ",".join(f"{key}={value}" for key, value in state)
        return carrier

    def links_back(self) -> list[tuple[int, int]]:
        """The (trace id, span id) of each span the request's own span links to."""
        span = self.span
        if span is None:
            return []
        return [(linked[0], linked[1]) for linked in span.links]

    def link_to(self, links: Sequence[tuple[int, int]]) -> None:
        """Link the request's span to these spans (`links_back` of its stages elsewhere)."""
        if self.span is not None:
            for trace_id, span_id in links:
                self.span.links.append((trace_id, span_id, True, _SAMPLED_FLAG, ()))

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
        attributes = self.stage = stage_attributes(request)
        self.tracing.emit(ROUTER_SPAN, self.context, started, now, attributes, error)
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
                # (its stage attributes are the router's, set with queued_at)
                tracing.emit(QUEUE_SPAN, trace.context, trace.queued_at, now, trace.stage)
            links.append(trace.context)
        first = traced[0]
        attributes = {
            MODEL_NAME: first.model_name,
            BATCH_SIZE: batch_size,
            BATCH_REQUESTS: len(requests),
        }
        if first.resolved_version:
            attributes[MODEL_VERSION] = str(first.resolved_version)
        self.span = tracing.open_span(EXECUTE_SPAN, leader.context, now, attributes, links)
        batch = self.span.context
        for request in traced[1:]:
            trace = request.trace
            assert trace is not None
            # A request of another trace sees the batch that carried it from its own span.
            if trace.span is not None and trace.context[0] != batch[0]:
                trace.span.links.append(batch)

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
