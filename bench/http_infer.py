"""Served vs in-process inference: perf_analyzer over HTTP against one hypercorn worker, beside
the same ONNX file run by onnxruntime directly in this process.

    python bench/http_infer.py [--model simple] [--duration-ms 3000] [--levels 1,2,4,8,16]

For each concurrency N it prints what the server sustained (infer/s, p50/p99 latency as the
client saw it), what N Python threads calling `InferenceSession.run` directly sustained, and
the ratio of the two: the share of raw onnxruntime throughput that survives the serving stack.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import http.client
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_REPOSITORY = REPO_ROOT / "tritonactor" / "examples" / "models"
# CI and developer machines keep the shared tools beside the checkout, not inside it.
INSTALLER = REPO_ROOT / "deploy" / "install-perf-analyzer.sh"

# The first windows of a run are what warms the server up; perf_analyzer's stability check
# (the last 3 windows within +-STABILITY % of each other) discards them. On 2 shared cores a
# 10 % band often never settles, so the default is looser, and a level that still does not
# settle is retried once with a band loose enough that it always reports (flagged in the table).
STABILITY_PERCENT = 20
MAX_TRIALS = 5
RETRY_STABILITY_PERCENT = 60
RETRY_MAX_TRIALS = 4


@dataclass(frozen=True)
class Measurement:
    infer_per_sec: float
    p50_us: float
    p99_us: float
    # CPU that processes outside the benchmark used meanwhile, in cores: other work on the
    # machine competing for the same CPUs. Anything well above 0 makes the row suspect.
    other_cores: float | None = None


@dataclass(frozen=True)
class Load:
    """CPU use over a whole perf_analyzer run, in cores (1.0 = one core busy all along)."""

    server_cores: float | None
    client_cores: float
    other_cores: float | None


@dataclass(frozen=True)
class Row:
    concurrency: int
    served: Measurement | None
    served_loose: bool  # measured only with the retry's looser stability band
    load: Load | None
    in_process: Measurement

    @property
    def server_us_per_infer(self) -> float | None:
        if self.served is None or self.load is None or self.load.server_cores is None:
            return None
        return self.load.server_cores * 1e6 / self.served.infer_per_sec

    @property
    def ratio(self) -> float | None:
        if self.served is None or self.in_process.infer_per_sec == 0:
            return None
        return self.served.infer_per_sec / self.in_process.infer_per_sec


# -- perf_analyzer ------------------------------------------------------------------------------


def locate_perf_analyzer(override: str | None) -> str:
    if override:
        return override
    if not INSTALLER.is_file():
        sys.exit(f"perf_analyzer installer not found at {INSTALLER}; pass --perf-analyzer PATH")
    # The installer pipes `ldd --version | head -1` under `set -o pipefail`: now and then ldd
    # dies of SIGPIPE and the script exits 141 having done nothing wrong. Running it again is safe.
    for _ in range(3):
        result = subprocess.run(
            ["bash", str(INSTALLER)], capture_output=True, text=True, check=False, timeout=600
        )
        if result.returncode != 141:
            break
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        sys.exit(f"{INSTALLER} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return lines[-1]


def run_perf_analyzer(
    binary: str,
    model: str,
    url: str,
    concurrency: int,
    interval_ms: int,
    workdir: Path,
    stability: int,
    trials: int,
    server_pid: int,
) -> tuple[Measurement | None, Load]:
    report = workdir / f"pa-c{concurrency}-s{stability}.csv"
    command = [
        binary,
        "-m", model,
        "-u", url,
        "-i", "http",
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(interval_ms),
        "-s", str(stability),
        "-r", str(trials),
        "-f", str(report),
    ]  # fmt: skip
    timeout = 30 + 2 * trials * interval_ms / 1000
    log = workdir / f"pa-c{concurrency}-s{stability}.log"
    server_before = tree_cpu_seconds(server_pid)
    client_before = children_cpu_seconds()
    self_before = self_cpu_seconds()
    busy_before = machine_busy_seconds()
    began = time.perf_counter()
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=timeout
        )
        output = result.stdout + result.stderr
        failed = result.returncode != 0 or not report.is_file()
    except subprocess.TimeoutExpired:
        output = f"timed out after {timeout:.0f}s: {' '.join(command)}\n"
        failed = True
    elapsed = time.perf_counter() - began
    server_after = tree_cpu_seconds(server_pid)
    busy_after = machine_busy_seconds()
    server = None if server_before is None or server_after is None else server_after - server_before
    client = children_cpu_seconds() - client_before
    other = None
    if server is not None and busy_before is not None and busy_after is not None:
        ours = server + client + self_cpu_seconds() - self_before
        other = max(0.0, busy_after - busy_before - ours) / elapsed
    load = Load(
        server_cores=None if server is None else server / elapsed,
        client_cores=client / elapsed,
        other_cores=other,
    )
    log.write_text(output)
    if failed:
        return None, load
    with report.open(newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows:
        return None, load
    row = rows[-1]
    measurement = Measurement(
        infer_per_sec=float(row["Inferences/Second"]),
        p50_us=float(row["p50 latency"]),
        p99_us=float(row["p99 latency"]),
    )
    return measurement, load


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_seconds() -> float | None:
    """CPU time all processes have spent, in user and system mode, summed over the machine's
    CPUs (from /proc/stat). Interrupt time is left out: the kernel books loopback traffic there,
    not to the processes that caused it."""
    try:
        with open("/proc/stat") as file:
            user, nice, system = (int(v) for v in file.readline().split()[1:4])
    except (OSError, ValueError):
        return None
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU used by this process's reaped children: perf_analyzer, once `run` has waited for it."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU used so far by `pid` and its descendants (hypercorn runs its worker as a child), read
    from /proc; None where there is no /proc."""
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        stats = list(Path("/proc").glob("[0-9]*/stat"))
    except OSError:
        return None
    for stat in stats:
        try:
            text = stat.read_text()
        except OSError:
            continue  # the process ended while we looked
        fields = text[text.rindex(")") + 2 :].split()
        process = int(stat.parent.name)
        parents[process] = int(fields[1])
        used[process] = (int(fields[11]) + int(fields[12])) / tick
    if pid not in used:
        return None
    tree = {pid}
    grew = True
    while grew:
        grew = False
        for process, parent in parents.items():
            if parent in tree and process not in tree:
                tree.add(process)
                grew = True
    return sum(used[process] for process in tree)


