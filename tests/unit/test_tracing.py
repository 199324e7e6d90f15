"""Tracing in-process: which requests are traced, and the spans a request leaves behind as it
goes through the real router, scheduler and instance actors (exported to memory)."""

from __future__ import annotations

import pickle
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import SpanContext, TraceFlags
from opentelemetry.trace.span import TraceState

from tritonactor.actors import ActorSystem
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
)
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.errors import TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.observability.trace_settings import TraceSettings
from tritonactor.observability.tracing import Tracing
from tritonactor.observability.tracing_env import TracingConfig, TracingConfigError, tracing_config
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

WAIT = 30  # s: the bound on a wait for something bound to happen (only a hang reaches it)
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


def traceparent(sampled: bool = True) -> dict[str, str]:
    return {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-{'01' if sampled else '00'}"}


# -- configuration from OTEL_* ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "x"}, None),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
            TracingConfig(("otlp",), "http/protobuf"),
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            TracingConfig(("otlp",), "grpc"),
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            TracingConfig(("otlp",), "http/protobuf"),
        ),
        ({"OTEL_TRACES_EXPORTER": "console"}, TracingConfig(("console",), "http/protobuf")),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, None),
    ],
    ids=[
        "nothing",
        "no-exporter",
        "endpoint",
        "grpc",
        "traces-protocol-wins",
        "console",
        "none",
        "disabled",
    ],
)
def test_tracing_is_configured_by_an_exporter_only(
    environ: dict[str, str], expected: TracingConfig | None
) -> None:
    assert tracing_config(environ) == expected


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
    ],
)
def test_a_configuration_tritonactor_cannot_serve_names_its_variable(
    environ: dict[str, str], variable: str
) -> None:
    with pytest.raises(TracingConfigError) as caught:
        tracing_config(environ)
    assert caught.value.variable == variable
    assert variable in str(caught.value)


# -- which requests are traced ------------------------------------------------------------------


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def make_tracing(
    exporter: InMemorySpanExporter, settings: TraceSettings | None = None, sampler: object = None
) -> Tracing:
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)  # type: ignore[arg-type]
    tracing = Tracing(provider, settings or TraceSettings(level=("TIMESTAMPS",), rate=1))
    tracing.add_processor(SimpleSpanProcessor(exporter))
    return tracing


def test_a_request_continues_the_clients_trace(exported: InMemorySpanExporter) -> None:
    tracing = make_tracing(exported)
    trace = tracing.start_request("m", "2", traceparent(), "HTTP")
    assert trace is not None
    trace.end()
    (span,) = exported.get_finished_spans()
    assert span.name == "InferRequest"
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID
    assert span.attributes == {
        "triton.model_name": "m",
        "triton.model_version": "2",
        "triton.protocol": "HTTP",
    }
    assert trace.carrier()["traceparent"] == (
        f"00-{TRACE_ID}-{format(span.context.span_id, '016x')}-01"
    )


def test_the_clients_sampled_flag_decides(exported: InMemorySpanExporter) -> None:
    settings = TraceSettings(level=("TIMESTAMPS",), rate=1000)
    tracing = make_tracing(exported, settings)
    assert tracing.start_request("m", "", traceparent(sampled=False), "HTTP") is None
    # rate 1000 does not hold back a request the client sampled
    assert tracing.start_request("m", "", traceparent(), "HTTP") is not None
    settings.update({"trace_level": ["OFF"]}, "m")
    assert tracing.start_request("m", "", traceparent(), "HTTP") is None


def test_without_a_client_decision_the_settings_decide(exported: InMemorySpanExporter) -> None:
    settings = TraceSettings(level=("TIMESTAMPS",), rate=3)
    tracing = make_tracing(exported, settings)
    taken = [tracing.start_request("m", "", None, "HTTP") is not None for _ in range(6)]
    assert taken == [False, False, True, False, False, True]


def test_a_sampler_that_is_not_parent_based_ignores_the_clients_flag(
    exported: InMemorySpanExporter,
) -> None:
    tracing = make_tracing(exported, sampler=ALWAYS_ON)
    trace = tracing.start_request("m", "", traceparent(sampled=False), "GRPC")
    assert trace is not None  # the settings (rate 1) took it, in the client's trace
    assert format(trace.span_context.trace_id, "032x") == TRACE_ID


