"""What tracing costs: one server with tracing off and one with tracing on (OTLP over HTTP to
a receiver in a process of its own, bench/otlp_sink.py, which only counts spans), the same load
on each, in turns.

    python bench/tracing.py [--model simple] [--concurrency 4] [--seconds 4] [--rounds 3]

The load is `--concurrency` threads, each posting the same JSON inference request back to back
on its own keep-alive connection. Each round measures the untraced server, then the traced one
tracing every request (trace_rate 1), then the traced one at trace_rate `--sparse-rate` (100).
The table shows each round and the medians: infer/s, the ratios to the untraced server, the
servers' CPU µs per inference (with the span exporter process) and the spans received per
inference. A last line gives the CPU one traced request costs, measured in this process on the
server's own tracing classes: on the request's thread, in the thread that ships its spans, and
in the exporter process. A default run takes about two minutes (each traced window waits out
the export delay, OTEL_BSP_SCHEDULE_DELAY's default, for its last spans).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # http_infer.py's helpers

import numpy as np
from http_infer import start_server, stop_server, tree_cpu_seconds
from opentelemetry.sdk.trace import TracerProvider

from tritonactor.core.types import InferenceRequest, Tensor
from tritonactor.observability.exporters import service_resource
from tritonactor.observability.span_export import SCHEDULE_DELAY_MS, SpanShipper
from tritonactor.observability.trace_settings import TraceSettings
from tritonactor.observability.tracing import BatchTrace, Tracing

BODY = {
    "simple": {
        "inputs": [
            {"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
            for name in ("INPUT0", "INPUT1")
        ]
    }
}


@dataclass(frozen=True)
class Measurement:
    infer_per_sec: float
    server_us_per_infer: float | None
    spans_per_infer: float


def load(url: str, model: str, concurrency: int, seconds: float) -> tuple[int, float]:
    """(inferences answered, seconds) with `concurrency` threads back to back."""
    body = json.dumps(BODY[model]).encode()
    path = f"/v2/models/{model}/infer"
    host, port = url.split(":")
    stop = threading.Event()
    counts = [0] * concurrency
    failures: list[str] = []

    def worker(index: int) -> None:
        connection = http.client.HTTPConnection(host, int(port))
        headers = {"Content-Type": "application/json"}
        while not stop.is_set():
            connection.request("POST", path, body, headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                failures.append(f"HTTP {response.status}")
                return
            counts[index] += 1
        connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    if failures:
        sys.exit(f"the load failed: {failures[0]}")
    return sum(counts), time.perf_counter() - began


class Sink:
    """bench/otlp_sink.py, started in a process of its own."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve().parent / "otlp_sink.py")],
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        self.endpoint = f"http://127.0.0.1:{int(self.process.stdout.readline())}"

    def spans(self) -> int:
        with urllib.request.urlopen(f"{self.endpoint}/spans", timeout=10) as answer:
            return int(answer.read())

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def measure(
    process: subprocess.Popen[bytes],
    url: str,
    args: argparse.Namespace,
    receiver: Sink | None,
) -> Measurement:
    """One window of load. With a receiver, the server's CPU is counted until the window's
    spans have all arrived, so that their export counts, and the previous window's does not."""
    load(url, args.model, args.concurrency, 0.5)  # warm up
    settle(receiver)
    spans_before = receiver.spans() if receiver is not None else 0
    cpu_before = tree_cpu_seconds(process.pid)
    count, elapsed = load(url, args.model, args.concurrency, args.seconds)
    settle(receiver)
    cpu_after = tree_cpu_seconds(process.pid)
    spans = receiver.spans() - spans_before if receiver is not None else 0
    server_us = None
    if cpu_before is not None and cpu_after is not None and count:
        server_us = (cpu_after - cpu_before) * 1e6 / count
    return Measurement(count / elapsed, server_us, spans / count if count else 0.0)


def settle(
    receiver: Sink | None, quiet_s: float = SCHEDULE_DELAY_MS / 1000 + 0.3, limit_s: float = 60
) -> None:
    """Wait until no span has arrived for `quiet_s` (the exporter is done: what it holds goes
    once it has waited the export delay, OTEL_BSP_SCHEDULE_DELAY's default here)."""
    if receiver is None:
        return
    deadline = time.monotonic() + limit_s
    seen = -1
    while time.monotonic() < deadline:
        count = receiver.spans()
        if count == seen:
            return
        seen = count
        time.sleep(quiet_s)


def median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio(traced: float | None, untraced: float | None) -> str:
    return "-" if traced is None or not untraced else f"{traced / untraced:.3f}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="simple", choices=sorted(BODY))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sparse-rate", type=int, default=100, help="the traced server's second trace_rate"
    )
    return parser.parse_args(argv)