# -- the server ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    repository: Path | None,
    workdir: Path,
    name: str = "server",
    env_extra: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """One hypercorn worker (on two cores or more a front end, beside the engine process it
    starts: docs/decisions.md) serving `repository` (None: the bundled examples), with none of this
    process's TRITONACTOR_* / OTEL_* settings but `env_extra`; waits until it is ready."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONACTOR_", "OTEL_"))}
    env.update(
        TRITONACTOR_GRPC_PORT=str(free_port()),
        TRITONACTOR_METRICS_PORT=str(free_port()),
        TRITONACTOR_JOURNAL=str(workdir / f"{name}-journal.jsonl"),
    )
    if repository is not None:
        env["TRITONACTOR_MODEL_REPOSITORY"] = str(repository)
    env.update(env_extra or {})
    command = [sys.executable, "-m", "hypercorn", "tritonactor.app:app"]
    command += ["--bind", f"127.0.0.1:{port}", "--workers", "1"]
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{name} exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                return process, f"127.0.0.1:{port}"
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    stop_server(process)
    sys.exit(f"{name} did not become ready:\n{log_path.read_text()[-3000:]}")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def http_floor(url: str, server_pid: int, seconds: float) -> tuple[float, float | None]:
    """GET /v2/health/live back to back on one keep-alive connection: what the HTTP stack
    alone costs (requests/s, server CPU µs per request), with no tensors, actors or model."""
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        for _ in range(200):
            connection.request("GET", "/v2/health/live")
            connection.getresponse().read()
        cpu_before = tree_cpu_seconds(server_pid)
        began = time.perf_counter()
        count = 0
        while time.perf_counter() - began < seconds:
            connection.request("GET", "/v2/health/live")
            connection.getresponse().read()
            count += 1
        elapsed = time.perf_counter() - began
        cpu_after = tree_cpu_seconds(server_pid)
    finally:
        connection.close()
    per_request = None
    if cpu_before is not None and cpu_after is not None:
        per_request = (cpu_after - cpu_before) * 1e6 / count
    return count / elapsed, per_request


# -- the in-process baseline --------------------------------------------------------------------


def model_file(repository: Path, model: str) -> Path:
    """The highest numbered version's model.onnx: what the server loads by default."""
    versions = [p for p in (repository / model).iterdir() if p.name.isdigit()]
    for version in sorted(versions, key=lambda p: int(p.name), reverse=True):
        path = version / "model.onnx"
        if path.exists():
            return path
    sys.exit(f"no <version>/model.onnx for model '{model}' under {repository}")


