"""What reading a gRPC message costs a lane stream: grpclib's `Buffer` against `LaneBuffer`
(tritonactor/frontends/grpc/lane_buffer.py), on uvloop as the front ends run.

    python bench/lane_buffer.py [--messages 100000] [--repeats 3]

Rows, µs a message of 100 bytes read as gRPC reads one (its 5-byte prefix, then its body):
  queued   the message is in the buffer before the reads
  waiting  the reads wait for it (added by the loop's next turn, as the lane adds a frame)
  made     making a buffer (one per call)
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import uvloop
from grpclib.protocol import Buffer

from tritonactor.frontends.grpc.lane_buffer import LaneBuffer

MESSAGE = b"\0" + (100).to_bytes(4, "big") + b"x" * 100


async def queued(kind: Any, count: int) -> float:
    buffer = kind(lambda size: None)
    start = time.perf_counter()
    for _ in range(count):
        buffer.add(MESSAGE, len(MESSAGE))
        await buffer.read(5)
        await buffer.read(100)
    return (time.perf_counter() - start) / count * 1e6


async def waiting(kind: Any, count: int) -> float:
    buffer = kind(lambda size: None)
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    for _ in range(count):
        loop.call_soon(buffer.add, MESSAGE, len(MESSAGE))
        await buffer.read(5)
        await buffer.read(100)
    return (time.perf_counter() - start) / count * 1e6


async def made(kind: Any, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        kind(print)
    return (time.perf_counter() - start) / count * 1e6


async def main(messages: int, repeats: int) -> None:
    print(f"{'row':8} {'grpclib Buffer':>15} {'LaneBuffer':>11}  (µs, best of {repeats})")
    for row in (queued, waiting, made):
        best = [
            min([await row(kind, messages) for _ in range(repeats)])
            for kind in (Buffer, LaneBuffer)
        ]
        print(f"{row.__name__:8} {best[0]:15.2f} {best[1]:11.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    uvloop.run(main(args.messages, args.repeats))