def _children_seconds(since: resource.struct_rusage) -> float:
    """CPU seconds of the children that ended since `since`."""
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    return sum(getattr(now, f) - getattr(since, f) for f in ("ru_utime", "ru_stime"))


def in_process(receiver: Sink, requests: int = 5000) -> tuple[float, float, float]:
    """CPU µs per traced request, on the request's thread, in the thread that ships its spans
    and in the exporter process: the span work of the front end, router and instance, in the
    server's own classes, exported over OTLP/HTTP to the receiver, without the server around
    it."""
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint  # for the exporter process
    # What an exporter process costs that exports nothing (its start), to take away.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    SpanShipper(("otlp",), "http/protobuf", service_resource()).shutdown()
    idle = _children_seconds(before)
    provider = TracerProvider(shutdown_on_exit=False)
    tracing = Tracing(provider, TraceSettings(level=("TIMESTAMPS",), rate=1))
    shipper = SpanShipper(("otlp",), "http/protobuf", service_resource(), max_pending=5 * requests)
    tracing.ship_to(shipper)
    data = np.zeros((1, 16), np.int32)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process_before = time.process_time()
    began = time.thread_time()
    for index in range(requests):
        trace = tracing.start_request("simple", "", None, "HTTP")
        assert trace is not None
        request = InferenceRequest(
            "simple", id=str(index), inputs=[Tensor("INPUT0", "INT32", (1, 16), data)]
        )
        request.trace = trace
        trace.describe(request)
        routed = time.time_ns()
        request.resolved_version = 1
        trace.routed(request, routed)
        batch = BatchTrace([request], 1)
        batch.end(time.perf_counter_ns(), time.perf_counter_ns())
        trace.end()
    caller = time.thread_time() - began
    tracing.shutdown()  # ships what is left; the exporter process exports it and ends
    shipping = time.process_time() - process_before - caller
    exporting = _children_seconds(children_before) - idle
    del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    return caller * 1e6 / requests, shipping * 1e6 / requests, exporting * 1e6 / requests


def set_trace_rate(url: str, rate: int) -> None:
    request = urllib.request.Request(
        f"http://{url}/v2/trace/setting",
        data=json.dumps({"trace_rate": str(rate)}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    receiver = Sink()
    caller_us, shipping_us, exporter_us = in_process(receiver)
    with tempfile.TemporaryDirectory(prefix="tritonactor-bench-tracing-") as scratch:
        workdir = Path(scratch)
        untraced = start_server(None, workdir, "untraced", {})
        traced = start_server(
            None,
            workdir,
            "traced",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint},  # the export delay's default
        )
        rows: list[tuple[Measurement, Measurement, Measurement]] = []
        try:
            for _ in range(args.rounds):
                off = measure(*untraced, args, None)
                set_trace_rate(traced[1], 1)
                every = measure(*traced, args, receiver)
                set_trace_rate(traced[1], args.sparse_rate)
                sparse = measure(*traced, args, receiver)
                rows.append((off, every, sparse))
        finally:
            stop_server(untraced[0])
            stop_server(traced[0])
            receiver.close()
    print(
        f"model {args.model}, {args.concurrency} connections, {args.seconds:g} s windows, "
        f"{os.cpu_count()} CPUs shared by the servers, the load and the receiver's process\n"
    )
    rate = args.sparse_rate
    print(
        f"| round | off infer/s | rate 1 infer/s | rate 1 / off | rate {rate} infer/s "
        f"| rate {rate} / off | off server µs/infer | rate 1 server µs/infer "
        f"| rate {rate} server µs/infer | spans/infer at rate 1 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def line(label: str, off: Measurement, every: Measurement, sparse: Measurement) -> str:
        return (
            f"| {label} | {number(off.infer_per_sec)} | {number(every.infer_per_sec)} "
            f"| {ratio(every.infer_per_sec, off.infer_per_sec)} "
            f"| {number(sparse.infer_per_sec)} | {ratio(sparse.infer_per_sec, off.infer_per_sec)} "
            f"| {number(off.server_us_per_infer)} | {number(every.server_us_per_infer)} "
            f"| {number(sparse.server_us_per_infer)} | {every.spans_per_infer:.2f} |"
        )

    for index, row in enumerate(rows, start=1):
        print(line(str(index), *row))
    medians = [
        Measurement(
            median([row[column].infer_per_sec for row in rows]) or 0.0,
            median([row[column].server_us_per_infer for row in rows]),
            median([row[column].spans_per_infer for row in rows]) or 0.0,
        )
        for column in range(3)
    ]
    print(line("median", *medians))
    print(
        f"\nin-process, per traced request: {caller_us:.0f} µs of CPU on the request's thread, "
        f"{shipping_us:.0f} µs in the thread shipping its 5 spans, {exporter_us:.0f} µs in the "
        "exporter process (rebuilding, encoding and posting them)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
