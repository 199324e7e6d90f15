"""Two trees side by side in time: both servers up at once, requests alternating between them
one at a time, and each server's CPU per request (its process tree's, from /proc).

    cd /tmp; python <main>/bench/interleaved.py OLD NEW [--requests 4000]
        [--cases small_onnx,big_onnx,shm_onnx,grpc_big,grpc_onnx,...] [--workers 1]
        [--trace [new|both]] [--trace-rate N] [--by-process]

Each tree serves `tritonactor serve --workers N` (one front end and the engine by default) from
its own folder, on bench/request_path.py's repository; the cases are request_path.py's (binary
HTTP, one keep-alive connection each) and `grpc_big` (1 MiB in and out through tritonclient's
gRPC client), `grpc_onnx` and `grpc_python` (FP32 [1,16] through it, the ONNX and the python
identity). Measured one after the other, two trees' figures move with the machine by 10-20 %
within minutes on a shared host; alternating every request puts both in the same moments, so
their ratio holds to a couple of per cent where sequential runs could not tell 5 % apart
(docs/benchmarks.md, "Large tensors read where they lie"). Both servers' working sets share
the caches, so the figures themselves are higher than one server's alone: read the ratios.

With `--trace`, the new tree's server traces every request (trace_rate 1, TIMESTAMPS) and
exports its spans over OTLP/HTTP to bench/otlp_sink.py (a process of its own, not counted: a
collector runs elsewhere): give the same tree twice to read what tracing costs a request, span
exporter processes included. `--trace both` traces on both servers (a change to tracing);
`--trace-rate N` traces one request in N instead. `--by-process` adds each server's figure by
process (process_cpu.py's roles: under `--workers 1` the front end is the "parent", beside the
engine, the python models' processes and the span exporter processes).
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_infer import free_port
from process_cpu import cpu_by_role

# gRPC cases (tritonclient's client): the model and the FP32 elements of its [1, N] tensor.
GRPC_CASES = {
    "grpc_big": ("identity_onnx", 1 << 18),
    "grpc_onnx": ("identity_onnx", 16),
    "grpc_python": ("identity_python", 16),
}
# Cases of small requests, measured `--requests` times (the others a quarter of that).
SMALL_CASES = ("small_onnx", "seq_onnx", "json_onnx", "grpc_onnx")


def _request_path(tree: Path, name: str) -> ModuleType:
    """`tree`'s own bench/request_path.py, starting its servers from `tree`."""
    spec = importlib.util.spec_from_file_location(name, tree / "bench" / "request_path.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    module.REPO_ROOT = tree  # (imported from this tree's http_infer otherwise)
    return module


class Served:
    """One tree's server and a client of each kind."""

    def __init__(
        self, tree: Path, name: str, workers: int, sink: str | None = None, rate: int = 1
    ) -> None:
        self.paths = _request_path(tree, name)
        work = Path(tempfile.mkdtemp(prefix=f"interleaved-{name}-"))
        self.paths.write_repository(work / "models")
        self.regions = self.paths.Regions()
        grpc_port = free_port()
        settings = {"TRITONACTOR_GRPC_PORT": str(grpc_port)}
        if sink is not None:  # every request traced, its spans exported to `sink`
            settings.update(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=sink)
        self.process, url = self.paths.start_uvicorn(work / "models", work, workers, settings)
        host, port = url.rsplit(":", 1)
        self.http = http.client.HTTPConnection(host, int(port), timeout=60)
        if sink is not None:
            body = json.dumps({"trace_level": ["TIMESTAMPS"], "trace_rate": str(rate)}).encode()
            self.paths.send(self.http, self.paths.Call("POST", "/v2/trace/setting", {}, body))
        for call in self.regions.register_calls():
            self.paths.send(self.http, call)
        self.calls = self.paths.cases(self.regions)
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")

    def request(self, case: str) -> Callable[[], None]:
        """One request of `case`, checked."""
        if case not in GRPC_CASES:
            call = self.calls[case]
            # A fresh connection for each case: uvicorn closes one idle for 5 s (a gRPC case
            # before this one), and a request on it would find the socket closed.
            self.http.close()
            return lambda: self.paths.send(self.http, call)
        model, elements = GRPC_CASES[case]
        data = np.random.default_rng(0).random((1, elements), dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)

        def call() -> None:
            answer = self.grpc.infer(model, [tensor]).as_numpy("OUTPUT0")
            if answer is None or not np.array_equal(answer, data):
                raise RuntimeError("a wrong answer")

        return call

    def close(self) -> None:
        self.grpc.close()
        self.regions.close()
        self.paths.stop_server(self.process)


def measure(
    servers: Sequence[Served], case: str, requests: int
) -> tuple[list[float], list[dict[str, float]]]:
    """Each server's CPU µs per request of `case` (its process tree's), the requests
    alternating between them, and the same by process role."""
    calls = [served.request(case) for served in servers]
    for call in calls:
        for _ in range(min(100, requests)):
            call()
    before = [cpu_by_role(served.process.pid) for served in servers]
    for _ in range(requests):
        for call in calls:
            call()
    after = [cpu_by_role(served.process.pid) for served in servers]
    by_role = [
        {role: (seconds - start[role]) / requests * 1e6 for role, seconds in sorted(now.items())}
        for start, now in zip(before, after, strict=True)
    ]
    return [sum(roles.values()) for roles in by_role], by_role


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("trees", nargs=2, type=Path, help="the old tree, then the new one")
    parser.add_argument("--requests", type=int, default=4000, help="per case (a quarter: 1 MiB)")
    parser.add_argument("--cases", default="small_onnx,big_onnx,shm_onnx,grpc_big")
    parser.add_argument("--workers", type=int, default=1, help="tritonactor serve --workers")
    parser.add_argument(
        "--trace",
        nargs="?",
        const="new",
        choices=("new", "both"),
        help="the new tree's server (or both) traces every request (spans to bench/otlp_sink.py)",
    )
    parser.add_argument(
        "--trace-rate", type=int, default=1, help="with --trace: trace one request in this many"
    )
    parser.add_argument(
        "--by-process", action="store_true", help="each server's CPU a request by process role"
    )
    args = parser.parse_args(argv)
    servers: list[Served] = []
    sink = None
    try:
        endpoint = None
        if args.trace:
            sink = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("otlp_sink.py"))],
                stdout=subprocess.PIPE,
            )
            assert sink.stdout is not None
            endpoint = f"http://127.0.0.1:{int(sink.stdout.readline())}"
        for index, tree in enumerate(args.trees):
            sink_of = endpoint if index == 1 or args.trace == "both" else None
            served = Served(
                tree.resolve(), f"request_path_{index}", args.workers, sink_of, args.trace_rate
            )
            servers.append(served)
        every = "every request" if args.trace_rate == 1 else f"1 request in {args.trace_rate}"
        traced = {None: "", "new": f" (new: {every} traced)"}.get(args.trace, f" ({every} traced)")
        print(
            f"old {args.trees[0]}, new {args.trees[1]}{traced}: server CPU µs per "
            "request (its process tree's: span exporters included)",
            flush=True,
        )
        for case in args.cases.split(","):
            count = args.requests if case in SMALL_CASES else args.requests // 4
            (old, new), roles = measure(servers, case, max(count, 50))
            print(f"{case:12s} old {old:7.0f}  new {new:7.0f}  new/old {new / old:.3f}", flush=True)
            if args.by_process:
                for which, by_role in zip(("old", "new"), roles, strict=True):
                    shares = ", ".join(f"{role} {us:.0f}" for role, us in by_role.items())
                    print(f"{'':12s} {which}: {shares}", flush=True)
    finally:
        for served in servers:
            served.close()
        if sink is not None:
            sink.kill()
            sink.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
