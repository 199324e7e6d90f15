"""The floor under a large request: what moving a 1 MiB tensor in and out over binary HTTP
costs a server process that does nothing else, beside what `tritonactor serve` costs for the
same request (bench/request_path.py's `big_onnx`).

    python bench/large_floor.py [--requests 2000] [--rounds 2] [--elements 262144]

Each server is measured as request_path.py measures serve: one keep-alive connection from
this process's `http.client`, the same request back to back, the server's process tree's CPU
(utime + stime from /proc) over N requests, divided by N. The servers, alternated by round:

- `raw`: a uvloop protocol that reads a request's head, counts its body's bytes as they come
  (no parser, no copy of its own) and answers with the bytes serve answered, the head and
  JSON header in one write and the tensor in another, as serve writes them: what the loopback
  socket and the event loop cost for 1 MiB each way, in Python.
- `uvicorn`: uvicorn as `tritonactor serve` runs it (httptools, uvloop, its protocol reading a
  body whole) with an ASGI app that takes the body and answers the same bytes in the same two
  body messages as serve's app: the ASGI server's floor.
- `serve`: `tritonactor serve --workers 1` (one front end and the engine) on request_path.py's
  ONNX identity, each process's share beside.

Both floors keep freed memory for the next request as serve's processes do (core/heap.py),
and every answer of theirs is the bytes serve answered (checked once a round). `--elements
16` measures a small request the same way. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_infer import free_port, stop_server, tree_cpu_seconds
from process_cpu import cpu_by_role
from request_path import Call, binary_infer, start_uvicorn, write_repository

from tritonactor.core.heap import keep_freed_memory

BIG = 1 << 18  # FP32 elements: 1 MiB


# -- the floors' servers (run as `--serve raw|uvicorn`) -----------------------------------------


def _answer_parts(answer: Path) -> tuple[list[tuple[bytes, bytes]], bytes, bytes]:
    """The headers, JSON header and tensor of the answer serve gave (as `_fetch` saved it)."""
    lines = answer.read_bytes().split(b"\n", 2)
    headers = [tuple(pair.split(b": ", 1)) for pair in lines[0].split(b"\t") if pair]
    header_length = int(lines[1])
    body = lines[2]
    return headers, body[:header_length], body[header_length:]  # type: ignore[return-value]


class RawProtocol(asyncio.Protocol):
    """Reads each request's head and counts its body; answers with the fixed bytes."""

    def __init__(self, head: bytes, tensor: bytes) -> None:
        self.head = head
        self.tensor = tensor
        self.pending = b""
        self.remaining = -1  # body bytes still to come; -1: reading a head

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        while data:
            if self.remaining < 0:
                data = self.pending + data
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    self.pending = data
                    return
                self.pending = b""
                head = data[:end].lower()
                length = head[head.index(b"content-length:") + 15 :].split(b"\r\n", 1)[0]
                self.remaining = int(length)
                data = data[end + 4 :]
            taken = min(len(data), self.remaining)
            self.remaining -= taken
            data = data[taken:] if taken < len(data) else b""
            if self.remaining == 0:
                self.remaining = -1
                self.transport.write(self.head)
                self.transport.write(self.tensor)


def serve_raw(port: int, answer: Path) -> None:
    import uvloop

    keep_freed_memory()

    headers, json_header, tensor = _answer_parts(answer)
    lines = [b"HTTP/1.1 200 OK"] + [name + b": " + value for name, value in headers]
    head = b"\r\n".join(lines) + b"\r\n\r\n" + json_header

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: RawProtocol(head, tensor), "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


def serve_uvicorn(port: int, answer: Path) -> None:
    import uvicorn

    from tritonactor.frontends.http.uvicorn_protocol import HttpToolsWholeBody

    keep_freed_memory()

    headers, json_header, tensor = _answer_parts(answer)
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(name.lower(), value) for name, value in headers if name.lower() != b"date"],
    }

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while True:
            message = await receive()
            if not message.get("more_body", False):
                break
        await send(start)
        await send({"type": "http.response.body", "body": json_header, "more_body": True})
        await send({"type": "http.response.body", "body": tensor})

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http=HttpToolsWholeBody,
        loop="uvloop",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run()


# -- the measurement ----------------------------------------------------------------------------


def send(
    connection: http.client.HTTPConnection, call: Call
) -> tuple[http.client.HTTPResponse, bytes]:
    connection.request(call.method, call.path, body=call.body, headers=call.headers)
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {body[:300]!r}")
    return response, body


def _fetch(url: str, call: Call, answer: Path) -> bytes:
    """serve's answer to `call`, saved for the floors: its headers (but the date and the
    server's name), the JSON header's length and the body."""
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    response, body = send(connection, call)
    connection.close()
    kept = [
        f"{name}: {value}".encode()
        for name, value in response.getheaders()
        if name.lower() not in ("date", "server")
    ]
    header_length = int(response.getheader("inference-header-content-length", "0"))
    answer.write_bytes(b"\t".join(kept) + b"\n" + str(header_length).encode() + b"\n" + body)
    return body


def start_floor(kind: str, answer: Path, workdir: Path) -> tuple[Any, str]:
    import subprocess

    port = free_port()
    command = [sys.executable, __file__, "--serve", kind, "--port", str(port)]
    command += ["--answer", str(answer)]
    log = (workdir / f"{kind}.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the {kind} server exited with {process.returncode}")
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            return process, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    stop_server(process)
    sys.exit(f"the {kind} server did not start")


def measure(url: str, pid: int, call: Call, expected: bytes, requests: int) -> tuple[float, str]:
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    for _ in range(min(200, requests)):
        _, body = send(connection, call)
    if body != expected:
        raise RuntimeError(f"{url} answered {len(body)} bytes, not serve's {len(expected)}")
    roles = cpu_by_role(pid)
    before = tree_cpu_seconds(pid)
    for _ in range(requests):
        send(connection, call)
    after = tree_cpu_seconds(pid)
    now = cpu_by_role(pid)
    connection.close()
    assert before is not None and after is not None
    split = ", ".join(f"{role} {(now[role] - roles[role]) / requests * 1e6:.0f}" for role in now)
    return (after - before) / requests * 1e6, split


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--elements", type=int, default=BIG, help="FP32 elements each way")
    parser.add_argument("--serve", choices=("raw", "uvicorn"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--answer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve == "raw":
        serve_raw(args.port, args.answer)
        return 0
    if args.serve == "uvicorn":
        serve_uvicorn(args.port, args.answer)
        return 0
    call = binary_infer("identity_onnx", args.elements)
    print(f"-- {len(call.body):,} bytes in, one request at a time, server CPU µs a request")
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        repository = workdir / "models"
        write_repository(repository)
        answer = workdir / "answer"
        order = ["serve", "raw", "uvicorn"]
        for number in range(args.rounds):
            for kind in order if number % 2 == 0 else order[::-1]:
                if kind == "serve":
                    process, url = start_uvicorn(repository, workdir, workers=1)
                else:
                    process, url = start_floor(kind, answer, workdir)
                try:
                    if kind == "serve":
                        expected = _fetch(url, call, answer)
                    cpu, split = measure(url, process.pid, call, expected, args.requests)
                finally:
                    stop_server(process)
                print(f"round {number + 1} {kind:8s} {cpu:8.0f}   ({split})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
