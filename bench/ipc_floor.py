"""The floor under the python backend's round trip: two Python processes exchanging one small
pickled message each way over a Unix socket, and nothing else.

    python bench/ipc_floor.py [--seconds 3] [--rounds 3] [--loop asyncio|uvloop]

The server's side does what `PythonInstance.execute` does around the model, less the model's
own work: on an event loop, it pickles a message the size of an execute message ([1,16] FP32,
batch 1: ~300 bytes), writes it, and awaits the answer, which the loop reads when the socket is
readable (`loop.add_reader`, as `backends/python/reader.py`). The child does what the stub does
less the model: a blocking read, an unpickle, a pickled answer of the same size written back.
No tensors, no shared memory, no actors.

It prints, per round trip, the wall time and the CPU of each side (this process's and the
child's, from /proc), the same figures `bench/python_backend.py --no-http` prints for the real
instance ("server / stub / round trip CPU"): what is left between the two is the python
backend's own code; what is here is what any two Python processes pay on this machine to wake
each other (the system calls, the scheduler's wake-ups, the event loop's turn).

A second line runs the same exchange with the server blocking on its socket in a thread
(no event loop): what the loop's turn itself costs.

`--server-work-us` and `--child-work-us` add that much busy work (a spin on the clock) to each
side's turn, in the place the instance's and the stub's own code runs: on this machine a µs of
work costs each side more than a µs of CPU, since the other side sleeps longer and waking it
costs more (docs/benchmarks.md, "The floor under the python round trip").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

HEADER = struct.Struct("<Q")

# What the child runs: read a length-prefixed pickle, answer one (after spinning for
# argv[2] ns), until the socket closes.
CHILD = r"""
import os, pickle, socket, struct, sys, time
HEADER = struct.Struct("<Q")
sock = socket.socket(fileno=int(sys.argv[1]))
work_ns = int(sys.argv[2])
buffer = bytearray()
scratch = memoryview(bytearray(1 << 16))
while True:
    size = sock.recv_into(scratch)
    if not size:
        break
    buffer += scratch[:size]
    while len(buffer) >= 8:
        end = 8 + HEADER.unpack_from(buffer)[0]
        if len(buffer) < end:
            break
        message = pickle.loads(buffer[8:end])
        del buffer[:end]
        until = time.perf_counter_ns() + work_ns
        while time.perf_counter_ns() < until:
            pass
        reply = dict(message, op="result", responses=[{"outputs": 1, "error": None}])
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        sock.sendall(HEADER.pack(len(data)) + data)
"""

# An execute message of the size `PythonInstance.execute` sends for one [1,16] FP32 request.
MESSAGE = {
    "op": "execute",
    "seq": 0,
    "shm": "@tritonactor-py-1234-0123abcd-p-0",
    "descriptors": [("INPUT0", "FP32", (1, 16), 0, 64)],
    "requests": [
        {
            "key": 0,
            "model_name": "identity_fp32",
            "model_version": 1,
            "id": "",
            "correlation_id": 0,
            "flags": 0,
            "parameters": {},
            "inputs": 1,
            "outputs": ["OUTPUT0"],
            "trace": None,
        }
    ],
}


def process_cpu(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spin(ns: int) -> None:
    """Busy work for `ns` nanoseconds (none for 0)."""
    until = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < until:
        pass


def start_child(work_ns: int) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(theirs.fileno()), str(work_ns)],
        pass_fds=(theirs.fileno(),),
    )
    theirs.close()
    return ours, child


class Reader:
    """The server's side of the socket: the loop reads it when readable, as the instance's
    reader does, and wakes whoever awaits the answer."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.scratch = memoryview(bytearray(1 << 16))
        self.waiting: asyncio.Future[dict] | None = None
        loop.add_reader(sock.fileno(), self.readable)

    def readable(self) -> None:
        try:
            size = self.sock.recv_into(self.scratch, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        self.buffer += self.scratch[:size]
        while len(self.buffer) >= 8:
            end = 8 + HEADER.unpack_from(self.buffer)[0]
            if len(self.buffer) < end:
                break
            message = pickle.loads(self.buffer[8:end])
            del self.buffer[:end]
            if self.waiting is not None and not self.waiting.done():
                self.waiting.set_result(message)


def send(sock: socket.socket, message: dict) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(HEADER.pack(len(data)) + data)


async def on_loop(seconds: float, work_ns: int, child_ns: int) -> tuple[int, float, float, float]:
    loop = asyncio.get_running_loop()
    sock, child = start_child(child_ns)
    # The socket stays blocking: sendall as Channel.send does; the reader reads MSG_DONTWAIT.
    reader = Reader(sock, loop)

    async def call(seq: int) -> None:
        reader.waiting = loop.create_future()
        spin(work_ns)
        send(sock, dict(MESSAGE, seq=seq))
        await reader.waiting

    try:
        for seq in range(2000):  # warm up
            await call(seq)
        calls = 0
        cpu, child_cpu = time.process_time(), process_cpu(child.pid)
        began = time.perf_counter()
        deadline = began + seconds
        while time.perf_counter() < deadline:
            await call(calls)
            calls += 1
        wall = time.perf_counter() - began
        cpu, child_cpu = time.process_time() - cpu, process_cpu(child.pid) - child_cpu
    finally:
        loop.remove_reader(sock.fileno())
        sock.close()
        child.wait(5)
    return calls, wall, cpu, child_cpu


def blocking(seconds: float, work_ns: int, child_ns: int) -> tuple[int, float, float, float]:
    sock, child = start_child(child_ns)
    scratch = memoryview(bytearray(1 << 16))
    buffer = bytearray()

    def call(seq: int) -> None:
        spin(work_ns)
        send(sock, dict(MESSAGE, seq=seq))
        while True:
            buffer.extend(scratch[: sock.recv_into(scratch)])
            if len(buffer) >= 8 and len(buffer) >= 8 + HEADER.unpack_from(buffer)[0]:
                end = 8 + HEADER.unpack_from(buffer)[0]
                pickle.loads(buffer[8:end])
                del buffer[:end]
                return

    try:
        for seq in range(2000):
            call(seq)
        calls = 0
        cpu, child_cpu = time.process_time(), process_cpu(child.pid)
        began = time.perf_counter()
        deadline = began + seconds
        while time.perf_counter() < deadline:
            call(calls)
            calls += 1
        wall = time.perf_counter() - began
        cpu, child_cpu = time.process_time() - cpu, process_cpu(child.pid) - child_cpu
    finally:
        sock.close()
        child.wait(5)
    return calls, wall, cpu, child_cpu


def line(name: str, result: tuple[int, float, float, float]) -> str:
    calls, wall, cpu, child_cpu = result
    per = 1e6 / calls
    return (
        f"{name:<28} {calls:>8,} calls  wall {wall * per:6.1f} µs  server {cpu * per:6.1f} µs  "
        f"child {child_cpu * per:6.1f} µs  round trip CPU {(cpu + child_cpu) * per:6.1f} µs"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--server-work-us", type=float, default=0.0)
    parser.add_argument("--child-work-us", type=float, default=0.0)
    options = parser.parse_args(argv)
    work = (options.seconds, int(options.server_work_us * 1000), int(options.child_work_us * 1000))
    if options.loop == "uvloop":
        import uvloop

        run = uvloop.run
    else:
        run = asyncio.run
    print(
        f"# {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, python "
        f"{sys.version.split()[0]}; busy work a turn: server {options.server_work_us} µs, "
        f"child {options.child_work_us} µs"
    )
    for round_ in range(1, options.rounds + 1):
        print(line(f"round {round_}: {options.loop} loop", run(on_loop(*work))))
        print(line(f"round {round_}: blocking thread", blocking(*work)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
