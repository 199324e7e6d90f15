"""Finished spans exported by a process of their own.

Encoding a traced request's spans as OTLP protobuf and posting them costs about as much CPU as
making them, and it ran in the SDK's export thread, which takes the interpreter lock from the
event loop in turns (docs/benchmarks.md, "Tracing"). Here a serving process only writes each
finished span down as a plain tuple (`record`, `child_record`), and a thread of its own
pickles what has gathered, every SHIP_INTERVAL_MS, onto a socket to an exporter process
(span_exporter.py, run by `_LAUNCH`), which exports them with the exporters the same OTEL_*
variables configure, OTEL_BSP_MAX_EXPORT_BATCH_SIZE at a time or once the oldest has waited
OTEL_BSP_SCHEDULE_DELAY.

What a serving process keeps is bounded: past OTEL_BSP_MAX_QUEUE_SIZE spans waiting for the
socket, new spans are dropped and counted (a slow collector never holds a request up, as with
the SDK's queue). The exporter process ends when the socket closes: `SpanShipper.shutdown`
sends what is left and waits SHUTDOWN_WAIT_S for it to export (longer, it exports alone), and
a serving process that dies closes the socket too; either way what it had sent is exported
for SHUTDOWN_TIMEOUT_S at most once its serving process has ended. It ignores
SIGINT and SIGTERM from its start, which a terminal or a process manager sends to a whole
process group, so that the serving process's last spans still reach it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

import tritonactor
from tritonactor import __version__

log = logging.getLogger(__name__)

# How long the exporter process lets a span wait for others to be exported with
# (OTEL_BSP_SCHEDULE_DELAY, ms: the SDK's and Triton's 5 s), how many spans may wait in a
# serving process for its shipping thread (OTEL_BSP_MAX_QUEUE_SIZE) and how many spans the
# exporter process exports at a time (OTEL_BSP_MAX_EXPORT_BATCH_SIZE), unless those variables
# say otherwise. The shipping thread sends what has gathered every SHIP_INTERVAL_MS, or every
# OTEL_BSP_SCHEDULE_DELAY when that is shorter: a serving process holds its spans for
# a tenth of a second at most, and the exporter process waits for the rest.
SCHEDULE_DELAY_MS = 5000
SHIP_INTERVAL_MS = 100
MAX_QUEUE_SIZE = 65536
MAX_EXPORT_BATCH_SIZE = 512
# How long an exporter process goes on exporting what it was sent once its serving process has
# ended (span_exporter.py), and how long `shutdown` waits for it to take the last spans and
# export them before it leaves it to that.
SHUTDOWN_TIMEOUT_S = 30.0
SHUTDOWN_WAIT_S = 3.0
# An exporter process that goes is replaced (`SpanShipper._replaced`): at the soonest this long
# after it started, twice that for the next one if it lasted less than RESPAWN_STEADY_S, and
# so on up to RESPAWN_MOST_S.
RESPAWN_FIRST_S = 1.0
RESPAWN_STEADY_S = 60.0
RESPAWN_MOST_S = 60.0

# The exporter process never takes SIGINT or SIGTERM: it starts with both blocked (a thread's
# signal mask passes through fork and exec, and Python leaves it as it finds it), since a
# terminal's Ctrl-C and a process manager's SIGTERM reach every process of the group, and it
# ends when the serving process closes the socket, after its last spans.
_HELD = {signal.SIGINT, signal.SIGTERM}
# What the exporter process runs (span_exporter.py).
EXPORTER_MODULE = "tritonactor.observability.span_exporter"
# It imports the serving process's tritonactor (from `_PACKAGE_ROOT`, which may be
# site-packages itself: on sys.path only for that import, never ahead of the standard library
# for the rest) and nothing from the working directory (`-P`).
_LAUNCH = (
    "import runpy, sys\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "import tritonactor\n"
    "del sys.path[0]\n"
    f"runpy.run_module({EXPORTER_MODULE!r}, run_name='__main__', alter_sys=True)\n"
)
_PACKAGE_ROOT = str(Path(tritonactor.__file__).resolve().parent.parent)
_LENGTH = struct.Struct("<Q")
_SOCKET_BUFFER = 4 * 1024 * 1024
_SCOPE = ("tritonactor", __version__)

# A span, as a tuple of plain values (pickled in batches):
# (name, context, parent, kind, attributes, events, links, start, end, status code, description)
# where a context is (trace id, span id, is remote, trace flags, trace state's (key, value)
# pairs), parent is a context or None, kind is SpanKind's value, attributes a dict or None,
# events (name, timestamp, attributes) and links (context, attributes) tuples. A context of
# None is a new span of the parent's trace: the exporter process gives it its id.
Record = tuple[Any, ...]
Context = tuple[int, int, bool, int, tuple[tuple[str, str], ...]]
_INTERNAL = SpanKind.INTERNAL.value
_NO_STATE = TraceState()
_FLAGS = [TraceFlags(flags) for flags in range(256)]
_KINDS = {kind.value: kind for kind in SpanKind}
_UNSET = Status(StatusCode.UNSET)
_IDS = RandomIdGenerator()


def _setting(environ: Mapping[str, str], variable: str, default: int, warn: bool = True) -> int:
    """A positive integer from `variable`, else `default` (a value that is not one is logged,
    as the SDK does, unless `warn` is False: the exporter's process warns of it)."""
    text = environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        if warn:
            log.warning("%s=%r is not a positive integer: using %d", variable, text, default)
        return default
    return value


def exporter_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """Where spans go and how they are batched, as Triton's trace settings show them in its
    OpenTelemetry mode (`url`, `bsp_*`, in its order): the OTLP traces endpoint the exporter
    uses ("" where no OTLP exporter is configured) and the batch settings in force."""
    return {
        "url": _traces_url(environ),
        "bsp_max_export_batch_size": str(
            _setting(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", MAX_EXPORT_BATCH_SIZE, False)
        ),
        "bsp_schedule_delay": str(
            _setting(environ, "OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS, False)
        ),
        "bsp_max_queue_size": str(
            _setting(environ, "OTEL_BSP_MAX_QUEUE_SIZE", MAX_QUEUE_SIZE, False)
        ),
    }


def _traces_url(environ: Mapping[str, str]) -> str:
    """The OTLP exporter's traces endpoint, as the SDK works it out: the traces variable as it
    is; else the general one, with `/v1/traces` over HTTP; else the SDK's default where an OTLP
    exporter is named. "" where none exports over OTLP."""
    names = environ.get("OTEL_TRACES_EXPORTER", "").lower()  # as tracing_env.py reads it
    named = [e.strip() for e in names.split(",") if e.strip()]
    if named and "otlp" not in named:
        return ""
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "http/protobuf"
    ).lower()
    grpc = protocol == "grpc"
    url = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if url:
        return url
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base if grpc else base.rstrip("/") + "/v1/traces"
    if not named:
        return ""  # no exporter at all: nothing is traced
    return "http://localhost:4317" if grpc else "http://localhost:4318/v1/traces"


def context_fields(context: SpanContext) -> Context:
    """A span context as a record holds it (see `Record`)."""
    state = context.trace_state
    return (
        context.trace_id,
        context.span_id,
        context.is_remote,
        int(context.trace_flags),
        tuple(state.items()) if state else (),
    )


def span_context(fields: Context) -> SpanContext:
    """The span context a record's context stands for."""
    trace_id, span_id, is_remote, flags, state = fields
    return SpanContext(
        trace_id, span_id, is_remote, _FLAGS[flags], TraceState(list(state)) if state else _NO_STATE
    )


def record(
    name: str,
    context: SpanContext,
    parent: SpanContext | None,
    kind: SpanKind,
    attributes: Mapping[str, Any] | None,
    links: Sequence[Link],
    start: int,
    end: int,
    status: Status,
    events: Sequence[Event] = (),
) -> Record:
    """A finished span as a record (see `Record`). `attributes` is kept as it is, not copied:
    the caller does not change it any more."""
    return (
        name,
        context_fields(context),
        None if parent is None else context_fields(parent),
        kind.value,
        attributes or None,
        tuple((e.name, e.timestamp, dict(e.attributes or {}) or None) for e in events)
        if events
        else (),
        tuple((context_fields(link.context), dict(link.attributes or {}) or None) for link in links)
        if links
        else (),
        start,
        end,
        status.status_code.value,
        status.description,
    )


def child_record(
    name: str,
    parent: Context,
    start: int,
    end: int,
    attributes: Mapping[str, Any] | None,
    status: Status,
    context: Context | None = None,
) -> Record:
    """A finished INTERNAL span under `parent` (a record's context), without events or links;
    without a `context`, nothing refers to it and the exporter process chooses its id."""
    return (
        name,
        context,
        parent,
        _INTERNAL,
        attributes or None,
        (),
        (),
        start,
        end,
        status.status_code.value,
        status.description,
    )


def record_of(span: ReadableSpan) -> Record:
    """An SDK span (the control plane's) as a record."""
    context = span.get_span_context()
    assert context is not None
    return record(
        span.name,
        context,
        span.parent,
        span.kind,
        dict(span.attributes) if span.attributes else None,  # the SDK's own mapping
        span.links,
        span.start_time or 0,
        span.end_time or 0,
        span.status,
        span.events,
    )


def span_of(
    fields: Record,
    resource: Resource,
    scope: InstrumentationScope,
    ids: IdGenerator = _IDS,
) -> ReadableSpan:
    """The SDK span a record was made of (a new span's id from `ids`)."""
    (name, context, parent, kind, attributes, events, links, start, end, code, description) = fields
    if context is None:
        trace_id, _, _, flags, state = parent
        context = (trace_id, ids.generate_span_id(), False, flags, state)
    unset = code == 0 and description is None
    return ReadableSpan(
        name,
        span_context(context),
        None if parent is None else span_context(parent),
        resource,
        attributes,
        events=[Event(event_name, attrs, timestamp) for event_name, timestamp, attrs in events],
        links=[Link(span_context(linked), attrs) for linked, attrs in links],
        kind=_KINDS[kind],
        status=_UNSET if unset else Status(StatusCode(code), description),
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


class SpanShipper:
    """Sends records to an exporter process of its own (started here), from a thread."""

    def __init__(
        self,
        exporters: Sequence[str],
        protocol: str,
        resource: Resource,
        interval_s: float | None = None,
        max_pending: int | None = None,
    ) -> None:
        if interval_s is None:
            delay = _setting(os.environ, "OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS)
            interval_s = min(delay, SHIP_INTERVAL_MS) / 1000
        self._interval_s = interval_s
        if max_pending is None:
            max_pending = _setting(os.environ, "OTEL_BSP_MAX_QUEUE_SIZE", MAX_QUEUE_SIZE)
        self._max_pending = max_pending
        self._pending: list[Record] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._broken = False
        self._warned = self._warned_unpicklable = False
        # Spans dropped: past `max_pending`, after the exporter process went or shutdown began.
        self.dropped = 0
        # The exporter's command, but for its end of the socket (`_spawn`).
        self._command = [
            sys.executable,
            "-P",
            "-c",
            _LAUNCH,
            _PACKAGE_ROOT,
            "--parent",
            str(os.getpid()),
            "--exporters",
            ",".join(exporters),
            "--protocol",
            protocol,
        ]
        self._resource = (dict(resource.attributes), resource.schema_url)
        # When to start another exporter process at the soonest, should this one go, and how
        # long the next one must then wait (doubled for one that did not last: `_replaced`).
        self._respawn_wait_s = RESPAWN_FIRST_S
        self._spawn()
        self._thread = threading.Thread(target=self._run, name="span shipper", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        """Start an exporter process, and send it the resource (its first message)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
            command = [*self._command, "--fd", str(theirs.fileno())]
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)  # for the child only
            try:
                self.process = subprocess.Popen(command, pass_fds=(theirs.fileno(),))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._socket = ours
        self._started = time.monotonic()
        data = pickle.dumps(self._resource, protocol=pickle.HIGHEST_PROTOCOL)
        with contextlib.suppress(OSError):  # gone at once: the first batch's send finds out
            ours.sendall(_LENGTH.pack(len(data)) + data)

    def put(self, fields: Record) -> None:
        """Send this span with the next batch (dropped past `max_pending`, once the exporter
        process has gone, or once `shutdown` has begun)."""
        with self._lock:
            if self._broken or self._stopping:
                self.dropped += 1
                return
            if len(self._pending) >= self._max_pending:
                self.dropped += 1
                if not self._warned:
                    self._warned = True
                    log.warning("spans are made faster than they are exported: dropping some")
                return
            self._pending.append(fields)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            # Read before taking the batch: once stopping, `put` adds nothing, so this batch
            # is the last.
            stopping = self._stopping
            with self._lock:
                batch, self._pending = self._pending, []
            if batch:
                self._send(batch)
            if stopping:
                return

    def _drop(self, count: int) -> None:
        with self._lock:
            self.dropped += count

    def _send(self, message: object) -> None:
        if self._broken:
            if isinstance(message, list):
                self._drop(len(message))
            return
        count = len(message) if isinstance(message, list) else 0
        try:
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            assert isinstance(message, list)
            kept = self._picklable(message)  # (counts what it drops)
            count = len(kept)
            data = pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL)
        frame = _LENGTH.pack(len(data)) + data
        try:
            self._socket.sendall(frame)
            return
        except OSError as error:
            if not self._stopping and self._replaced(error):
                with contextlib.suppress(OSError):  # the new one takes the batch the old lost
                    self._socket.sendall(frame)
                    return
        self._drop(count)  # lost with the exporter process that went

    def _replaced(self, error: OSError) -> bool:
        """The exporter process has gone (killed, or failed): start another, unless the one
        that went was started less than `_respawn_wait_s` ago (then the batch is dropped, and
        the next one tries again). One that lasted less than RESPAWN_STEADY_S doubles the
        wait, up to RESPAWN_MOST_S: an exporter that cannot start is retried now and then, not
        in a loop."""
        lived = time.monotonic() - self._started
        if lived < self._respawn_wait_s or self._stopping:
            return False
        with contextlib.suppress(OSError):
            self._socket.close()
        if self.process.poll() is None:  # its socket broke under a process still running
            self.process.kill()
        self.process.wait()  # (no zombie left behind)
        if lived < RESPAWN_STEADY_S:
            self._respawn_wait_s = min(self._respawn_wait_s * 2, RESPAWN_MOST_S)
        else:
            self._respawn_wait_s = RESPAWN_FIRST_S
        log.warning(
            "the span exporter process has gone (%s, exit status %s): starting another",
            error,
            self.process.returncode,
        )
        try:
            self._spawn()
        except OSError as failed:
            # Tried again after the wait, as for one that went (the old socket stays closed).
            self._started = time.monotonic()
            log.error("cannot start a span exporter process (%s): trying again later", failed)
            return False
        return True

    def _picklable(self, batch: list[Record]) -> list[Record]:
        """The records of `batch` that pickle (one holding an attribute value no exporter
        writes, a lock say, does not): the others are dropped, and said so once."""
        kept = []
        for fields in batch:
            try:
                pickle.dumps(fields, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as error:
                self._drop(1)
                if not self._warned_unpicklable:
                    self._warned_unpicklable = True
                    log.warning("a span %r cannot be sent to the exporter: %s", fields[0], error)
                continue
            kept.append(fields)
        return kept

    def shutdown(self, wait_s: float = SHUTDOWN_WAIT_S) -> None:
        """Send what is left and wait (blocking, `wait_s` at most for each) until the exporter
        process has taken it and then exported it and ended. One that takes none of it in
        that time (stopped, hung) is killed and what is left dropped; one still exporting (a
        slow or unreachable collector) goes on by itself, SHUTDOWN_TIMEOUT_S at most after
        this process has ended (span_exporter.py), so that a server's stop is not held up."""
        self._stopping = True
        self._wake.set()
        self._thread.join(wait_s)
        if self._thread.is_alive():  # stuck sending to an exporter process that does not read
            self._broken = True
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)  # wakes the send with an error
            self._thread.join()
            log.warning("the span exporter process took nothing in %g s: stopping it", wait_s)
            self.process.kill()
            self.process.wait()
            self._socket.close()
            return
        with contextlib.suppress(OSError):  # the exporter process has gone already
            self._socket.shutdown(socket.SHUT_WR)
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            log.warning(
                "the span exporter process is still exporting after %g s (a slow or unreachable "
                "collector?): it goes on by itself for %g s at most",
                wait_s,
                SHUTDOWN_TIMEOUT_S,
            )
        finally:
            self._socket.close()


class ShippingProcessor(SpanProcessor):
    """The provider's processor: its (SDK) spans go the way of the request spans."""

    def __init__(self, shipper: SpanShipper) -> None:
        self._shipper = shipper

    def on_end(self, span: ReadableSpan) -> None:
        self._shipper.put(record_of(span))

    def shutdown(self) -> None:
        self._shipper.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Not done: spans reach the exporter process within 100 ms (or
        OTEL_BSP_SCHEDULE_DELAY, when shorter) and are exported once they have waited
        OTEL_BSP_SCHEDULE_DELAY there at most; only `shutdown` waits until they are."""
        return False