def test_a_sampler_other_than_the_default_is_asked(exported: InMemorySpanExporter) -> None:
    """The SDK's default sampler is not called (it samples whatever the settings let
    through); any other one is, and may refuse."""
    tracing = make_tracing(exported, sampler=ParentBased(ALWAYS_OFF))
    assert tracing.start_request("m", "", None, "HTTP") is None
    assert tracing.start_request("m", "", traceparent(), "HTTP") is not None  # follows the client


def test_a_parent_based_sampler_of_its_own_is_asked(exported: InMemorySpanExporter) -> None:
    """Only the SDK's own default sampler is skipped, not one that describes itself alike."""
    asked: list[int] = []

    class Counting(ParentBased):
        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            asked.append(1)
            return super().should_sample(*args, **kwargs)

    tracing = make_tracing(exported, sampler=Counting(ALWAYS_ON))
    assert tracing.start_request("m", "", None, "HTTP") is not None
    assert asked == [1]


class _Stating(Sampler):
    """Samples everything, with a trace state of its own."""

    def should_sample(self, *args: object, **kwargs: object) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE, None, TraceState([("ours", "1")]))

    def get_description(self) -> str:
        return "Stating"


@pytest.mark.parametrize(
    ("sampler", "expected"),
    [(None, [("vendor", "v"), ("other", "2")]), (_Stating(), [("ours", "1")])],
    ids=["default sampler: the client's", "another sampler: its own"],
)
def test_a_requests_trace_state(
    exported: InMemorySpanExporter, sampler: Sampler | None, expected: list[tuple[str, str]]
) -> None:
    tracing = make_tracing(exported, sampler=sampler)
    trace = tracing.start_request(
        "m", "", traceparent() | {"tracestate": "vendor=v,other=2"}, "HTTP"
    )
    assert trace is not None
    trace.end()
    (span,) = exported.get_finished_spans()
    assert list(span.context.trace_state.items()) == expected
    assert trace.carrier()["tracestate"] == ",".join(f"{k}={v}" for k, v in expected)
    assert trace.span_context == span.context


def test_the_engine_continues_a_span_from_its_crossing(exported: InMemorySpanExporter) -> None:
    """What crosses to an engine process (pickled, as on the engine's socket) continues the
    front end's span there: same ids, the sampled flag, the client's trace state, remote."""
    front = make_tracing(InMemorySpanExporter())
    trace = front.start_request("m", "", traceparent() | {"tracestate": "vendor=v"}, "HTTP")
    assert trace is not None
    engine = make_tracing(exported)
    continued = engine.continued(pickle.loads(pickle.dumps(trace.crossing())))
    assert continued is not None
    assert continued.carrier() == trace.carrier()
    assert continued.carrier()["traceparent"].endswith("-01")
    routed = InferenceRequest("m", inputs=[])
    routed.trace = continued
    routed.resolved_version = 1
    continued.routed(routed, time.time_ns())
    (router,) = exported.get_finished_spans()
    mine = trace.span_context
    assert router.parent == SpanContext(
        mine.trace_id, mine.span_id, True, TraceFlags(1), TraceState([("vendor", "v")])
    )
    assert router.context.trace_flags.sampled
    assert list(router.context.trace_state.items()) == [("vendor", "v")]
    for invalid in ((0, 0, False, 1, ()), (mine.trace_id, 0, False, 1, ()), (0, 1, False, 1, ())):
        assert engine.continued(invalid) is None


def test_a_malformed_traceparent_starts_a_new_trace(exported: InMemorySpanExporter) -> None:
    tracing = make_tracing(exported)
    trace = tracing.start_request("m", "", {"traceparent": "garbage"}, "HTTP")
    assert trace is not None
    assert format(trace.span_context.trace_id, "032x") != TRACE_ID


def test_a_control_plane_operation_is_its_own_trace(exported: InMemorySpanExporter) -> None:
    tracing = make_tracing(exported, TraceSettings())  # trace_level OFF: requests only
    with pytest.raises(RuntimeError), tracing.operation("model load", {"triton.model_name": "m"}):
        raise RuntimeError("no such file")
    (span,) = exported.get_finished_spans()
    assert span.name == "model load" and span.parent is None
    assert span.status.description == "no such file"
    assert span.attributes is not None and span.attributes["error.type"] == "RuntimeError"


