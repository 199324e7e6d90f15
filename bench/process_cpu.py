"""Server CPU per request under perf_analyzer, by process (front ends, engine, python models),
for one or more checkouts alternated: what a change costs in work, apart from throughput.

    python bench/process_cpu.py --proto grpc --rounds 2 /path/to/old-checkout /path/to/new-checkout
    python bench/process_cpu.py --proto http --model identity_fp32_dyn --concurrency 16 \
        --workers 0 .

Rounds take the checkouts in turn, the order reversed every other round (A B, B A, A B...),
so that a machine whose speed drifts over the run (this one's does, by 10-20 % over an
evening) favours neither the one measured first nor the one measured last; the run ends with
each checkout's medians and their ratio to the first's.

Each checkout (a tree with `tritonactor/` in it; `.` for this one) is put first on PYTHONPATH
and `tritonactor serve` starts on `../shared/peers/models/triton` (the python identity
`identity_fp32` of side_by_side.sh, or `--model`) with its defaults (one front end per core
less the engine's; `--workers N` to choose, 0 for one process). perf_analyzer
warms it up, then measures one window; the CPU time (utime + stime from /proc) of the whole
process tree over that window, divided by the requests the server counted
(`nv_inference_request_success`), is the CPU per request. Run it from outside the repository
(the working folder is also on Python's path), on a quiet machine.

What tracing costs, by process (the span exporter processes apart):

    python bench/process_cpu.py --proto http --model identity_fp32_onnx --workers 1 \
        --concurrency 4 --trace --rounds 2 /path/to/old-checkout /path/to/new-checkout

`--trace` exports the server's spans over OTLP/HTTP to bench/otlp_sink.py (a process of its
own that only counts them) and measures two windows on each server: every request traced
(trace_rate 1) and none (trace_rate 1,000,000,000; trace_level TIMESTAMPS in both), traced
first in odd rounds and untraced first in even ones.

Real Triton measured the same way, beside a checkout (`triton` in place of a checkout: its
`tritonserver` and python stubs, from `../shared/peers/run_triton.sh`, which `setup.sh`
installs; python models only, no `--trace`, `--workers` is ours alone):

    python bench/process_cpu.py --proto http --rounds 2 triton /path/to/checkout

The front end on hypercorn (`--asgi-server hypercorn`: `serve` runs `hypercorn
tritonactor.app:app`, one front end beside the engine on two cores, as that command does):

    python bench/process_cpu.py --asgi-server hypercorn --proto http --rounds 2 old new

One tree under another interpreter: `<checkout>@<venv>` runs that virtual environment's
`tritonactor` (and so its Python, for every process of the server) on the tree, which, first
on PYTHONPATH, takes the place of the venv's own copy (the venv needs tritonactor and its
dependencies installed: `pip install -e '<tree>[cpu]'`); the line's name is the tree's and the
venv's:

    python bench/process_cpu.py --proto http --rounds 4 /path/to/checkout \
        /path/to/checkout@/path/to/venv3.12

A model with `response_cache { enable: true }` (`bench/models/features`' `identity_cached`)
needs the servers' cache: `--cache-config local,size=1048576` gives both the same one.

Every line also gives the client's CPU a request (perf_analyzer's own, from this script's
children's usage): the share of the 2 cores the load itself takes.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import http.client
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = HERE.parent.parent / "shared" / "peers"
PEER_MODELS = PEERS / "models"
TRITON = "triton"  # in place of a checkout, as written: real Triton (run_triton.sh)
PERF_ANALYZER = Path.home() / ".cache" / "tritonactor-peers" / "bin" / "perf_analyzer"
TICK = os.sysconf("SC_CLK_TCK")
HTTP, GRPC, METRICS = 48000, 48001, 48002


def tree(root: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children[int(stat.rpartition(")")[2].split()[1])].append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack += children[pid]
    return found


def role(command: str) -> str:
    if "span_exporter" in command:
        return "span exporters"
    if "tritonserver" in command:
        return "tritonserver"
    if "stub" in command or "backends.python" in command:
        return "python models"
    if "engine" in command:
        return "engine"
    if "multiprocessing" in command:
        return "front ends"
    return "parent"


def cpu_by_role(root: int) -> collections.Counter[str]:
    seconds: collections.Counter[str] = collections.Counter()
    for pid in tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
        except OSError:
            continue
        seconds[role(command)] += (int(fields[11]) + int(fields[12])) / TICK
    return seconds


def served(model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS}/metrics").read().decode()
    found = re.search(
        rf'nv_inference_request_success\{{model="{re.escape(model)}",version="1"\}} (\S+)', text
    )
    return float(found.group(1)) if found else 0.0


def trace_rate(rate: int) -> None:
    """Trace one request in `rate` from now on (global trace settings)."""
    body = json.dumps({"trace_level": ["TIMESTAMPS"], "trace_rate": str(rate)}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{HTTP}/v2/trace/setting", body)
    urllib.request.urlopen(request).read()


@dataclasses.dataclass(frozen=True)
class Checkout:
    """What one column of the run serves: a tree, under the `tritonactor` on PATH or a venv's;
    or real Triton (`tree` is the word `triton`)."""

    tree: Path
    venv: Path | None = None

    @classmethod
    def parse(cls, argument: str) -> Checkout:
        if argument == TRITON:
            return cls(Path(TRITON))
        tree, at, venv = argument.rpartition("@")
        if not at:
            return cls(Path(venv).resolve())
        if not tree or not venv:
            raise argparse.ArgumentTypeError(f"{argument!r}: write <tree>@<venv>")
        found = cls(Path(tree).resolve(), Path(venv).resolve())
        if not os.access(found.program, os.X_OK):
            raise argparse.ArgumentTypeError(f"{argument!r}: no {found.program}")
        return found

    @property
    def triton(self) -> bool:
        return str(self.tree) == TRITON

    @property
    def program(self) -> str:
        """The `tritonactor` that serves the tree."""
        return "tritonactor" if self.venv is None else str(self.venv / "bin" / "tritonactor")

    @property
    def name(self) -> str:
        return self.tree.name if self.venv is None else f"{self.tree.name}@{self.venv.name}"


def measure(
    checkout: Checkout,
    proto: str,
    concurrency: int,
    window_ms: int,
    model: str = "identity_fp32",
    workers: int | None = None,
    sink: str | None = None,
    traced_first: bool = True,
    repository: Path | None = None,
    streaming: bool = False,
    cache_config: str | None = None,
    asgi_server: str = "uvicorn",
) -> list[Window]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONACTOR_", "OTEL_"))}
    env.update(OTEL_TRACES_EXPORTER="none")
    if sink is not None:
        env.update(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=sink)
    if repository is None:
        repository = PEER_MODELS / ("onnx" if model.endswith("_onnx") else "triton")
    if checkout.triton:
        # run_triton.sh execs tritonserver: the process started here is the server.
        command = ["bash", str(PEERS / "run_triton.sh"), str(repository)]
        env.update(TRITON_HTTP_PORT=str(HTTP), TRITON_GRPC_PORT=str(GRPC))
        env.update(TRITON_METRICS_PORT=str(METRICS))
    else:
        env.update(PYTHONPATH=str(checkout.tree))
        command = [checkout.program, "serve", "--model-repository", str(repository)]
        command += ["--asgi-server", asgi_server]
        if workers is not None:
            command += ["--workers", str(workers)]
        for name, port in (("http", HTTP), ("grpc", GRPC), ("metrics", METRICS)):
            command += [f"--{name}-address", "127.0.0.1", f"--{name}-port", str(port)]
    if cache_config is not None:  # the same flag on both servers
        command.append(f"--cache-config={cache_config}")
    with open(os.devnull, "wb") as quiet:
        server = subprocess.Popen(command, env=env, stdout=quiet, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/v2/health/ready")
                break
            except (OSError, http.client.HTTPException):  # (a port in the ephemeral range
                # may connect to itself while nothing listens on it: it echoes the request)
                time.sleep(0.2)
        url = f"127.0.0.1:{GRPC if proto == 'grpc' else HTTP}"
        pa = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", proto]
        pa += ["--concurrency-range", str(concurrency), "-p", str(window_ms), "-s", "50"]
        if streaming:
            pa.append("--streaming")
        lines = []
        rates: tuple[int | None, ...] = (None,)
        if sink is not None:
            rates = (1, 1_000_000_000) if traced_first else (1_000_000_000, 1)
        for rate in rates:
            if rate is not None:
                trace_rate(rate)
            subprocess.run(pa, capture_output=True)  # warm up
            before, count = cpu_by_role(server.pid), served(model)
            client = _children_cpu()
            output = subprocess.run(pa, capture_output=True, text=True).stdout
            client = _children_cpu() - client
            after, requests = cpu_by_role(server.pid), served(model) - count
            lines.append(report(checkout, output, before, after, requests, rate, client))
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return lines


@dataclasses.dataclass
class Window:
    """One measured window: its line, and what the run's medians are made of."""

    key: str  # the checkout's name, and "traced" or "untraced" with --trace
    line: str
    throughput: float | None
    cpu_us: int


