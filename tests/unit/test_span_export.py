"""Spans exported by a process of their own (observability/span_export.py and
span_exporter.py): a record carries everything the SDK's span said, the exporter process
delivers what it was sent to a real OTLP receiver, and it ends with its serving process,
however that ends."""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from tests.otlp_receiver import OtlpReceiver
from tests.unit.test_otlp import _spans, request_spans
from tritonactor.observability import span_export, span_exporter
from tritonactor.observability.exporters import build_exporters, service_resource
from tritonactor.observability.otlp import _Encoder, encode_export_request
from tritonactor.observability.span_export import (
    SpanShipper,
    child_record,
    context_fields,
    record_of,
)
from tritonactor.observability.span_exporter import export_batch, span_of
from tritonactor.observability.trace_settings import TraceSettings
from tritonactor.observability.tracing import Tracing

ROOT = Path(__file__).resolve().parents[2]


def rebuilt(span: ReadableSpan) -> ReadableSpan:
    """`span` through a record and back, with its own resource and scope (an exporter process
    has the serving process's)."""
    return span_of(record_of(span), span.resource, span.instrumentation_scope)  # type: ignore[arg-type]


def test_the_servers_spans_survive_the_trip() -> None:
    spans = request_spans()
    assert encode_export_request([rebuilt(s) for s in spans]) == encode_export_request(spans)
    assert encode_spans([rebuilt(s) for s in spans]) == encode_spans(spans)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_spans(), min_size=1, max_size=4))
def test_any_span_survives_the_trip(spans: list[ReadableSpan]) -> None:
    scope = InstrumentationScope("tritonactor", "1")
    spans = [
        ReadableSpan(
            s.name,
            s.context,
            s.parent,
            s.resource,
            s.attributes,
            s.events,
            s.links,
            s.kind,
            status=s.status,
            start_time=s.start_time,
            end_time=s.end_time,
            instrumentation_scope=scope,
        )
        for s in spans
    ]
    assert encode_spans([rebuilt(s) for s in spans]) == encode_spans(spans)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    for variable in [v for v in os.environ if v.startswith("OTEL_")]:
        monkeypatch.delenv(variable)
    # The exporter process inherits the environment: it exports here, without delay.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    yield receiver
    receiver.close()


def shipping_tracing(**kwargs: object) -> Tracing:
    provider = TracerProvider(resource=service_resource(), shutdown_on_exit=False)
    tracing = Tracing(provider, TraceSettings(level=("TIMESTAMPS",), rate=1))
    tracing.ship_to(SpanShipper(("otlp",), "http/protobuf", provider.resource, **kwargs))  # type: ignore[arg-type]
    return tracing


def sent(receiver: OtlpReceiver) -> list[bytes]:
    return sorted(
        span.SerializeToString()
        for message in receiver.messages
        for resource_spans in message.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    )


def test_the_exporter_process_delivers_request_and_control_plane_spans(
    receiver: OtlpReceiver,
) -> None:
    """What a shipping `Tracing` exports is what it exports in-process, byte for byte (both at
    once here), and all of it has arrived once `shutdown` returns."""
    tracing = shipping_tracing()
    shipper = tracing._shipper
    assert shipper is not None
    in_process = request_spans(count=20, tracing=tracing)
    assert any(s.status.status_code.value == 2 for s in in_process)  # one failed
    assert any(s.name == "load" and s.events for s in in_process)  # the control plane's
    tracing.shutdown()
    assert shipper.process.returncode == 0
    assert sent(receiver) == sorted(
        span.SerializeToString()
        for resource_spans in encode_spans(in_process).resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    )
    for message in receiver.messages:
        for resource_spans in message.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert service["service.name"] == "tritonactor"
            assert [s.scope.name for s in resource_spans.scope_spans] == ["tritonactor"]


def test_spans_past_the_bound_are_dropped_and_counted(receiver: OtlpReceiver) -> None:
    # A shipping thread that never sends on its own: only `shutdown` sends.
    tracing = shipping_tracing(interval_s=3600, max_pending=3)
    spans = request_spans(count=1)[:5]
    assert len(spans) == 5
    for span in spans:
        tracing.provider._active_span_processor.on_end(span)
    shipper = tracing._shipper
    assert shipper is not None and shipper.dropped == 2
    tracing.shutdown()
    assert len(sent(receiver)) == 3


