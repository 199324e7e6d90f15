"""gRPC against HTTP on one server: perf_analyzer `-i grpc` (unary and `--streaming`) and
`-i http` on the same model, one hypercorn worker, at each concurrency.

    python bench/grpc_vs_http.py [--model simple] [--levels 1,4,16] [--duration-ms 1500]

For each level it prints infer/s, p50 latency and the server's CPU µs per inference for each
protocol, and the ratio gRPC / HTTP. Before the runs it measures each protocol's floor: a
liveness call back to back on one connection, with no tensors and no model. A default run takes
about a minute and stops starting new runs after --budget-s seconds.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

# http_infer.py beside this file already knows how to find perf_analyzer and measure CPU.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_infer import (
    children_cpu_seconds,
    free_port,
    http_floor,
    locate_perf_analyzer,
    machine_busy_seconds,
    machine_facts,
    self_cpu_seconds,
    stop_server,
    tree_cpu_seconds,
    usable_cpus,
)

# (label, perf_analyzer -i, extra flags)
MODES = (
    ("HTTP", "http", ()),
    ("gRPC", "grpc", ()),
    ("gRPC stream", "grpc", ("--streaming",)),
)
STABILITY_PERCENT = 25
MAX_TRIALS = 4


@dataclass(frozen=True)
class Result:
    infer_per_sec: float
    p50_us: float
    server_us_per_infer: float | None
    client_cores: float
    # CPU that processes outside the benchmark used meanwhile, in cores: well above 0, the
    # machine was shared during the run and the row is suspect.
    other_cores: float | None


@dataclass(frozen=True)
class Server:
    process: subprocess.Popen[bytes]
    http_url: str
    grpc_url: str


def start_server(repository: Path | None, workdir: Path) -> Server:
    """One hypercorn worker (on two cores or more a front end, beside the engine process it
    starts) on free ports (None: the bundled examples); waits for ready."""
    http_port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONACTOR_")}
    env.update(
        TRITONACTOR_GRPC_PORT=str(grpc_port),
        TRITONACTOR_METRICS_PORT=str(free_port()),
        TRITONACTOR_JOURNAL=str(workdir / "journal.jsonl"),
    )
    if repository is not None:
        env["TRITONACTOR_MODEL_REPOSITORY"] = str(repository)
    log_path = workdir / "server.log"
    command = [sys.executable, "-m", "hypercorn", "tritonactor.app:app", "--workers", "1"]
    command += ["--bind", f"127.0.0.1:{http_port}"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"server exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1):
                return Server(process, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}")
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    stop_server(process)
    sys.exit(f"server did not become ready:\n{log_path.read_text()[-3000:]}")


def run_perf_analyzer(
    binary: str,
    model: str,
    url: str,
    protocol: str,
    extra: Sequence[str],
    concurrency: int,
    interval_ms: int,
    workdir: Path,
    server_pid: int,
) -> Result | None:
    name = f"{protocol}{''.join(extra).replace('-', '_')}-c{concurrency}"
    report = workdir / f"{name}.csv"
    command = [
        binary,
        "-m", model,
        "-u", url,
        "-i", protocol,
        *extra,
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(interval_ms),
        "-s", str(STABILITY_PERCENT),
        "-r", str(MAX_TRIALS),
        "-f", str(report),
    ]  # fmt: skip
    timeout = 30 + 2 * MAX_TRIALS * interval_ms / 1000
    server_before = tree_cpu_seconds(server_pid)
    client_before = children_cpu_seconds()
    self_before = self_cpu_seconds()
    busy_before = machine_busy_seconds()
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout)
        output = done.stdout + done.stderr
        failed = done.returncode != 0 or not report.is_file()
    except subprocess.TimeoutExpired:
        output, failed = f"timed out after {timeout:.0f}s\n", True
    elapsed = time.perf_counter() - began
    server_after = tree_cpu_seconds(server_pid)
    busy_after = machine_busy_seconds()
    client = children_cpu_seconds() - client_before
    other = None
    if None not in (server_before, server_after, busy_before, busy_after):
        ours = server_after - server_before + client + self_cpu_seconds() - self_before
        other = max(0.0, busy_after - busy_before - ours) / elapsed
    (workdir / f"{name}.log").write_text(output)
    if failed:
        return None
    with report.open(newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows:
        return None
    rate = float(rows[-1]["Inferences/Second"])
    server_us = None
    if server_before is not None and server_after is not None and rate > 0:
        # CPU over the whole run (warm-up windows included) per inference at the stable rate.
        server_us = (server_after - server_before) / elapsed / rate * 1e6
    return Result(
        infer_per_sec=rate,
        p50_us=float(rows[-1]["p50 latency"]),
        server_us_per_infer=server_us,
        client_cores=client / elapsed,
        other_cores=other,
    )


def floors(server: Server, seconds: float) -> dict[str, tuple[float, float | None]]:
    """ServerLive (gRPC, grpcio) and GET /v2/health/live (HTTP, http.client) back to back on
    one connection: requests/s and server CPU µs per request, transport and routing only."""
    results = {"HTTP": http_floor(server.http_url, server.process.pid, seconds)}
    with grpc.insecure_channel(server.grpc_url) as channel:
        live = service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive
        request = service_pb2.ServerLiveRequest()
        for _ in range(200):
            live(request)
        cpu_before = tree_cpu_seconds(server.process.pid)
        began = time.perf_counter()
        count = 0
        while time.perf_counter() - began < seconds:
            live(request)
            count += 1
        elapsed = time.perf_counter() - began
        cpu_after = tree_cpu_seconds(server.process.pid)
    per_request = None
    if cpu_before is not None and cpu_after is not None:
        per_request = (cpu_after - cpu_before) * 1e6 / count
    results["gRPC"] = (count / elapsed, per_request)
    return results


def _number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(a: Result | None, b: Result | None) -> str:
    if a is None or b is None or b.infer_per_sec == 0:
        return "-"
    return f"{a.infer_per_sec / b.infer_per_sec:.2f}"


def format_table(results: dict[int, dict[str, Result | None]]) -> str:
    labels = [label for label, _, _ in MODES]
    header = ["concurrency"]
    for label in labels:
        header += [f"{label} infer/s", f"{label} p50 µs", f"{label} server CPU µs/infer"]
    header += ["gRPC / HTTP", "gRPC stream / HTTP", "other processes' cores (max)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for level, row in results.items():
        cells = [str(level)]
        for label in labels:
            result = row.get(label)
            if result is None:
                cells += ["failed" if label in row else "skipped", "-", "-"]
            else:
                cells += [
                    _number(result.infer_per_sec),
                    _number(result.p50_us),
                    _number(result.server_us_per_infer),
                ]
        cells += [
            _ratio(row.get("gRPC"), row.get("HTTP")),
            _ratio(row.get("gRPC stream"), row.get("HTTP")),
        ]
        others = [
            r.other_cores for r in row.values() if r is not None and r.other_cores is not None
        ]
        cells.append(f"{max(others):.2f}" if others else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="simple")
    parser.add_argument("--model-repository", type=Path, default=None)
    parser.add_argument("--levels", default="1,4,16", help="comma-separated concurrencies")
    parser.add_argument("--duration-ms", type=int, default=1500, help="perf_analyzer window")
    parser.add_argument("--floor-s", type=float, default=1.0, help="seconds per floor run")
    parser.add_argument(
        "--budget-s", type=float, default=100, help="start no perf_analyzer run after this"
    )
    parser.add_argument("--perf-analyzer", help="perf_analyzer binary (default: install one)")
    parser.add_argument("--keep", action="store_true", help="keep logs and CSVs; print where")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(level) for level in args.levels.split(",") if level.strip()]
    if not levels or min(levels) < 1:
        sys.exit("--levels needs positive integers, e.g. 1,4,16")
    started = time.monotonic()
    perf_analyzer = locate_perf_analyzer(args.perf_analyzer)
    facts = machine_facts(perf_analyzer)
    print(f"model {args.model}; perf_analyzer and one hypercorn worker share {usable_cpus()} CPUs")
    for key, value in facts.items():
        print(f"  {key}: {value}")

    workdir = Path(tempfile.mkdtemp(prefix="tritonactor-grpc-bench-"))
    server = start_server(args.model_repository, workdir)
    results: dict[int, dict[str, Result | None]] = {}
    try:
        floor = floors(server, args.floor_s)
        # Levels outside, protocols inside: a drift of the machine over the run then shows
        # in every protocol alike instead of in the ratio.
        for level in levels:
            results[level] = {}
            for label, protocol, extra in MODES:
                if time.monotonic() - started > args.budget_s:
                    print(f"budget of {args.budget_s:.0f} s spent: skipping {label} at {level}")
                    continue
                print(f"{label} concurrency {level} ...", flush=True)
                url = server.http_url if protocol == "http" else server.grpc_url
                results[level][label] = run_perf_analyzer(
                    perf_analyzer,
                    args.model,
                    url,
                    protocol,
                    extra,
                    level,
                    args.duration_ms,
                    workdir,
                    server.process.pid,
                )
    finally:
        stop_server(server.process)

    print()
    print(format_table(results))
    print(
        f"perf_analyzer {'/'.join(label for label, _, _ in MODES)}: sync unary calls or one "
        f"stream per context; window {args.duration_ms} ms, ±{STABILITY_PERCENT} % over 3 "
        f"windows, at most {MAX_TRIALS}. Server CPU: over the whole run per stable infer/s."
    )
    for label, (rate, cpu) in floor.items():
        print(f"{label} floor (liveness, one connection): {rate:,.0f} req/s, server CPU "
              f"{_number(cpu)} µs/request")  # fmt: skip
    print(f"total {time.monotonic() - started:.0f} s")
    failed = any(result is None for row in results.values() for result in row.values())
    if args.keep or failed:
        print(f"logs and CSVs: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