# -- the spans of the data plane ----------------------------------------------------------------

CONFIG = """
name: "echo"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


class EchoInstance(BackendInstance):
    def __init__(self) -> None:
        self.batches: list[int] = []

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        self.batches.append(len(requests))
        return [
            InferenceResponse(
                r.model_name,
                "1",
                r.id,
                [Tensor("OUT", "INT32", r.inputs[0].shape, r.inputs[0].data)],
            )
            for r in requests
        ]


class EchoBackend(Backend, BackendModel):
    name = "echo"

    def __init__(self) -> None:
        self.instance = EchoInstance()

    def load_model(self, context: ModelContext) -> BackendModel:
        return self

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        return self.instance


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def serve(system: ActorSystem, backend: EchoBackend, batching: str = "") -> Router:
    config = fill_defaults(parse_pbtxt(CONFIG + batching), gpus=0)
    context = ModelContext("echo", 1, config, Path("."), Path("1"), Path("1/model"))
    actor = ModelVersionActor(backend, context)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router = Router()
    router.known.add("echo")
    signature = ModelSignature.from_config(config)
    router.add(ModelHandle("echo", 1, config, signature, actor.scheduler, actor.statistics))
    return router


def request(request_id: str, rows: int = 1) -> InferenceRequest:
    data = np.zeros((rows, 2), np.int32)
    return InferenceRequest("echo", id=request_id, inputs=[Tensor("IN", "INT32", data.shape, data)])


def by_name(
    spans: Iterator[ReadableSpan] | tuple[ReadableSpan, ...],
) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


@pytest.mark.anyio
async def test_one_request_leaves_one_connected_trace(
    system: ActorSystem, exported: InMemorySpanExporter
) -> None:
    router = await serve(system, EchoBackend())
    tracing = make_tracing(exported)
    trace = tracing.start_request("echo", "", traceparent(), "HTTP")
    assert trace is not None
    traced = request("r1")
    traced.trace = trace
    await router.infer(traced)
    trace.end()
    spans = by_name(exported.get_finished_spans())
    assert sorted(spans) == ["InferRequest", "compute", "execute", "queue", "router"]
    (root,) = spans["InferRequest"]
    (execute,) = spans["execute"]
    assert {format(s.context.trace_id, "032x") for v in spans.values() for s in v} == {TRACE_ID}
    for name in ("router", "queue", "execute"):
        assert spans[name][0].parent.span_id == root.context.span_id  # type: ignore[union-attr]
    assert spans["compute"][0].parent.span_id == execute.context.span_id  # type: ignore[union-attr]
    assert spans["router"][0].end_time <= spans["queue"][0].start_time  # type: ignore[operator]
    assert spans["queue"][0].end_time <= execute.start_time  # type: ignore[operator]
    assert execute.start_time <= spans["compute"][0].start_time  # type: ignore[operator]
    assert spans["queue"][0].attributes == {
        "triton.model_name": "echo",
        "triton.model_version": "1",
    }
    assert execute.attributes is not None
    assert execute.attributes["triton.batch_size"] == 1
    assert [format(link.context.span_id, "016x") for link in execute.links] == [
        format(root.context.span_id, "016x")
    ]


@pytest.mark.anyio
async def test_an_untraced_request_leaves_nothing(
    system: ActorSystem, exported: InMemorySpanExporter
) -> None:
    router = await serve(system, EchoBackend())
    make_tracing(exported)
    await router.infer(request("plain"))
    assert exported.get_finished_spans() == ()


class FailingInstance(EchoInstance):
    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        raise RuntimeError("the batch breaks")


@pytest.mark.anyio
@pytest.mark.parametrize("failing", [False, True], ids=["answered", "failed"])
async def test_a_batchs_spans_are_closed_before_its_answers_leave(
    system: ActorSystem, exported: InMemorySpanExporter, failing: bool
) -> None:
    """An engine sends a traced request's answer as soon as it has it, and the front end's span
    ends when it arrives: the stages' spans must be over by then."""
    backend = EchoBackend()
    if failing:
        backend.instance = FailingInstance()
    router = await serve(system, backend)
    trace = make_tracing(exported).start_request("echo", "", None, "HTTP")
    assert trace is not None
    traced = request("r1")
    traced.trace = trace
    closed_at_answer: list[set[str]] = []
    answered = anyio.Event()

    def note(_: object) -> None:
        closed_at_answer.append({span.name for span in exported.get_finished_spans()})
        answered.set()

    router.submit(traced).add_done_callback(note)
    with anyio.fail_after(30):  # (a hang's guard)
        await answered.wait()
    stages = {"router", "queue", "execute"} | (set() if failing else {"compute"})
    assert closed_at_answer == [stages]


