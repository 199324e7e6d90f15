"""What one actor hop costs: `ask()` round trips through tritonactor.actors against a plain
awaited coroutine doing the same (trivial) work, on the asyncio loop the server runs on.

    python bench/actor_hop.py [--calls 10000] [--repeats 5]

Rows, each one caller awaiting one call at a time:
  coroutine     `await handle(message)`: the floor every other row is compared with
  ask 1 actor   `ref.ask(...)` to an actor that answers at once: mailbox in, reply out
  ask 2 actors  the first actor forwards to a second, which answers: the scheduler -> instance
                shape, without the thread
  to_thread     `anyio.to_thread.run_sync` of a no-op: the hop an instance makes to run its
                backend off the event loop
  data plane    the real DefaultScheduler + InstanceActor around a backend that returns a
                ready response: every hop a request makes between the router and the backend
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from tritonactor.actors import Actor, ActorRef, ActorSystem, Reply
from tritonactor.backends.base import BackendInstance, Result
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.scheduling.default import DefaultScheduler
from tritonactor.scheduling.instance import InstanceActor
from tritonactor.scheduling.messages import Infer


@dataclass(frozen=True, slots=True)
class Ping:
    value: int
    reply: Reply[int]


class Answer(Actor[Ping]):
    async def receive(self, message: Ping) -> None:
        message.reply.set(message.value)


class Forward(Actor[Ping]):
    def __init__(self, name: str, to: ActorRef[Ping]) -> None:
        super().__init__(name)
        self._to = to

    async def receive(self, message: Ping) -> None:
        self._to.tell_nowait(message)


class Echo(BackendInstance):
    def __init__(self, response: InferenceResponse) -> None:
        self._response = response

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        return [self._response] * len(requests)


async def handle(message: int) -> int:
    return message


@dataclass(frozen=True, slots=True)
class Sample:
    wall: float  # seconds per call
    cpu: float  # CPU seconds per call, every thread of the process counted


async def time_per_call(call: Callable[[int], Awaitable[Any]], calls: int) -> Sample:
    """Time per call, for `calls` calls awaited one after another."""
    for value in range(min(calls, 1000)):  # warm caches and any lazy set-up (the thread pool)
        await call(value)
    began, began_cpu = time.perf_counter(), time.process_time()
    for value in range(calls):
        await call(value)
    wall, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    return Sample(wall / calls, cpu / calls)


async def measure(calls: int, repeats: int) -> dict[str, list[Sample]]:
    results: dict[str, list[Sample]] = {}
    async with ActorSystem() as system:
        answer: ActorRef[Ping] = await system.spawn(Answer("answer"))
        second: ActorRef[Ping] = await system.spawn(Answer("second"))
        first: ActorRef[Ping] = await system.spawn(Forward("first", second))
        scheduler = DefaultScheduler("bench")
        scheduler_ref = await system.spawn(scheduler)
        await scheduler.spawn(
            InstanceActor("bench_0", Echo(InferenceResponse("bench", "1")), scheduler_ref)
        )
        request = InferenceRequest("bench")

        def noop() -> None:
            return None

        variants: dict[str, Callable[[int], Awaitable[Any]]] = {
            "coroutine": handle,
            "ask 1 actor": lambda v: answer.ask(lambda reply: Ping(v, reply)),
            "ask 2 actors": lambda v: first.ask(lambda reply: Ping(v, reply)),
            "to_thread": lambda v: anyio.to_thread.run_sync(noop),
            "data plane": lambda v: scheduler_ref.ask(lambda reply: Infer(request, reply)),
        }
        # Interleave the variants, so a slow spell of the machine hits them all alike.
        for _ in range(repeats):
            for name, call in variants.items():
                results.setdefault(name, []).append(await time_per_call(call, calls))
        # Let the instance tell the scheduler it is idle again before the system stops them;
        # otherwise that last message meets a closed mailbox and the instance reports a failure.
        await anyio.sleep(0.05)
    return results


def report(results: dict[str, list[Sample]], calls: int, repeats: int) -> str:
    floor = statistics.median(s.wall for s in results["coroutine"])
    lines = [
        f"{calls} sequential calls x {repeats} repeats, median per call "
        f"(asyncio, Python {sys.version.split()[0]})",
        "",
        "| path | µs per call | overhead vs coroutine, µs | ratio to coroutine | CPU µs per call |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, samples in results.items():
        wall = statistics.median(s.wall for s in samples)
        cpu = statistics.median(s.cpu for s in samples)
        overhead = "-" if name == "coroutine" else f"{(wall - floor) * 1e6:.1f}"
        cells = [name, f"{wall * 1e6:.2f}", overhead, f"{wall / floor:,.0f}x", f"{cpu * 1e6:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("CPU counts every thread of this process (the loop and anyio's worker threads).")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    results = anyio.run(measure, args.calls, args.repeats, backend="asyncio")
    print(report(results, args.calls, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
