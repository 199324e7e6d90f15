"""Calling into the event loop from other threads: a backend's, a model process's reader, a
model's own. The actors' state belongs to the loop, so what such a thread has to say (an answer,
a response, a wake-up) is handed to the loop, never run where it happens."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import anyio.from_thread
import anyio.lowlevel
import sniffio


def on_loop(function: Callable[..., None]) -> Callable[..., None]:
    """`function`, made callable from any thread: it runs on the event loop that called
    `on_loop` (at once when called on that loop's thread). From another thread the call is
    scheduled without waiting for it on asyncio (the generic anyio path waits: ~100 us more). A
    loop that is gone drops the call: nobody is left to hear it."""
    loop_thread = threading.get_ident()
    if sniffio.current_async_library() == "asyncio":
        loop = asyncio.get_running_loop()

        def call(*args: Any) -> None:
            if threading.get_ident() == loop_thread:
                function(*args)
            else:
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    loop.call_soon_threadsafe(function, *args)

        return call
    token = anyio.lowlevel.current_token()

    def call_generic(*args: Any) -> None:
        if threading.get_ident() == loop_thread:
            function(*args)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                anyio.from_thread.run_sync(function, *args, token=token)

    return call_generic
