"""Reloading a model while it serves: requests that fail, and the tail, against a steady run.

    python bench/hot_swap.py [--workers 2] [--seconds 5] [--threads 4]

Starts `tritonactor serve` in explicit mode on a copy of the bundled `simple` model, sends
requests back to back from `--threads` keep-alive connections for `--seconds` (steady), then
again while another thread reloads the model over and over with a config that differs each
time (a new copy is loaded beside the old one, the router swaps, the old drains). Prints
requests, failures and p50/p99 of both phases, and the number of reloads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
SIMPLE = ROOT / "tritonactor" / "examples" / "models" / "simple"
BODY = {
    "inputs": [
        {"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load(base: str, stop: threading.Event, count: list[int]) -> None:
    config = json.loads(
        requests.get(f"{base}/v2/models/simple/config", timeout=30).content.decode()
    )
    session = requests.Session()
    n = 0
    while not stop.is_set():
        n += 1
        # A different config each time: a real reload (an unchanged one is a no-op).
        config["parameters"] = {"swap": {"string_value": str(n)}}
        answer = session.post(
            f"{base}/v2/repository/models/simple/load",
            json={"parameters": {"config": json.dumps(config)}},
            timeout=120,
        )
        answer.raise_for_status()
        count[0] += 1


def hammer(base: str, seconds: float, threads: int, swap: bool) -> dict[str, float]:
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker() -> None:
        session = requests.Session()
        # Answers uncompressed, as perf_analyzer takes them (requests asks for gzip by default).
        session.headers["Accept-Encoding"] = "identity"
        mine: list[float] = []
        failed = 0
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                ok = session.post(f"{base}/v2/models/simple/infer", json=BODY, timeout=60).ok
            except requests.RequestException:
                ok = False
            mine.append(time.perf_counter() - started)
            failed += not ok
        with lock:
            latencies.extend(mine)
            failures[0] += failed

    stop = threading.Event()
    reloads = [0]
    loader = threading.Thread(target=load, args=(base, stop, reloads)) if swap else None
    if loader is not None:
        loader.start()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    stop.set()
    if loader is not None:
        loader.join()
    latencies.sort()
    return {
        "requests": len(latencies),
        "failed": failures[0],
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "reloads": reloads[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = Path(folder) / "models"
        shutil.copytree(SIMPLE, repo / "simple")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONACTOR_")}
        env["TRITONACTOR_JOURNAL"] = str(Path(folder) / "journal.jsonl")
        command = [
            *(sys.executable, "-m", "tritonactor.cli", "serve"),
            *("--model-repository", str(repo), "--model-control-mode", "explicit"),
            *("--load-model", "simple", "--http-address", "127.0.0.1"),
            *("--http-port", str(port), "--grpc-port", str(free_port())),
            *("--metrics-port", str(free_port()), "--workers", str(args.workers)),
        ]
        log = open(Path(folder) / "server.log", "wb")  # noqa: SIM115
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if requests.get(f"{base}/v2/health/ready", timeout=1).ok:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.1)
            hammer(base, 1, args.threads, swap=False)  # warm up
            steady = hammer(base, args.seconds, args.threads, swap=False)
            swapping = hammer(base, args.seconds, args.threads, swap=True)
        finally:
            server.terminate()
            server.wait(timeout=60)
            log.close()
    print(f"workers {args.workers}, {args.threads} connections, {args.seconds} s per phase")
    print("| phase | requests | failed | p50 ms | p99 ms | reloads |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in (("steady", steady), ("reloading", swapping)):
        print(
            f"| {name} | {row['requests']:.0f} | {row['failed']:.0f} | {row['p50_ms']:.2f} "
            f"| {row['p99_ms']:.2f} | {row['reloads']:.0f} |"
        )
    print(f"p99 reloading / steady: {swapping['p99_ms'] / steady['p99_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
