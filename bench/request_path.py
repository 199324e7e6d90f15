"""Server CPU per HTTP request, and where it goes: one request in flight, N times.

    python bench/request_path.py [--requests 2000] [--cases small_onnx,big_onnx,...]
    python bench/request_path.py --mode asgi --profile small_onnx   # cProfile of the app alone

Two ways of measuring, on the same temporary repository (an ONNX identity and a python
identity, FP32, batch dimension first):

- `server` (default): one hypercorn worker (as bench/http_infer.py starts it), one keep-alive
  connection, requests back to back; the server's CPU (utime + stime of its process tree, from
  /proc) over the N requests, divided by N. `GET /v2/health/live` is the floor of the HTTP
  stack: hypercorn's parsing plus the smallest starlette route.
- `asgi`: the app in this process, called through ASGI directly with a prepared scope and body
  (no sockets, no HTTP parsing): the process's CPU per request is the app's own share, and
  `--profile CASE` prints cProfile's view of it. An empty ASGI app measures the driver itself.

Cases: `live` (GET /v2/health/live), `small_onnx` / `small_python` (FP32 [1,16] in and out,
binary), `seq_onnx` (the same ONNX identity under sequence batching, each request a sequence
of its own: START and END), `ensemble_onnx` (the same through an ensemble of two ONNX
identities, one after the other), `big_onnx` (FP32 1 MiB in and out, binary), `shm_onnx`
(1 MiB in and out through system shared memory), `json_onnx` (FP32 [1,16] as JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import http.client
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_infer import REPO_ROOT, free_port, start_server, stop_server, tree_cpu_seconds

# The asgi mode imports the app: this tree's, not whichever tritonactor is installed (an
# editable install of another checkout would be measured instead).
sys.path.insert(0, str(REPO_ROOT))
from process_cpu import cpu_by_role

SMALL = 16
BIG = 1 << 18  # FP32 elements: 1 MiB
CHUNK = 65536  # what one ASGI `http.request` message carries in the asgi mode

# the tests' python identity (its config here is this script's)
MODEL_PY = (
    Path(__file__).resolve().parent.parent / "tests/python_models/identity_fp32/1/model.py"
).read_text()


def _config(name: str, backend: str) -> str:
    kind = 'platform: "onnxruntime_onnx"' if backend == "onnx" else 'backend: "python"'
    return (
        f'name: "{name}"\n{kind}\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


# The two ONNX identities one after the other.
ENSEMBLE_CONFIG = """name: "ensemble_onnx"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "identity_onnx" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "identity_onnx_b" model_version: -1
    input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
