"""The one way work too large for the event loop leaves it: `off_loop(work, size)` runs
`work()` on a worker thread when its `size` reaches OFF_LOOP_BYTES, in place otherwise (a
thread hop costs more than small work).

`size` is in bytes copied or encoded. Work that steps through elements in Python (ranking a
score, encoding or decoding a BYTES element) counts ELEMENT_BYTES a step: such a step costs
about what copying that many bytes does not, but it is the scale that keeps a million steps
(most of a second) off the loop and a few thousand on it.

Used by shared-memory output writes (memory/lease.py, and engine/host.py for a front end's
request), classification rankings
(frontends/classification.py), the response cache's keys, copies and hits
(scheduling/caching.py) and a BLS call's answer to its model (backends/python/calls.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import anyio
import anyio.to_thread
import numpy as np
import sniffio

from tritonactor.core.types import Tensor

T = TypeVar("T")

# Work of at least this many bytes runs on a worker thread. A copy of 1 MiB costs the loop
# 60-120 µs in a serving process, of 1 GiB most of a second; the hop to a worker thread and
# back costs the process about as much or more (a 1 MiB shared-memory output written on the
# engine's loop: 5-12 % less CPU a request, docs/benchmarks.md), so work stays on the loop up
# to twice that.
OFF_LOOP_BYTES = 2 << 20
# What one Python-level step over an element counts for (see the module's docstring): 16,384
# steps reach OFF_LOOP_BYTES.
ELEMENT_BYTES = 128


def tensors_work(tensors: Iterable[Tensor]) -> int:
    """What copying or encoding `tensors` costs at least, in these bytes, worked out without
    looking at any element (a BYTES element counts ELEMENT_BYTES)."""
    work = 0
    for tensor in tensors:
        data = tensor.data
        if isinstance(data, np.ndarray):
            steps = tensor.datatype == "BYTES" or data.dtype.hasobject
            work += data.size * ELEMENT_BYTES if steps else data.nbytes
    return work


def large(size: int) -> bool:
    """Whether work of `size` bytes leaves the event loop."""
    return size >= OFF_LOOP_BYTES


async def off_loop(work: Callable[[], T], size: int) -> T:
    """`work()`, on a worker thread when `size` is large, on the event loop otherwise."""
    if not large(size):
        return work()
    if sniffio.current_async_library() != "asyncio":
        return await anyio.to_thread.run_sync(work)
    # A pool of our own: about half the CPU of anyio's threads per hop. As with anyio's
    # threads, work that started runs to its end before the caller sees a cancellation.
    future = asyncio.get_running_loop().run_in_executor(_pool(), work)
    with anyio.CancelScope(shield=True):
        return await future


def start(work: Callable[[], T]) -> asyncio.Future[T]:
    """`work()` on a worker thread of the same pool, as a future of the running loop: for
    code that cannot await (a done-callback) and answers once the work is over."""
    return asyncio.get_running_loop().run_in_executor(_pool(), work)


_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(
            max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="offload"
        )
    return _executor