def report(
    checkout: Checkout,
    output: str,
    before: collections.Counter[str],
    after: collections.Counter[str],
    requests: float,
    rate: int | None,
    client: float,
) -> Window:
    """One window: infer/s, p50, the CPU a request cost, by process, and the client's."""
    throughput = re.findall(r"Throughput: ([\d.]+) infer/sec", output)
    p50 = re.findall(r"p50 latency: (\d+)", output)
    parts = {name: round((after[name] - before[name]) / requests * 1e6) for name in after}
    total = sum(parts.values())
    traced = "" if rate is None else ("traced " if rate == 1 else "untraced ")
    line = (
        f"{checkout.name}: {traced}{requests:.0f} requests, "
        f"{throughput[-1] if throughput else '?'} infer/s, "
        f"p50 {p50[-1] if p50 else '?'} us, server CPU {total} us/request {parts}, "
        f"client {client / requests * 1e6:.0f} us/request"
    )
    key = f"{checkout.name} {traced.strip()}".strip()
    return Window(key, line, float(throughput[-1]) if throughput else None, total)


def _children_cpu() -> float:
    """The CPU seconds of this script's children that have ended (perf_analyzer's runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def medians(windows: list[Window]) -> list[str]:
    """Each key's median infer/s and CPU a request over the rounds, and their ratios to the
    first key's; with --trace, each checkout's traced rate over its untraced one."""
    by_key: dict[str, list[Window]] = {}
    for window in windows:
        by_key.setdefault(window.key, []).append(window)
    rows = []
    found_medians: dict[str, tuple[float, float]] = {}
    for key, found in by_key.items():
        rates = [w.throughput for w in found if w.throughput is not None]
        rate = statistics.median(rates) if rates else float("nan")
        cpu = statistics.median(w.cpu_us for w in found)
        found_medians[key] = (rate, cpu)
        first = next(iter(found_medians.values()))
        rows.append(
            f"median {key}: {rate:.0f} infer/s ({rate / first[0]:.3f}x), "
            f"server CPU {cpu:.0f} us/request ({cpu / first[1]:.3f}x), {len(found)} windows"
        )
    for key, (rate, _) in found_medians.items():
        if key.endswith(" traced"):
            untraced = found_medians.get(key[: -len("traced")] + "untraced")
            if untraced is not None:
                rows.append(f"{key[: -len(' traced')]}: traced / untraced {rate / untraced[0]:.3f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="+", type=Checkout.parse)
    parser.add_argument("--proto", choices=("http", "grpc"), default="grpc")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--model", default="identity_fp32", help="a model of side_by_side.sh's")
    parser.add_argument(
        "--workers", type=int, default=None, help="front ends (default: serve's; 0: one process)"
    )
    parser.add_argument(
        "--trace", action="store_true", help="measure every request traced, then none"
    )
    parser.add_argument(
        "--repository",
        type=Path,
        default=None,
        help="serve this model repository (default: side_by_side.sh's, python or ONNX)",
    )
    parser.add_argument(
        "--streaming", action="store_true", help="gRPC streaming (a decoupled model needs it)"
    )
    parser.add_argument(
        "--asgi-server",
        choices=("uvicorn", "hypercorn"),
        default="uvicorn",
        help="serve's front ends' ASGI server (hypercorn: as `hypercorn tritonactor.app:app`)",
    )
    parser.add_argument(
        "--cache-config",
        default=None,
        help="the servers' response cache, as Triton's flag says it (local,size=N)",
    )
    args = parser.parse_args()
    checkouts: list[Checkout] = args.checkouts
    if len({checkout.name for checkout in checkouts}) < len(checkouts):
        parser.error("two checkouts share a name (the medians are kept by name)")
    if args.streaming and args.proto != "grpc":
        parser.error("--streaming is gRPC's")
    if any(checkout.triton for checkout in checkouts):
        if args.trace or (args.repository is None and args.model.endswith("_onnx")):
            parser.error("real Triton is measured on the python models, untraced")
        if not (PEERS / "run_triton.sh").exists():
            parser.error(f"no {PEERS / 'run_triton.sh'}: real Triton needs ../shared/peers")
    sink = None
    if args.trace:
        sink = subprocess.Popen(
            [sys.executable, str(HERE / "otlp_sink.py")], stdout=subprocess.PIPE
        )
        assert sink.stdout is not None
        endpoint = f"http://127.0.0.1:{int(sink.stdout.readline())}"
    try:
        windows: list[Window] = []
        for round_ in range(args.rounds):
            order = checkouts if round_ % 2 == 0 else checkouts[::-1]
            for checkout in order:
                measured = measure(
                    checkout,
                    args.proto,
                    args.concurrency,
                    args.window_ms,
                    args.model,
                    args.workers,
                    endpoint if sink is not None else None,
                    traced_first=round_ % 2 == 0,
                    repository=args.repository,
                    streaming=args.streaming,
                    cache_config=args.cache_config,
                    asgi_server=args.asgi_server,
                )
                for window in measured:
                    print(
                        f"round {round_ + 1} {args.proto} c{args.concurrency} {window.line}",
                        flush=True,
                    )
                windows += measured
                time.sleep(1)
        for row in medians(windows):
            print(row, flush=True)
    finally:
        if sink is not None:
            sink.kill()
            sink.wait()


if __name__ == "__main__":
    main()