def test_the_exporter_process_outlasts_sigint_and_sigterm(receiver: OtlpReceiver) -> None:
    """A terminal's Ctrl-C or a process manager's SIGTERM goes to a whole process group: the
    exporter process ignores both from its start (signalled here at once), and still exports
    what its serving process sends it last."""
    tracing = shipping_tracing()
    shipper = tracing._shipper
    assert shipper is not None
    os.kill(shipper.process.pid, signal.SIGINT)
    os.kill(shipper.process.pid, signal.SIGTERM)
    spans = request_spans(count=2)
    for span in spans:
        tracing.provider._active_span_processor.on_end(span)
    tracing.shutdown()
    assert shipper.process.returncode == 0
    assert len(sent(receiver)) == len(spans)


def test_a_gone_exporter_process_is_replaced(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An exporter process that dies (killed here) is replaced at the next batch, without a
    zombie left behind: the spans that reach the new one are exported (they were all dropped
    for the serving process's life)."""
    monkeypatch.setattr(span_export, "RESPAWN_FIRST_S", 0.0)  # at once, not after a second
    tracing = shipping_tracing(interval_s=0.01)
    shipper = tracing._shipper
    assert shipper is not None
    first = shipper.process
    first.kill()
    first.wait()
    span = request_spans(count=1)[0]
    deadline = time.monotonic() + 60  # a bound on a failure, not a wait for the clock
    while shipper.process is first:
        assert time.monotonic() < deadline, "the exporter process was never replaced"
        tracing.provider._active_span_processor.on_end(span)
        shipper._wake.set()
    assert not shipper._broken
    tracing.provider._active_span_processor.on_end(span)
    tracing.shutdown()
    assert shipper.process.returncode == 0
    assert sent(receiver)  # what the new one was sent
    assert "the span exporter process has gone" in caplog.text


def test_an_exporter_that_keeps_going_is_retried_less_and_less(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One that lasts less than RESPAWN_STEADY_S doubles the wait before the next, up to
    RESPAWN_MOST_S; one that lasted resets it."""
    monkeypatch.setattr(span_export, "RESPAWN_FIRST_S", 0.0)
    tracing = shipping_tracing(interval_s=3600)
    shipper = tracing._shipper
    assert shipper is not None
    shipper._respawn_wait_s = 1.0
    shipper._started -= 2.0  # it lived 2 s: past the wait, short of steady
    assert shipper._replaced(OSError("gone"))
    assert shipper._respawn_wait_s == 2.0
    assert not shipper._replaced(OSError("gone again"))  # too soon: 2 s not passed
    shipper._started -= span_export.RESPAWN_STEADY_S
    assert shipper._replaced(OSError("gone after a while"))
    assert shipper._respawn_wait_s == span_export.RESPAWN_FIRST_S
    tracing.shutdown()


def test_an_exporter_that_cannot_be_started_is_tried_again(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that fails (a passing fork or fd shortage; a missing interpreter here) does not
    end tracing for the process's life: the next try after the wait starts one."""
    monkeypatch.setattr(span_export, "RESPAWN_FIRST_S", 0.0)
    tracing = shipping_tracing(interval_s=3600)
    shipper = tracing._shipper
    assert shipper is not None
    interpreter = shipper._command[0]
    shipper._command[0] = "/nonexistent/python"
    shipper.process.kill()
    assert not shipper._replaced(OSError("gone"))
    assert not shipper._broken  # not given up
    shipper._command[0] = interpreter
    shipper._started -= span_export.RESPAWN_MOST_S  # past any wait
    assert shipper._replaced(OSError("still gone"))
    span = request_spans(count=1)[0]
    tracing.provider._active_span_processor.on_end(span)
    tracing.shutdown()
    assert shipper.process.returncode == 0
    assert len(sent(receiver)) == 1


def test_spans_lost_with_a_gone_exporter_are_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose send finds the exporter gone (and none may start yet) counts its spans
    once, those that do not pickle included (they were counted as they were left out)."""
    tracing = shipping_tracing(interval_s=3600)
    shipper = tracing._shipper
    assert shipper is not None
    shipper.process.kill()
    shipper.process.wait()
    shipper._respawn_wait_s = 3600.0  # no replacement now
    fields = record_of(request_spans(count=1)[0])
    unpicklable = (*fields[:4], {"lock": threading.Lock()}, *fields[5:])
    deadline = time.monotonic() + 60  # a bound on a failure: the socket's end is seen
    while shipper.dropped == 0:
        assert time.monotonic() < deadline, "sending to a dead exporter process never failed"
        shipper._send([fields, unpicklable])
    assert shipper.dropped in (2, 4)  # one batch, or two if the first went into the buffer
    assert shipper.dropped % 2 == 0
    tracing.shutdown()


def test_the_exporter_process_ends_with_a_serving_process_that_is_killed(
    receiver: OtlpReceiver,
) -> None:
    """SIGKILL leaves no time to shut down: the socket closes with the process, and the
    exporter process (stopped meanwhile, so that it reads only once its serving process has
    gone) exports what it had been sent and ends."""
    script = (
        "import os, signal, sys\n"
        "from tritonactor.observability.exporters import service_resource\n"
        "from tritonactor.observability.span_export import SpanShipper, record_of\n"
        "from tests.unit.test_otlp import request_spans\n"
        "shipper = SpanShipper(('otlp',), 'http/protobuf', service_resource(), 3600)\n"
        "os.kill(shipper.process.pid, signal.SIGSTOP)\n"
        "shipper._send([record_of(request_spans(count=1)[0])])\n"  # in the socket now
        "print(shipper.process.pid, flush=True)\n"
        "sys.stdin.read()\n"  # until the test has the exporter's pid: then killed
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    serving = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert serving.stdout is not None and serving.stdin is not None
    exporter = int(serving.stdout.readline())
    watch = os.pidfd_open(exporter)
    serving.stdin.close()  # the serving process kills itself now
    assert serving.wait(timeout=60) == -signal.SIGKILL
    assert receiver.spans() == []
    os.kill(exporter, signal.SIGCONT)
    # The exporter process's own end, an event: its pidfd becomes readable when it exits.
    ready, _, _ = select.select([watch], [], [], 60)
    os.close(watch)
    assert ready, "the exporter process outlived its serving process"
    assert len(receiver.wait_for(lambda spans: len(spans) >= 1)) == 1


def test_shutdown_is_bounded_when_the_exporter_process_does_not_read(
    receiver: OtlpReceiver,
) -> None:
    """An exporter process that reads nothing (stopped here; a collector that never answers
    does the same) cannot keep the server from stopping: past the time, what is left is
    dropped and the process killed."""
    tracing = shipping_tracing(interval_s=3600)
    shipper = tracing._shipper
    assert shipper is not None
    os.kill(shipper.process.pid, signal.SIGSTOP)
    fields = record_of(request_spans(count=1)[0])
    for index in range(200):  # 20 MB (each its own: pickle writes a repeated value once)
        shipper.put((*fields[:4], {"blob": f"{index:08}" * 12_500}, *fields[5:]))
    shipper.shutdown(wait_s=1)
    assert shipper.process.returncode == -signal.SIGKILL
    assert shipper.dropped == 200  # the one batch could not be sent whole


def test_shutdown_leaves_an_exporter_still_exporting_to_finish_by_itself(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector that accepts and never answers holds an export up to its own time limit:
    `shutdown` does not wait that out (a server's stop took 33 s), it leaves the exporter
    process exporting by itself, which ends SHUTDOWN_TIMEOUT_S after its serving process at
    the latest."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), answers nothing
    try:
        monkeypatch.setenv(
            "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}"
        )
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "600")
        tracing = shipping_tracing(interval_s=3600)
        shipper = tracing._shipper
        assert shipper is not None
        for span in request_spans(count=1):
            tracing.provider._active_span_processor.on_end(span)
        shipper.shutdown(wait_s=1)
        assert shipper.process.poll() is None  # still exporting: left to it
        assert shipper.dropped == 0
        shipper.process.kill()
        shipper.process.wait()
    finally:
        silent.close()


def test_batches_are_exported_at_most_max_export_batch_size_at_a_time(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
    tracing = shipping_tracing(interval_s=3600)  # one message: the exporter process splits it
    spans = request_spans(count=1)
    for span in spans:
        tracing.provider._active_span_processor.on_end(span)
    tracing.shutdown()
    sizes = [
        sum(len(scope.spans) for r in message.resource_spans for scope in r.scope_spans)
        for message in receiver.messages
    ]
    assert sum(sizes) == len(spans) > 2 and max(sizes) == 2


def test_full_batches_go_at_once_and_the_rest_when_more_comes_or_at_the_end() -> None:
    """Records are exported `size` at a time as soon as there are that many; those left wait
    (for the delay, an hour here) for more to come; the end sends what is left."""
    more = threading.Event()

    def messages() -> Iterator[list[Any]]:
        yield [1, 2, 3, 4, 5]
        more.wait()  # (the two full batches were exported before this message came)
        yield [6]
        yield [7]

    batches = span_exporter._batches(messages(), size=2, delay_s=3600)
    assert next(batches) == [1, 2]
    assert next(batches) == [3, 4]
    more.set()
    assert list(batches) == [[5, 6], [7]]


def test_what_waits_is_exported_once_the_oldest_has_waited_the_delay() -> None:
    """A record no other follows is not held for ever: it goes once it has waited the delay,
    while the socket is still open."""
    ended = threading.Event()

    def messages() -> Iterator[list[Any]]:
        yield [1]
        yield [2]
        ended.wait()

    batches = span_exporter._batches(messages(), size=512, delay_s=0.05)
    assert next(batches) == [1, 2]  # (the second came before the first had waited)
    ended.set()
    assert list(batches) == []


def test_a_delay_meaning_never_holds_records_until_the_end() -> None:
    """A delay longer than a wait can take (10^13 ms, as OTEL_BSP_SCHEDULE_DELAY may say) is
    not an error that ends the exporter process and every span with it."""

    def messages() -> Iterator[list[Any]]:
        yield [1]
        yield [2, 3]

    assert list(span_exporter._batches(messages(), size=2, delay_s=1e10)) == [[1, 2], [3]]


def test_the_shipping_thread_sends_every_tenth_of_a_second_or_sooner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A serving process holds its spans 0.1 s at most, whatever OTEL_BSP_SCHEDULE_DELAY (the
    exporter process's wait, 5 s unless set); a shorter delay ships sooner."""
    for delay, interval in ((None, 0.1), ("600000", 0.1), ("50", 0.05)):
        if delay is None:
            monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY", raising=False)
        else:
            monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", delay)
        shipper = SpanShipper(("console",), "http/protobuf", service_resource())
        try:
            assert shipper._interval_s == interval
        finally:
            shipper.shutdown()


@pytest.mark.parametrize(
    ("value", "expected"), [("", 7), ("250", 250), ("0", 7), ("-3", 7), ("soon", 7)]
)
def test_a_setting_is_a_positive_integer_or_the_default(value: str, expected: int) -> None:
    from tritonactor.observability.span_export import _setting

    assert _setting({"OTEL_BSP_SCHEDULE_DELAY": value}, "OTEL_BSP_SCHEDULE_DELAY", 7) == expected


def test_the_resource_is_the_serving_processes(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter process is told the resource rather than working it out again."""
    provider = TracerProvider(
        resource=Resource({"service.name": "told", "x": 1}), shutdown_on_exit=False
    )
    tracing = Tracing(provider, TraceSettings(level=("TIMESTAMPS",), rate=1))
    monkeypatch.setenv("OTEL_SERVICE_NAME", "worked-out")
    tracing.ship_to(SpanShipper(("otlp",), "http/protobuf", provider.resource))
    with tracing.operation("load", {"triton.model_name": "m"}):
        pass
    tracing.shutdown()
    (span,) = receiver.wait_for(lambda spans: len(spans) >= 1)
    assert span.service_name == "told"


def test_a_span_nothing_refers_to_gets_its_id_in_the_exporter_process() -> None:
    """A stage span (router, queue, compute) leaves without an id; it gets a new one, in its
    parent's trace, with the parent's flags and trace state."""
    parent = SpanContext(7, 8, True, TraceFlags(1), TraceState([("vendor", "v")]))
    fields = child_record(
        "router", context_fields(parent), 1, 2, {"k": "v"}, Status(StatusCode.ERROR, "bad")
    )
    scope = InstrumentationScope("tritonactor", "1")
    first, second = (span_of(fields, Resource({}), scope) for _ in range(2))
    for span in (first, second):
        context = span.get_span_context()
        assert context is not None and context.span_id not in (0, 8)
        assert (context.trace_id, context.is_remote, context.trace_flags) == (7, False, 1)
        assert dict(context.trace_state) == {"vendor": "v"}
        assert span.parent == parent and span.parent.is_remote
        assert span.status.status_code is StatusCode.ERROR and span.status.description == "bad"
        assert dict(span.attributes or {}) == {"k": "v"}
    assert first.get_span_context().span_id != second.get_span_context().span_id  # type: ignore[union-attr]


def test_a_span_that_does_not_pickle_costs_only_itself(receiver: OtlpReceiver) -> None:
    tracing = shipping_tracing(interval_s=3600)
    shipper = tracing._shipper
    assert shipper is not None
    good, bad = request_spans(count=1)[:2]
    shipper.put(record_of(good))
    fields = record_of(bad)
    shipper.put((*fields[:4], {"odd": threading.Lock()}, *fields[5:]))
    tracing.shutdown()
    assert shipper.dropped == 1
    assert len(sent(receiver)) == 1
    tracing.provider._active_span_processor.on_end(good)  # after shutdown: dropped, no error
    assert shipper.dropped == 2


# -- records written straight to OTLP (the exporter process's way with the OTLP/HTTP exporter) --


class _CountingIds(RandomIdGenerator):
    """Span ids 1, 2, 3, ...: two of them give two encodings the same new ids."""

    def __init__(self) -> None:
        self._next = 0

    def generate_span_id(self) -> int:
        self._next += 1
        return self._next


_RESOURCE = Resource({"service.name": "tritonactor", "host": "h"}, "https://schema/r")
_SCOPE = InstrumentationScope("tritonactor", "1", "https://schema/s")


def written_as_the_sdk_writes(batch: list[Any]) -> None:
    """The records' bytes, straight from the records, are those of the SDK spans `span_of`
    makes of them: as the SDK's encoder builds them, and as otlp.py writes those spans."""
    direct = _Encoder().records(batch, _RESOURCE, _SCOPE, _CountingIds().generate_span_id)
    ids = _CountingIds()
    spans = [span_of(fields, _RESOURCE, _SCOPE, ids) for fields in batch]
    assert ExportTraceServiceRequest.FromString(direct) == encode_spans(spans)
    assert direct == encode_export_request(spans)


def test_the_servers_records_are_written_as_the_sdk_writes_their_spans() -> None:
    records = [record_of(span) for span in request_spans()]
    parent = SpanContext(7, 8, True, TraceFlags(1), TraceState([("vendor", "v")]))
    records += [
        child_record(
            "router", context_fields(parent), 1, 2, {"k": "v"}, Status(StatusCode.ERROR, "bad")
        ),
        child_record("queue", context_fields(parent), 3, 4, None, Status(StatusCode.OK)),
        child_record("compute", context_fields(parent), 5, 6, {"n": 1}, Status(StatusCode.UNSET)),
        # An OK status with a description, which the SDK's Status drops (errors only keep one).
        ("ok", None, (7, 8, False, 1, ()), 0, None, (), (), 7, 8, 1, "dropped"),
    ]
    written_as_the_sdk_writes(records)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_spans(), min_size=1, max_size=4), st.booleans())
def test_any_record_is_written_as_the_sdk_writes_its_span(
    spans: list[ReadableSpan], child: bool
) -> None:
    records = [record_of(span) for span in spans]
    if child:  # a record without an id, under the first's context
        context = spans[0].get_span_context()
        assert context is not None
        records.append(
            child_record("stage", context_fields(context), 1, 2, {"a": 1}, Status(StatusCode.OK))
        )
    if encode_export_request(spans) is None:  # values only the SDK writes: nor from records
        with pytest.raises(Exception):  # noqa: B017 (export_records answers None for any)
            _Encoder().records(records, _RESOURCE, _SCOPE, _CountingIds().generate_span_id)
        return
    written_as_the_sdk_writes(records)


def test_records_the_direct_encoder_cannot_write_go_the_sdks_way(receiver: OtlpReceiver) -> None:
    """A value OTLP's AnyValue does not hold (an integer past int64): the OTLP/HTTP exporter
    sends nothing for the records, and `export_batch` sends their SDK spans instead."""
    parent = SpanContext(7, 8, False, TraceFlags(1))
    odd = child_record(
        "router", context_fields(parent), 1, 2, {"big": 1 << 64, "k": "v"}, Status(StatusCode.OK)
    )
    plain = child_record("queue", context_fields(parent), 3, 4, {"k": "v"}, Status(StatusCode.OK))
    (exporter,) = build_exporters(["otlp"], "http/protobuf")
    assert (
        exporter.export_records([odd, plain], _RESOURCE, _SCOPE, _CountingIds().generate_span_id)
        is None
    )  # type: ignore[attr-defined]
    export_batch([exporter], [odd, plain], _RESOURCE, _SCOPE, _CountingIds())
    spans = receiver.wait_for(lambda spans: len(spans) >= 2)
    assert sorted(span.name for span in spans) == ["queue", "router"]
    exporter.shutdown()


class _Collecting(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def _two_records() -> list[Any]:
    parent = SpanContext(7, 8, False, TraceFlags(1))
    return [
        child_record("router", context_fields(parent), 1, 2, {"k": "v"}, Status(StatusCode.OK)),
        child_record("queue", context_fields(parent), 3, 4, {"k": "v"}, Status(StatusCode.OK)),
    ]


def test_the_one_otlp_http_exporter_gets_the_records_themselves(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_spans(*args: object) -> ReadableSpan:
        raise AssertionError("SDK spans were made")

    monkeypatch.setattr(span_exporter, "span_of", no_spans)
    (exporter,) = build_exporters(["otlp"], "http/protobuf")
    export_batch([exporter], _two_records(), _RESOURCE, _SCOPE, _CountingIds())
    spans = receiver.wait_for(lambda spans: len(spans) >= 2)
    assert sorted(span.name for span in spans) == ["queue", "router"]
    exporter.shutdown()


def test_with_another_exporter_each_gets_the_sdk_spans(receiver: OtlpReceiver) -> None:
    (otlp,) = build_exporters(["otlp"], "http/protobuf")
    other = _Collecting()
    export_batch([otlp, other], _two_records(), _RESOURCE, _SCOPE, _CountingIds())
    spans = receiver.wait_for(lambda spans: len(spans) >= 2)
    assert sorted(span.name for span in spans) == ["queue", "router"]
    assert sorted(span.name for span in other.spans) == ["queue", "router"]
    otlp.shutdown()


def test_a_post_that_fails_is_logged_and_not_sent_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (exporter,) = build_exporters(["otlp"], "http/protobuf")
    posts: list[bytes] = []

    def failing(data: bytes) -> object:
        posts.append(data)
        raise ConnectionError("the collector hung up")

    monkeypatch.setattr(exporter, "_poster", failing)
    monkeypatch.setattr(exporter, "export", lambda spans: pytest.fail("sent again"))
    with caplog.at_level(logging.ERROR, logger=span_exporter.__name__):
        export_batch([exporter], _two_records(), _RESOURCE, _SCOPE, _CountingIds())
    assert len(posts) == 1
    assert "exporting 2 spans failed" in caplog.text
    exporter.shutdown()


def test_a_record_that_is_not_one_costs_only_itself(caplog: pytest.LogCaptureFixture) -> None:
    """A malformed record (never sent by this server) is logged and dropped: the others of its
    batch are exported, and the exporter process goes on."""
    broken = ("broken", None, None, 99, None, (), (), 1, 2, 0, None)  # no context, no parent
    other = _Collecting()
    with caplog.at_level(logging.ERROR, logger=span_exporter.__name__):
        export_batch([other], [broken, *_two_records()], _RESOURCE, _SCOPE, _CountingIds())
    assert sorted(span.name for span in other.spans) == ["queue", "router"]
    assert "a span record that cannot be read" in caplog.text
