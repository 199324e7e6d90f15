"""The span exporter process (started by span_export.py's `SpanShipper`, one per serving
process): it reads the records its serving process sends over a socket and exports them with
the exporters the OTEL_* variables configure (it inherits the environment; the resource comes
as the first message), OTEL_BSP_MAX_EXPORT_BATCH_SIZE at a time as soon as it has that many,
and what it has once the oldest has waited OTEL_BSP_SCHEDULE_DELAY: each export costs a post
(~1 ms of CPU), which paid ten times a second for a handful of spans cost a sampling server
more than its spans did (docs/benchmarks.md, "A copy that did not pay, and tracing measured
by turns"). The OTLP/HTTP exporter writes the records' bytes straight from the records
(`export_batch`); any other exporter gets them rebuilt as the SDK's `ReadableSpan`s
(`span_of`). It ends when the socket closes, after exporting its serving process's last
spans, or SHUTDOWN_TIMEOUT_S after that process has gone.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import queue
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from tritonactor.observability.exporters import HashedResource, build_exporters
from tritonactor.observability.span_export import (
    _IDS,
    _LENGTH,
    _SCOPE,
    MAX_EXPORT_BATCH_SIZE,
    SCHEDULE_DELAY_MS,
    SHUTDOWN_TIMEOUT_S,
    Record,
    _setting,
    span_of,
)

log = logging.getLogger(__name__)

# Messages queued between the socket's reader and the exports (each at most
# OTEL_BSP_MAX_QUEUE_SIZE records; the reader holds one more while the queue is full, beside
# the records being exported): past them, the socket fills.
_AHEAD = 2


def _messages(sock: socket.socket) -> Iterator[Any]:
    reader = sock.makefile("rb")
    while True:
        header = reader.read(_LENGTH.size)
        if len(header) < _LENGTH.size:
            return
        (size,) = _LENGTH.unpack(header)
        data = reader.read(size)
        if len(data) < size:
            return
        yield pickle.loads(data)


def _export(exporters: Sequence[SpanExporter], spans: Sequence[ReadableSpan]) -> None:
    for exporter in exporters:
        try:
            exporter.export(spans)
        except Exception:  # as the SDK's batch processor: logged, and the next batch goes on
            log.exception("exporting %d spans failed", len(spans))


def export_batch(
    exporters: Sequence[SpanExporter],
    batch: Sequence[Record],
    resource: Resource,
    scope: InstrumentationScope,
    ids: IdGenerator = _IDS,
) -> None:
    """Export records: straight from the records where the one exporter takes them (otlp.py's
    OTLP/HTTP one writes their bytes), else as the SDK spans `span_of` makes of them."""
    direct = getattr(exporters[0], "export_records", None) if len(exporters) == 1 else None
    if direct is not None:
        try:
            done = direct(batch, resource, scope, ids.generate_span_id)
        except Exception:  # as `_export`
            log.exception("exporting %d spans failed", len(batch))
            return
        if done is not None:
            return
    _export(exporters, _spans_of(batch, resource, scope, ids))


def _spans_of(
    batch: Sequence[Record], resource: Resource, scope: InstrumentationScope, ids: IdGenerator
) -> list[ReadableSpan]:
    """The SDK spans of `batch`; a record that is not one (which this server never sends) is
    logged and dropped, rather than ending the exporter process and every later span."""
    spans = []
    for fields in batch:
        try:
            spans.append(span_of(fields, resource, scope, ids))
        except Exception:
            log.exception("a span record that cannot be read: dropped")
    return spans


def _outlive(parent: int) -> None:
    """Wait for the serving process `parent` to end (its pidfd becomes readable), then give
    this process SHUTDOWN_TIMEOUT_S to finish before ending it."""
    try:
        watch = os.pidfd_open(parent)
    except ProcessLookupError:  # already gone
        pass
    except OSError:  # no pidfd here (an old kernel, a seccomp profile): look now and then
        while os.getppid() == parent:
            time.sleep(1)
    else:
        select.select([watch], [], [])
        os.close(watch)
    time.sleep(SHUTDOWN_TIMEOUT_S)
    log.warning("its serving process has gone: the spans left are dropped")
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="tritonactor's span exporter process")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--exporters", required=True)
    parser.add_argument("--protocol", required=True)
    args = parser.parse_args(argv)
    # The serving process ends this process by closing the socket, after its last spans
    # (SIGINT and SIGTERM are blocked: `_HELD`).
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s span exporter: %(message)s")
    exporters = build_exporters(args.exporters.split(","), args.protocol)
    size = _setting(os.environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", MAX_EXPORT_BATCH_SIZE)
    delay_s = _setting(os.environ, "OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS) / 1000
    scope = InstrumentationScope(*_SCOPE)
    # The ids of the spans the serving process left without: OTEL_PYTHON_ID_GENERATOR's, as there.
    ids = TracerProvider(shutdown_on_exit=False).id_generator
    # Once the serving process has gone (killed: it never said goodbye), what it had sent is
    # exported for SHUTDOWN_TIMEOUT_S at most.
    threading.Thread(target=_outlive, args=(args.parent,), daemon=True).start()
    with socket.socket(fileno=args.fd) as sock:
        messages = _messages(sock)
        first = next(messages, None)
        if first is not None:
            resource = HashedResource(*first)
            for batch in _batches(messages, size, delay_s):
                export_batch(exporters, batch, resource, scope, ids)
    for exporter in exporters:
        exporter.shutdown()
    return 0


def _batches(messages: Iterator[list[Record]], size: int, delay_s: float) -> Iterator[list[Record]]:
    """The records of `messages` in batches to export: `size` of them as soon as there are
    that many, what there is once the oldest has waited `delay_s`, and the rest at the end.
    The messages are read on a thread of their own into a queue of `_AHEAD` at most, so that
    while an export is slow (a slow collector) the socket fills and the serving process keeps
    (then drops) what comes next, as when each message was exported as it came. A delay past
    what a wait can take (half of `threading.TIMEOUT_MAX`, ~146 years: "never") waits that
    long."""
    delay_s = min(delay_s, threading.TIMEOUT_MAX / 2)
    arrived: queue.Queue[list[Record] | None] = queue.Queue(_AHEAD)

    def read() -> None:
        try:
            for message in messages:
                arrived.put(message)
        finally:
            arrived.put(None)

    threading.Thread(target=read, name="span reader", daemon=True).start()
    pending: list[Record] = []
    due = 0.0  # when the oldest pending record has waited `delay_s`
    while True:
        try:
            message = arrived.get(timeout=max(0.0, due - time.monotonic()) if pending else None)
        except queue.Empty:
            message = []
        if message is None:
            break
        if message:
            if not pending:
                due = time.monotonic() + delay_s
            pending += message
        if len(pending) >= size:
            # Every full batch at once; those left keep the oldest's due time (they go no
            # later than it would have).
            whole = len(pending) - len(pending) % size
            for start in range(0, whole, size):
                yield pending[start : start + size]
            pending = pending[whole:]
        if pending and time.monotonic() >= due:
            batch, pending = pending, []
            yield batch
    for start in range(0, len(pending), size):
        yield pending[start : start + size]


if __name__ == "__main__":
    sys.exit(main())