class _RefusesBatches(SimpleSpanProcessor):
    """A span processor that fails on a batch's span."""

    def on_end(self, span: ReadableSpan) -> None:
        if span.name == "execute":
            raise RuntimeError("this processor is broken")


@pytest.mark.anyio
async def test_a_span_processor_that_fails_does_not_keep_a_batchs_answers_back(
    system: ActorSystem, exported: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    router = await serve(system, EchoBackend())
    tracing = make_tracing(exported)
    tracing.add_processor(_RefusesBatches(InMemorySpanExporter()))
    trace = tracing.start_request("echo", "", None, "HTTP")
    assert trace is not None
    traced = request("r1")
    traced.trace = trace
    with anyio.fail_after(30):  # (a hang's guard: unanswered, it would wait for ever)
        response = await router.infer(traced)
    assert response.id == "r1"
    assert "failed on span 'execute'" in caplog.text


@pytest.mark.anyio
async def test_a_request_the_router_refuses_has_a_failed_router_span(
    system: ActorSystem, exported: InMemorySpanExporter
) -> None:
    router = await serve(system, EchoBackend())
    trace = make_tracing(exported).start_request("echo", "", None, "HTTP")
    assert trace is not None
    bad = request("bad", rows=9)  # over max_batch_size
    bad.trace = trace
    with pytest.raises(TritonError) as caught:
        await router.infer(bad)
    trace.end(caught.value)
    spans = by_name(exported.get_finished_spans())
    assert sorted(spans) == ["InferRequest", "router"]
    assert "batch-size must be <= 8" in str(spans["router"][0].status.description)
    assert spans["InferRequest"][0].attributes["error.type"] == "INVALID_ARG"  # type: ignore[index]


@pytest.mark.anyio
async def test_a_batch_links_every_request_it_carried(
    system: ActorSystem, exported: InMemorySpanExporter
) -> None:
    backend = EchoBackend()
    # A long queue delay and a preferred size of 3: the three requests run as one batch.
    router = await serve(
        system,
        backend,
        "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 60000000 }",
    )
    tracing = make_tracing(exported)
    traces = []

    async def one(index: int) -> None:
        trace = tracing.start_request("echo", "", None, "GRPC")
        assert trace is not None
        traces.append(trace)
        traced = request(f"r{index}")
        traced.trace = trace
        await router.infer(traced)
        trace.end()

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as group:
            for index in range(3):
                group.start_soon(one, index)
    assert backend.instance.batches == [3]
    spans = by_name(exported.get_finished_spans())
    (execute,) = spans["execute"]
    roots = {span.context.span_id: span for span in spans["InferRequest"]}
    assert len(roots) == 3 and len({span.context.trace_id for span in roots.values()}) == 3
    assert {link.context.span_id for link in execute.links} == set(roots)
    assert execute.attributes is not None
    assert execute.attributes["triton.batch_size"] == 3
    assert execute.attributes["triton.batch_requests"] == 3
    # The batch lives in its first request's trace; the others link back to it.
    assert execute.parent is not None and execute.parent.span_id in roots
    others = [span for span in roots.values() if span.context.span_id != execute.parent.span_id]
    for span in others:
        assert [link.context.span_id for link in span.links] == [execute.context.span_id]
    assert len(spans["queue"]) == 3


def test_a_python_model_reads_the_context_as_triton_gives_it() -> None:
    from tritonactor.backends.python import triton_python_backend_utils as pb_utils

    traced = pb_utils.InferenceTrace({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}, key=3)
    # Compact JSON, as Triton's bindings write it.
    assert traced.get_context() == f'{{"traceparent":"00-{TRACE_ID}-{PARENT_ID}-01"}}'
    assert pb_utils.InferenceRequest("m").trace().get_context() is None
    # A BLS request built with a request's trace carries it on.
    assert pb_utils.InferenceRequest("m", trace=traced).trace() is traced
