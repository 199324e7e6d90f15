"""A dedicated worker thread for blocking calls, owned by one actor.

`anyio.to_thread.run_sync` borrows a pooled thread per call behind a capacity limiter; an actor
that makes one blocking call per message (an instance running its backend) pays that on every
request. On asyncio a private single-thread executor does the same job for about half the cost;
on other event loops we fall back to anyio's threads with a limiter of one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import anyio
import anyio.to_thread
import sniffio

T = TypeVar("T")


class WorkerThread:
    """Runs blocking callables one at a time, off the event loop, always on the same thread."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._limiter = anyio.CapacityLimiter(1)

    async def run(self, function: Callable[..., T], *args: object) -> T:
        if sniffio.current_async_library() == "asyncio":
            loop = asyncio.get_running_loop()
            # Shielded like anyio's threads: a call that started runs to its end.
            future = loop.run_in_executor(self._executor, function, *args)
            with anyio.CancelScope(shield=True):
                return await future
        return await anyio.to_thread.run_sync(function, *args, limiter=self._limiter)

    def close(self) -> None:
        self._executor.shutdown(wait=False)