"""


def write_repository(root: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["b", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b", "n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / "identity_onnx" / "1").mkdir(parents=True)
    (root / "identity_onnx" / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (root / "identity_onnx" / "config.pbtxt").write_text(_config("identity_onnx", "onnx"))
    (root / "identity_onnx_b" / "1").mkdir(parents=True)
    (root / "identity_onnx_b" / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (root / "identity_onnx_b" / "config.pbtxt").write_text(_config("identity_onnx_b", "onnx"))
    (root / "ensemble_onnx" / "1").mkdir(parents=True)
    (root / "ensemble_onnx" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    (root / "identity_onnx_seq" / "1").mkdir(parents=True)
    (root / "identity_onnx_seq" / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (root / "identity_onnx_seq" / "config.pbtxt").write_text(
        _config("identity_onnx_seq", "onnx") + "sequence_batching { }\n"
    )
    (root / "identity_python" / "1").mkdir(parents=True)
    (root / "identity_python" / "1" / "model.py").write_text(MODEL_PY)
    (root / "identity_python" / "config.pbtxt").write_text(_config("identity_python", "python"))


# -- requests ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def binary_infer(model: str, elements: int, parameters: dict[str, Any] | None = None) -> Call:
    data = np.arange(elements, dtype=np.float32).tobytes()
    header = json.dumps(
        {
            **({"parameters": parameters} if parameters else {}),
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, elements],
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return Call(
        "POST",
        f"/v2/models/{model}/infer",
        {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        },
        header + data,
    )


def json_infer(model: str, elements: int) -> Call:
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, elements],
                    "data": list(range(elements)),
                }
            ]
        }
    ).encode()
    return Call("POST", f"/v2/models/{model}/infer", {"Content-Type": "application/json"}, body)


def shm_infer(model: str, elements: int, in_region: str, out_region: str) -> Call:
    size = elements * 4
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, elements],
                    "parameters": {
                        "shared_memory_region": in_region,
                        "shared_memory_byte_size": size,
                    },
                }
            ],
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "parameters": {
                        "shared_memory_region": out_region,
                        "shared_memory_byte_size": size,
                    },
                }
            ],
        }
    ).encode()
    return Call("POST", f"/v2/models/{model}/infer", {"Content-Type": "application/json"}, body)


class Regions:
    """Two system shared-memory regions of 1 MiB (input filled), to register with the server."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.input = shared_memory.SharedMemory(f"ta_bench_in_{tag}", create=True, size=BIG * 4)
        self.output = shared_memory.SharedMemory(f"ta_bench_out_{tag}", create=True, size=BIG * 4)
        np.frombuffer(self.input.buf, dtype=np.float32)[:] = np.arange(BIG, dtype=np.float32)

    def register_calls(self) -> list[Call]:
        calls = []
        for region in (self.input, self.output):
            body = json.dumps({"key": f"/{region.name}", "offset": 0, "byte_size": BIG * 4})
            calls.append(
                Call(
                    "POST",
                    f"/v2/systemsharedmemory/region/{region.name}/register",
                    {"Content-Type": "application/json"},
                    body.encode(),
                )
            )
        return calls

    def check_output(self) -> None:
        out = np.frombuffer(self.output.buf, dtype=np.float32)
        assert np.array_equal(out, np.arange(BIG, dtype=np.float32)), "wrong output in shm"

    def close(self) -> None:
        for region in (self.input, self.output):
            region.close()
            region.unlink()


def cases(regions: Regions) -> dict[str, Call]:
    return {
        "live": Call("GET", "/v2/health/live", {}, b""),
        "small_onnx": binary_infer("identity_onnx", SMALL),
        "small_python": binary_infer("identity_python", SMALL),
        # a sequence of one request each time, through the sequence batcher
        "seq_onnx": binary_infer(
            "identity_onnx_seq",
            SMALL,
            {"sequence_id": 7, "sequence_start": True, "sequence_end": True},
        ),
        "ensemble_onnx": binary_infer("ensemble_onnx", SMALL),
        "json_onnx": json_infer("identity_onnx", SMALL),
        "big_onnx": binary_infer("identity_onnx", BIG),
        "shm_onnx": shm_infer("identity_onnx", BIG, regions.input.name, regions.output.name),
    }


# -- the server mode -----------------------------------------------------------------------------


def send(connection: http.client.HTTPConnection, call: Call) -> bytes:
    connection.request(call.method, call.path, body=call.body or None, headers=call.headers)
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{call.path}: {response.status} {data[:300]!r}")
    return data