_ORT_TYPES = {
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
}


def batch_of_one(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """Random inputs shaped like a batch-1 request: every symbolic dimension is 1."""
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
        dtype = _ORT_TYPES[spec.type]
        feeds[spec.name] = (rng.random(shape) * 100).astype(dtype)
    return feeds


def measure_in_process(
    session: ort.InferenceSession, feeds: dict[str, np.ndarray], threads: int, duration_s: float
) -> Measurement:
    """`threads` threads calling `session.run` back to back on one shared session (onnxruntime
    releases the GIL while it runs); with one thread this is a plain loop."""
    latencies: list[list[int]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    stop_at = 0.0

    def loop(out: list[int]) -> None:
        barrier.wait()
        clock = time.perf_counter_ns
        run = session.run
        deadline_ns = int(stop_at * 1e9)
        while True:
            start = clock()
            run(None, feeds)
            end = clock()
            out.append(end - start)
            if end >= deadline_ns:
                return

    workers = [threading.Thread(target=loop, args=(out,)) for out in latencies]
    for worker in workers:
        worker.start()
    busy_before, self_before = machine_busy_seconds(), self_cpu_seconds()
    began = time.perf_counter()
    stop_at = began + duration_s
    barrier.wait()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    busy_after, self_after = machine_busy_seconds(), self_cpu_seconds()
    other = None
    if busy_before is not None and busy_after is not None:
        other = max(0.0, busy_after - busy_before - (self_after - self_before)) / elapsed
    every = np.concatenate([np.asarray(out, dtype=np.int64) for out in latencies])
    return Measurement(
        infer_per_sec=len(every) / elapsed,
        p50_us=float(np.percentile(every, 50)) / 1000,
        p99_us=float(np.percentile(every, 99)) / 1000,
        other_cores=other,
    )


def in_process_baseline(
    path: Path, levels: Sequence[int], duration_s: float
) -> dict[int, Measurement]:
    # Default session options, as the server uses for a config without onnxruntime parameters.
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = batch_of_one(session)
    for _ in range(200):  # first runs allocate and tune
        session.run(None, feeds)
    return {n: measure_in_process(session, feeds, n, duration_s) for n in levels}


# -- report -------------------------------------------------------------------------------------


def usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_facts(perf_analyzer: str) -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    pa = subprocess.run([perf_analyzer, "--version"], capture_output=True, text=True, check=False)
    pa_lines = (pa.stdout + pa.stderr).strip().splitlines()
    pa_version = pa_lines[-1] if pa_lines else "?"
    # The wheel's binary reports 0.0.0; the installer's wheel metadata knows the release.
    wheel = sorted(Path(perf_analyzer).resolve().parent.parent.glob("pa/perf_analyzer-*.dist-info"))
    if wheel:
        pa_version = f"{wheel[-1].name.removesuffix('.dist-info').split('-')[-1]} ({pa_version})"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": f"{usable_cpus()} usable (os.cpu_count {os.cpu_count()}), {cpu}",
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "hypercorn": version("hypercorn"),
        "starlette": version("starlette"),
        "perf_analyzer": pa_version,
    }


def _cores(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def format_table(rows: Sequence[Row]) -> str:
    header = (
        "| concurrency | served infer/s | served p50 µs | served p99 µs "
        "| in-process infer/s | in-process p50 µs | served / in-process "
        "| server CPU µs/infer | server cores | perf_analyzer cores "
        "| other processes' cores (served / in-process) |"
    )
    lines = [header, "|" + "---:|" * 11]
    for row in rows:
        local = row.in_process
        if row.served is None:
            served = ["failed", "-", "-"]
        else:
            mark = "*" if row.served_loose else ""
            served = [
                f"{row.served.infer_per_sec:,.0f}{mark}",
                f"{row.served.p50_us:,.0f}",
                f"{row.served.p99_us:,.0f}",
            ]
        ratio = "-" if row.ratio is None else f"{row.ratio:.2%}"
        cells = [str(row.concurrency), *served]
        cells += [f"{local.infer_per_sec:,.0f}", f"{local.p50_us:,.1f}", ratio]
        per_infer = row.server_us_per_infer
        cells.append("-" if per_infer is None else f"{per_infer:,.0f}")
        if row.load is None or row.load.server_cores is None:
            cells.append("-")
        else:
            cells.append(f"{row.load.server_cores:.2f}")
        cells.append("-" if row.load is None else f"{row.load.client_cores:.2f}")
        served_other = None if row.load is None else row.load.other_cores
        cells.append(f"{_cores(served_other)} / {_cores(local.other_cores)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="simple")
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=None,
        help="repository to serve (default: the bundled examples, the server's own default)",
    )
    parser.add_argument(
        "--duration-ms", type=int, default=3000, help="perf_analyzer measurement window"
    )
    parser.add_argument(
        "--baseline-ms", type=int, default=1000, help="in-process run per concurrency level"
    )
    parser.add_argument("--levels", default="1,2,4,8,16", help="comma-separated concurrencies")
    parser.add_argument("--perf-analyzer", help="perf_analyzer binary (default: install one)")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep logs and CSVs; print where")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(level) for level in args.levels.split(",") if level.strip()]
    if not levels or min(levels) < 1:
        sys.exit("--levels needs positive integers, e.g. 1,2,4,8,16")
    repository = args.model_repository or BUNDLED_REPOSITORY
    path = model_file(repository, args.model)
    perf_analyzer = locate_perf_analyzer(args.perf_analyzer)
    facts = machine_facts(perf_analyzer)

    print(f"model {args.model} ({path.relative_to(repository)} in {repository})", flush=True)
    for key, value in facts.items():
        print(f"  {key}: {value}")
    print(
        f"perf_analyzer, the hypercorn worker and its onnxruntime threads share "
        f"{usable_cpus()} CPUs."
    )

    # The baseline runs before the server starts, so the two never compete for the cores.
    print(f"in-process baseline: {args.baseline_ms} ms per level ...", flush=True)
    baseline = in_process_baseline(path, levels, args.baseline_ms / 1000)

    workdir = Path(tempfile.mkdtemp(prefix="tritonactor-bench-"))
    process, url = start_server(args.model_repository, workdir)
    rows = []
    try:
        floor_rate, floor_cpu = http_floor(url, process.pid, 2.0)
        for n in levels:
            print(f"perf_analyzer concurrency {n} ...", flush=True)
            loose = False
            served, load = run_perf_analyzer(
                perf_analyzer,
                args.model,
                url,
                n,
                args.duration_ms,
                workdir,
                STABILITY_PERCENT,
                MAX_TRIALS,
                process.pid,
            )
            if served is None:
                loose = True
                served, load = run_perf_analyzer(
                    perf_analyzer,
                    args.model,
                    url,
                    n,
                    args.duration_ms,
                    workdir,
                    RETRY_STABILITY_PERCENT,
                    RETRY_MAX_TRIALS,
                    process.pid,
                )
            rows.append(Row(n, served, loose, load, baseline[n]))
    finally:
        stop_server(process)

    print()
    print(format_table(rows))
    if any(row.served_loose for row in rows):
        print(f"* did not settle within ±{STABILITY_PERCENT} %; measured with ±", end="")
        print(f"{RETRY_STABILITY_PERCENT} % (noisier)")
    print(
        f"served: perf_analyzer -i http, sync, window {args.duration_ms} ms, one hypercorn worker; "
        "latency as the client saw it."
    )
    print("in-process: N threads calling InferenceSession.run on one session, batch 1.")
    floor_cpu_text = "?" if floor_cpu is None else f"{floor_cpu:,.0f}"
    print(
        f"HTTP floor: GET /v2/health/live from Python's http.client, one keep-alive connection: "
        f"{floor_rate:,.0f} req/s, server CPU {floor_cpu_text} µs/request."
    )
    print(
        "CPU columns: averaged over the whole perf_analyzer run at that level (its warm-up "
        "windows included); µs/infer = server cores / served infer/s. Other processes' cores: "
        "CPU the rest of the machine used meanwhile; well above 0, the row measured a shared box."
    )
    if args.keep or any(row.served is None for row in rows):
        print(f"logs and perf_analyzer CSVs: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        results = {
            "facts": facts,
            "args": vars(args),
            "http_floor": {"requests_per_sec": floor_rate, "server_cpu_us": floor_cpu},
            "rows": [asdict(row) for row in rows],
        }
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if all(row.served is not None for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
