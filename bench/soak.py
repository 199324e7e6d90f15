"""A soak: N minutes of mixed HTTP, gRPC and streaming traffic against a real server, with
faults injected on a schedule; what was sent, answered, failed and lost, and the server's memory.

    python bench/soak.py [--minutes 3] [--workers 2] [--clients 2] [--fault-every 20]
                         [--faults reload,unload,kill,restart] [--json FILE] [--keep]

Starts `tritonactor serve` (explicit mode, `--workers`) on a repository built for it: `identity`
(python, FP32, two instances), `repeat` (python, decoupled: one response per element, for
streams) and the bundled `simple` (ONNX Runtime). Traffic, `--clients` threads of each kind,
back to back: HTTP infer (JSON) on identity and simple, gRPC infer on both, gRPC streaming
infer on repeat, and HTTP `/generate_stream` (Server-Sent Events) on repeat.

Every `--fault-every` seconds the next fault of `--faults`, in turn:

- `reload`: an explicit load of `identity` with a changed config (a new copy swaps in);
- `unload`: unload `simple`, then load it again;
- `kill`: `kill -9` of one python model process (a stub of identity or repeat);
- `restart`: SIGTERM to the server, wait for it to exit, start it again (same ports, same
  journal).

Each request ends one way: **ok**; **failed** (the server answered with an error); **lost**
(sent, never answered: a timeout, or the connection or stream cut under it); or **refused**
(never sent: no server listening, during a restart). A request whose lifetime overlaps a fault
(from the fault's start to a few seconds after it ends) is counted against that fault;
the others are "outside faults". Every `--sample-every` seconds the resident memory (VmRSS) of
the server's processes is read from /proc and printed as a table at the end.

Exits 1 when any request was lost, or failed outside faults; 0 otherwise. Not part of the
test suite: docs/soak.md has how to run it and a recorded run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests
from soak_traffic import REQUEST_TIMEOUT, Ledger, Traffic

ROOT = Path(__file__).resolve().parent.parent
SIMPLE = ROOT / "tritonactor" / "examples" / "models" / "simple"

IDENTITY_CONFIG = """name: "identity"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
# the tests' python identity, the same model whatever its config says of its shapes
IDENTITY_MODEL = (ROOT / "tests" / "python_models" / "identity_fp32" / "1" / "model.py").read_text()
REPEAT_CONFIG = """name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
"""
REPEAT_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for index, value in enumerate(values):
                sender.send(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                            pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                        ]
                    )
                )
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def build_repository(folder: Path) -> Path:
    repo = folder / "models"
    for name, config, model in (
        ("identity", IDENTITY_CONFIG, IDENTITY_MODEL),
        ("repeat", REPEAT_CONFIG, REPEAT_MODEL),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(model)
    shutil.copytree(SIMPLE, repo / "simple")
    return repo


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the server --------------------------------------------------------------------------------


class Server:
    """`tritonactor serve` on fixed ports, started again by `restart`."""

    def __init__(self, repo: Path, folder: Path, workers: int) -> None:
        self.folder = folder
        self.http_port, self.grpc_port = free_port(), free_port()
        self.command = [
            *(sys.executable, "-m", "tritonactor.cli", "serve"),
            *("--model-repository", str(repo), "--model-control-mode", "explicit"),
            *("--load-model", "*", "--http-address", "127.0.0.1"),
            *("--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)),
            *("--metrics-port", str(free_port()), "--workers", str(workers)),
            *("--journal", str(folder / "journal.jsonl")),
        ]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONACTOR_")}
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 120) -> None:
        self.starts += 1
        log = (self.folder / f"server-{self.starts}.log").open("wb")
        self.process = subprocess.Popen(
            self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.base}/v2/health/ready", timeout=1).ok:
                    return
            time.sleep(0.1)
        raise RuntimeError("the server did not become ready")

    def stop(self, timeout: float = 90) -> int | None:
        """SIGTERM, and wait for the exit (SIGKILL past `timeout`)."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None

    def processes(self) -> dict[int, str]:
        """pid -> role, for the server and every process below it."""
        if self.process is None or self.process.poll() is not None:
            return {}
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    ppid = int(stat.rsplit(")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(entry))
        roles: dict[int, str] = {}
        pending = [self.process.pid]
        while pending:
            pid = pending.pop()
            roles[pid] = _role(pid, pid == self.process.pid)
            pending.extend(children.get(pid, []))
        return roles


def _role(pid: int, root: bool) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    if "tritonactor.backends.python.stub" in command:
        return "python model"
    if "tritonactor.engine" in command:
        return "engine"
    return "serve" if root else "front end"


def rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# --- faults ------------------------------------------------------------------------------------


class Faults:
    def __init__(self, server: Server, ledger: Ledger, names: list[str]) -> None:
        self.server = server
        self.ledger = ledger
        self.names = names
        self.turn = 0
        self.reloads = 0
        self.log: list[str] = []

    def next(self) -> None:
        name = self.names[self.turn % len(self.names)]
        self.turn += 1
        start = time.monotonic()
        try:
            note = getattr(self, name)()
        except Exception as error:
            note = f"FAILED: {type(error).__name__}: {error}"
        end = time.monotonic()
        self.ledger.fault(name, start, end)
        self.log.append(f"{name}: {note} ({end - start:.1f} s)")
        print(f"  fault {self.turn}: {self.log[-1]}", flush=True)

    def _post(self, path: str, body: dict[str, Any] | None = None) -> None:
        answer = requests.post(f"{self.server.base}{path}", json=body or {}, timeout=120)
        if answer.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {answer.status_code} {answer.text[:200]}")

    def reload(self) -> str:
        self.reloads += 1
        config = requests.get(f"{self.server.base}/v2/models/identity/config", timeout=30).json()
        config["parameters"] = {"soak": {"string_value": str(self.reloads)}}
        self._post(
            "/v2/repository/models/identity/load",
            {"parameters": {"config": json.dumps(config)}},
        )
        return "identity reloaded with a changed config"

    def unload(self) -> str:
        self._post("/v2/repository/models/simple/unload")
        self._post("/v2/repository/models/simple/load")
        return "simple unloaded and loaded"

    def kill(self) -> str:
        stubs = [pid for pid, role in self.server.processes().items() if role == "python model"]
        if not stubs:
            return "no python model process found"
        victim = random.choice(stubs)
        os.kill(victim, signal.SIGKILL)
        return f"kill -9 {victim} (one of {len(stubs)} python model processes)"

    def restart(self) -> str:
        code = self.server.stop()
        stopped = time.monotonic()
        self.server.start()
        return f"exit code {code}; ready again {time.monotonic() - stopped:.1f} s after exit"


# --- the run -----------------------------------------------------------------------------------


def sample_memory(server: Server, samples: list[dict[str, Any]], started: float) -> None:
    by_role: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for pid, role in server.processes().items():
        by_role[role] += rss_kib(pid)
        count[role] += 1
    samples.append({"t": time.monotonic() - started, "kib": dict(by_role), "count": dict(count)})


# A drain's line when its exit timeout ends requests it had admitted (frontends/drain.py).
_CUT = re.compile(rb"exit timeout \([^)]*\): (\d+) request\(s\) still in flight")


def read_server_logs(folder: Path) -> dict[str, int]:
    """What the servers' own logs say: requests they had admitted and cut at a drain's exit
    timeout (a lost request the server admitted shows here; a connection reset before the app
    admitted anything does not), and tracebacks."""
    cut = tracebacks = 0
    for log in sorted(folder.glob("server-*.log")):
        text = log.read_bytes()
        cut += sum(int(n) for n in _CUT.findall(text))
        tracebacks += text.count(b"Traceback (most recent call last)")
    return {"admitted_cut_by_drain": cut, "tracebacks": tracebacks}


def report(ledger: Ledger, samples: list[dict[str, Any]], faults: Faults) -> dict[str, Any]:
    rows: dict[str, Counter[str]] = {}
    examples: dict[str, Counter[str]] = {}
    for outcome in ledger.outcomes:
        blame = ledger.blame(outcome) if outcome.result != "ok" else None
        column = outcome.result if blame is None else f"{outcome.result} ({blame})"
        rows.setdefault(outcome.kind, Counter())[column] += 1
        if outcome.result != "ok":
            where = "outside faults" if blame is None else f"during {blame}"
            examples.setdefault(f"{outcome.result} {where}", Counter())[outcome.detail] += 1
    total = Counter[str]()
    for row in rows.values():
        total.update(row)
    columns = sorted({c for row in rows.values() for c in row}, key=lambda c: (c != "ok", c))
    print("\n| traffic | sent | " + " | ".join(columns) + " |")
    print("|---|---:|" + "---:|" * len(columns))
    for kind, row in [*sorted(rows.items()), ("**all**", total)]:
        sent = sum(n for c, n in row.items() if not c.startswith("refused"))
        print(f"| {kind} | {sent} | " + " | ".join(str(row.get(c, 0)) for c in columns) + " |")
    print("\nfaults:")
    for line in faults.log:
        print(f"- {line}")
    if examples:
        print("\nerrors (count, first 3 distinct of each):")
        for key in sorted(examples):
            print(f"- {key}:")
            for detail, n in examples[key].most_common(3):
                print(f"  - {n} x {detail}")
    roles = sorted({r for s in samples for r in s["kib"]})
    print("\n| t (s) | " + " | ".join(f"{r} MiB" for r in roles) + " | total MiB | processes |")
    print("|---:|" + "---:|" * (len(roles) + 2))
    for s in samples:
        cells = [f"{s['kib'].get(r, 0) / 1024:.0f}" for r in roles]
        total_mib = sum(s["kib"].values()) / 1024
        print(
            f"| {s['t']:.0f} | " + " | ".join(cells) + f" | {total_mib:.0f} | "
            f"{sum(s['count'].values())} |"
        )
    lost = sum(n for c, n in total.items() if c.startswith("lost"))
    failed_outside = total.get("failed", 0)
    lost_outside = total.get("lost", 0)
    summary = {
        "sent": sum(n for c, n in total.items() if not c.startswith("refused")),
        "ok": total.get("ok", 0),
        "failed_outside_faults": failed_outside,
        "failed_during_faults": sum(
            n for c, n in total.items() if c.startswith("failed") and c != "failed"
        ),
        "lost": lost,
        "lost_outside_faults": lost_outside,
        "refused": sum(n for c, n in total.items() if c.startswith("refused")),
        "by_traffic": {k: dict(v) for k, v in rows.items()},
        "faults": faults.log,
        "memory": samples,
    }
    print(
        f"\nsent {summary['sent']}, ok {summary['ok']}, failed {failed_outside} outside faults "
        f"+ {summary['failed_during_faults']} during them, lost {lost} "
        f"({lost_outside} outside faults), refused {summary['refused']} (not sent: no server)"
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=2, help="threads of each kind")
    parser.add_argument("--fault-every", type=float, default=20, help="seconds")
    parser.add_argument("--faults", default="reload,unload,kill,restart")
    parser.add_argument("--sample-every", type=float, default=10, help="seconds")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--keep", action="store_true", help="keep the folder (server logs)")
    args = parser.parse_args()
    names = [n.strip() for n in args.faults.split(",") if n.strip()]
    unknown = set(names) - {"reload", "unload", "kill", "restart"}
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    folder = Path(tempfile.mkdtemp(prefix="tritonactor-soak-"))
    server = Server(build_repository(folder), folder, args.workers)
    ledger, stop = Ledger(), threading.Event()
    faults = Faults(server, ledger, names)
    samples: list[dict[str, Any]] = []
    print(f"soak: {args.minutes} min, --workers {args.workers}, {args.clients} clients of each "
          f"kind, a fault every {args.fault_every} s ({', '.join(names)}); folder {folder}",
          flush=True)  # fmt: skip
    server.start()
    traffic = Traffic(server, ledger, stop)
    kinds = (traffic.http_infer, traffic.grpc_infer, traffic.grpc_stream, traffic.http_stream)
    threads = [
        threading.Thread(target=target, daemon=True)
        for target in kinds
        for _ in range(args.clients)
    ]
    started = time.monotonic()
    sampled = threading.Event()

    def sampler() -> None:  # on a clock of its own: a restart holds the fault loop
        while True:
            sample_memory(server, samples, started)
            if sampled.wait(args.sample_every):
                return

    threads.append(threading.Thread(target=sampler, daemon=True))
    for thread in threads:
        thread.start()
    end = started + 60 * args.minutes
    next_fault = started + args.fault_every
    try:
        while (now := time.monotonic()) < end:
            if names and now >= next_fault:
                faults.next()
                next_fault = time.monotonic() + args.fault_every
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))
    finally:
        stop.set()
        sampled.set()
        for thread in threads:
            thread.join(REQUEST_TIMEOUT + 5)
        code = server.stop()
        print(f"server stopped, exit code {code}", flush=True)
    summary = report(ledger, samples, faults)
    summary.update(read_server_logs(folder))
    print(
        f"server logs: {summary['admitted_cut_by_drain']} admitted request(s) cut at a drain's "
        f"exit timeout, {summary['tracebacks']} traceback(s)"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    if args.keep:
        print(f"kept {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if summary["lost"] or summary["failed_outside_faults"] else 0


if __name__ == "__main__":
    sys.exit(main())