def start_uvicorn(
    repository: Path,
    workdir: Path,
    workers: int = 0,
    env_extra: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """The same app under uvicorn (httptools, uvloop), one process; or, with `workers`,
    `tritonactor serve --workers N` (N front ends and the engine); `env_extra` over its
    settings (a gRPC port to know, say); waits until it is ready."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONACTOR_", "OTEL_"))}
    env.update(
        TRITONACTOR_GRPC_PORT=str(free_port()),
        TRITONACTOR_METRICS_PORT=str(free_port()),
        TRITONACTOR_JOURNAL=str(workdir / "journal.jsonl"),
        TRITONACTOR_MODEL_REPOSITORY=str(repository),
    )
    env.update(env_extra or {})
    command = [sys.executable, "-m", "uvicorn", "tritonactor.app:app", "--port", str(port)]
    command += ["--loop", "uvloop", "--http", "httptools", "--no-access-log"]
    if workers:
        # (`-m` from the tree: its own cli, not the installed one's)
        command = [sys.executable, "-m", "tritonactor.cli", "serve"]
        command += ["--http-port", str(port)]
        command += ["--workers", str(workers)]
    log = (workdir / "uvicorn.log").open("wb")
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"uvicorn exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                return process, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    stop_server(process)
    sys.exit("uvicorn did not become ready")


def measure_server(
    selected: Sequence[str],
    requests: int,
    workdir: Path,
    server: str = "hypercorn",
    workers: int = 2,
    by_process: bool = False,
) -> dict[str, float]:
    repository = workdir / "models"
    write_repository(repository)
    regions = Regions()
    if server in ("uvicorn", "serve"):
        process, url = start_uvicorn(repository, workdir, workers if server == "serve" else 0)
    else:
        process, url = start_server(repository, workdir)
    results: dict[str, float] = {}
    try:
        host, port = url.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        for call in regions.register_calls():
            send(connection, call)
        table = cases(regions)
        for name in selected:
            call = table[name]
            count = requests if name not in ("big_onnx", "shm_onnx") else max(requests // 4, 50)
            for _ in range(min(200, count)):
                send(connection, call)
            roles = cpu_by_role(process.pid) if by_process else None
            before = tree_cpu_seconds(process.pid)
            began = time.perf_counter()
            for _ in range(count):
                send(connection, call)
            wall = time.perf_counter() - began
            after = tree_cpu_seconds(process.pid)
            assert before is not None and after is not None
            results[name] = (after - before) / count * 1e6
            split = ""
            if roles is not None:
                now = cpu_by_role(process.pid)
                split = "   " + ", ".join(
                    f"{role} {(now[role] - roles[role]) / count * 1e6:.0f}" for role in sorted(now)
                )
            print(
                f"{name:14s} server CPU {results[name]:8.1f} us/request   "
                f"wall {wall / count * 1e6:8.1f} us/request   (n={count}){split}",
                flush=True,
            )
        if "shm_onnx" in selected:
            regions.check_output()
        connection.close()
    finally:
        stop_server(process)
        regions.close()
    return results


# -- the asgi mode -------------------------------------------------------------------------------


ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def scope_of(call: Call) -> dict[str, Any]:
    headers = [(k.lower().encode(), v.encode()) for k, v in call.headers.items()]
    if call.body:
        headers.append((b"content-length", str(len(call.body)).encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": call.method,
        "scheme": "http",
        "path": call.path,
        "raw_path": call.path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "extensions": {},
    }


def chunks_of(call: Call) -> list[bytes]:
    """The body as an ASGI server hands it over: in pieces of what one socket read gives."""
    return [call.body[i : i + CHUNK] for i in range(0, len(call.body), CHUNK)] or [b""]


async def call_asgi(
    app: ASGIApp, call: Call, scope: dict[str, Any], chunks: list[bytes] | None = None
) -> list[bytes]:
    """The response body's parts (the caller joins them if it must)."""
    chunks = chunks if chunks is not None else chunks_of(call)
    position = 0
    status = 0
    parts: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal position
        if position < len(chunks):
            position += 1
            return {
                "type": "http.request",
                "body": chunks[position - 1],
                "more_body": position < len(chunks),
            }
        await asyncio.Event().wait()  # no disconnect while the app works
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(dict(scope), receive, send)
    if status != 200:
        raise RuntimeError(f"{call.path}: {status} {b''.join(parts)[:300]!r}")
    return parts


async def empty_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def run_asgi(
    selected: Sequence[str], requests: int, workdir: Path, profile: str | None
) -> dict[str, float]:
    repository = workdir / "models"
    write_repository(repository)
    os.environ.update(
        TRITONACTOR_MODEL_REPOSITORY=str(repository),
        TRITONACTOR_GRPC_PORT=str(free_port()),
        TRITONACTOR_METRICS_PORT=str(free_port()),
        TRITONACTOR_JOURNAL=str(workdir / "journal.jsonl"),
    )
    from tritonactor.app import create_app

    app = create_app()
    regions = Regions()
    startup: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    done = asyncio.Event()
    sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await startup.put({"type": "lifespan.startup"})

    async def lifespan_receive() -> dict[str, Any]:
        return await startup.get()

    async def lifespan_send(message: dict[str, Any]) -> None:
        await sent.put(message)

    lifespan = asyncio.create_task(app({"type": "lifespan"}, lifespan_receive, lifespan_send))
    started = await sent.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"startup failed: {started}")
    results: dict[str, float] = {}
    try:
        for call in regions.register_calls():
            await call_asgi(app, call, scope_of(call))
        table = cases(regions)
        rows: list[tuple[str, ASGIApp, Call]] = [("empty_asgi", empty_app, table["small_onnx"])]
        rows += [(name, app, table[name]) for name in selected]
        for name, target, call in rows:
            scope = scope_of(call)
            chunks = chunks_of(call)
            count = requests if name not in ("big_onnx", "shm_onnx") else max(requests // 4, 50)
            for _ in range(min(200, count)):
                await call_asgi(target, call, scope, chunks)
            profiler = cProfile.Profile() if name == profile else None
            before = time.process_time()
            began = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            for _ in range(count):
                await call_asgi(target, call, scope, chunks)
            if profiler is not None:
                profiler.disable()
            wall = time.perf_counter() - began
            results[name] = (time.process_time() - before) / count * 1e6
            print(
                f"{name:14s} app CPU {results[name]:8.1f} us/request   "
                f"wall {wall / count * 1e6:8.1f} us/request   (n={count})",
                flush=True,
            )
            if profiler is not None:
                text = io.StringIO()
                stats = pstats.Stats(profiler, stream=text)
                stats.sort_stats("tottime").print_stats(30)
                stats.sort_stats("cumulative").print_stats(45)
                print(text.getvalue())
        if "shm_onnx" in selected:
            regions.check_output()
    finally:
        done.set()
        await startup.put({"type": "lifespan.shutdown"})
        await lifespan
        regions.close()
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("server", "asgi", "both"), default="both")
    parser.add_argument(
        "--server",
        choices=("hypercorn", "uvicorn", "serve"),
        default="hypercorn",
        help="server mode (serve: `tritonactor serve --workers N`: front ends and the engine)",
    )
    parser.add_argument("--workers", type=int, default=2, help="--server serve's front ends")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--cases", default="live,small_onnx,small_python,json_onnx,big_onnx,shm_onnx"
    )
    parser.add_argument("--profile", default=None, help="asgi mode: cProfile this case")
    parser.add_argument(
        "--by-process",
        action="store_true",
        help="server mode: each process's CPU a request too (the front end is `parent` "
        "under serve, whose first process becomes uvicorn's)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    selected = [name for name in args.cases.split(",") if name]
    with tempfile.TemporaryDirectory(prefix="request-path-") as tmp:
        workdir = Path(tmp)
        if args.mode in ("asgi", "both"):
            print("-- the app alone, through ASGI in this process (no HTTP parsing)")
            (workdir / "asgi").mkdir()
            asyncio.run(run_asgi(selected, args.requests, workdir / "asgi", args.profile))
        if args.mode in ("server", "both"):
            print(
                f"-- one {args.server} worker, one keep-alive connection (its process tree's CPU)"
            )
            (workdir / "server").mkdir()
            measure_server(
                selected,
                args.requests,
                workdir / "server",
                args.server,
                args.workers,
                args.by_process,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
