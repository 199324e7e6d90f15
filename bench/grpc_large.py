"""Server CPU per large gRPC request: `tritonactor serve` (one front end and the engine by
default) on an ONNX identity, one tritonclient gRPC call at a time.

    python bench/grpc_large.py [--requests 300] [--mebibytes 1] [--workers 1]

The server's CPU (utime + stime of its whole process tree, from /proc) over the calls,
divided by their number, and the wall time per call. `--workers 0` runs the app under uvicorn
in one process. The server starts as bench/request_path.py starts it: to compare two trees,
run each tree's own copy with that tree on PYTHONPATH, from outside both, alternated
(bench/README.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_infer import free_port, stop_server, tree_cpu_seconds
from request_path import start_uvicorn, write_repository


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--mebibytes", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=1, help="tritonactor serve --workers")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_repository(root / "repo")
        grpc = free_port()
        server, _ = start_uvicorn(
            root / "repo", root, args.workers, {"TRITONACTOR_GRPC_PORT": str(grpc)}
        )
        try:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
            elements = int(args.mebibytes * 1024 * 1024 / 4)
            data = np.random.default_rng(0).random((1, elements), dtype=np.float32)
            tensor = grpcclient.InferInput("INPUT0", [1, elements], "FP32")
            tensor.set_data_from_numpy(data)

            def call() -> None:
                answer = client.infer("identity_onnx", [tensor]).as_numpy("OUTPUT0")
                assert answer is not None and np.array_equal(answer, data)

            for _ in range(20):  # warm up
                call()
            before = tree_cpu_seconds(server.pid)
            start = time.perf_counter()
            for _ in range(args.requests):
                call()
            wall = time.perf_counter() - start
            after = tree_cpu_seconds(server.pid)
            if before is None or after is None:
                print("no /proc here: the server's CPU cannot be read", file=sys.stderr)
                return 1
            cpu = after - before
            print(
                f"{args.mebibytes:g} MiB in and out over gRPC: server CPU "
                f"{1e6 * cpu / args.requests:,.0f} us, wall {1e6 * wall / args.requests:,.0f} us "
                f"per request ({args.requests} requests, --workers {args.workers})"
            )
        finally:
            stop_server(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
