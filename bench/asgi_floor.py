"""The floor under a front end: what the ASGI server alone costs a small infer request, with an
app that does nothing but answer.

    python bench/asgi_floor.py [--servers hypercorn,uvicorn] [--rounds 2] [--seconds 8]

Each server runs this file's `app` in one worker process: it reads a request's body, answers
perf_analyzer's metadata and config requests for a python identity FP32 [-1,16] model, and
every infer request with the same fixed bytes (the size, headers and binary layout of
`tritonactor serve`'s answer to `identity_fp32` with a [1,16] input). perf_analyzer runs at
concurrency 8 over binary HTTP; after a warm-up, the server's CPU (utime + stime of its
processes, hypercorn's worker and its idle parent, from /proc) over `--seconds`, divided by the
requests the app answered, is the floor a request. hypercorn
runs as `python -m hypercorn` with its default worker class (asyncio's loop; `--hypercorn-args
"-k uvloop"` for another), uvicorn as `tritonactor serve` runs it (httptools, uvloop).
Compare with a front end's own CPU a request (`bench/process_cpu.py`, `--asgi-server
hypercorn` for hypercorn's): what is left is the app's. Run it on a quiet machine; the figure
depends on the rate the server runs at (docs/benchmarks.md, "The design card's hypercorn on
uvloop").
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PERF_ANALYZER = Path.home() / ".cache/tritonactor-peers/bin/perf_analyzer"

_META = {
    "name": "identity_fp32",
    "versions": ["1"],
    "platform": "python",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
}
_CONFIG = {
    "name": "identity_fp32",
    "max_batch_size": 16,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    "backend": "python",
}
_HEADER = json.dumps(
    {
        "model_name": "identity_fp32",
        "model_version": "1",
        "outputs": [
            {
                "name": "OUTPUT0",
                "datatype": "FP32",
                "shape": [1, 16],
                "parameters": {"binary_data_size": 64},
            }
        ],
    },
    separators=(",", ":"),
).encode()
_ANSWER = _HEADER + bytes(64)
_INFER_HEADERS = [
    (b"inference-header-content-length", b"%d" % len(_HEADER)),
    (b"content-length", b"%d" % len(_ANSWER)),
    (b"content-type", b"application/octet-stream"),
]
_ANSWERED = [0]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The app the floor is measured with (see the module's docstring)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    path = scope["path"]
    if path.endswith("/infer"):
        _ANSWERED[0] += 1
        body, headers = _ANSWER, _INFER_HEADERS
    else:
        if path == "/answered":
            body = b"%d" % _ANSWERED[0]
        else:
            body = json.dumps(_CONFIG if path.endswith("/config") else _META).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _answered(port: int) -> int:
    return int(urllib.request.urlopen(f"http://127.0.0.1:{port}/answered").read())


def measure(name: str, seconds: float, hypercorn_args: list[str]) -> tuple[int, float]:
    """(requests a second, the server's CPU µs a request) of one server."""
    # (Here, not at the top: the server imports this module for its app, which needs none.)
    sys.path.insert(0, str(HERE))
    from http_infer import free_port, tree_cpu_seconds

    port = free_port()
    module = "bench.asgi_floor:app"  # (from the repository's root, the server's folder)
    if name == "hypercorn":
        command = ["-m", "hypercorn", module, "--bind", f"127.0.0.1:{port}", *hypercorn_args]
    else:
        command = ["-m", "uvicorn", module, "--host", "127.0.0.1", "--port", str(port)]
        command += ["--http", "httptools", "--loop", "uvloop", "--no-access-log"]
    server = subprocess.Popen(
        [sys.executable, *command],
        cwd=HERE.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    load = None
    try:
        for _ in range(200):
            try:
                _answered(port)
                break
            except OSError:
                time.sleep(0.1)
        target = ["-m", "identity_fp32", "-u", f"127.0.0.1:{port}", "-i", "http"]
        window = ["--concurrency-range", "8", "-p", "30000", "-s", "50"]
        load = subprocess.Popen(
            [str(PERF_ANALYZER), *target, *window, "--shape", "INPUT0:1,16"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(4)  # perf_analyzer's warm-up
        cpu, answered = tree_cpu_seconds(server.pid) or 0.0, _answered(port)
        time.sleep(seconds)
        cpu = (tree_cpu_seconds(server.pid) or 0.0) - cpu
        answered = _answered(port) - answered
        return round(answered / seconds), cpu / max(answered, 1) * 1e6
    finally:
        if load is not None:
            load.terminate()
            load.wait()
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="hypercorn,uvicorn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--hypercorn-args", default="", help="hypercorn's own flags, quoted")
    args = parser.parse_args()
    if not PERF_ANALYZER.exists():
        parser.error(f"no {PERF_ANALYZER}: run ../shared/peers/setup.sh (as bench/process_cpu.py)")
    for round_ in range(args.rounds):
        for name in args.servers.split(","):
            rate, floor = measure(name, args.seconds, shlex.split(args.hypercorn_args))
            print(f"round {round_ + 1} {name}: {rate} infer/s, the server {floor:.0f} us a request")


if __name__ == "__main__":
    main()
