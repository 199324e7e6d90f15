"""The event loop a front end serves on, and the signal handlers the ASGI server registered on
it (which the drain holds back: frontends/signals.py).

hypercorn's worker imports the app, then makes its event loop. Where its command line leaves
the worker class to hypercorn's default, asyncio's loop, the app has that loop made by uvloop
(`choose_event_loop`), as `hypercorn -k uvloop` would, and as `tritonactor serve`'s front ends
(uvicorn's `--loop uvloop`) and engine run: a front end's own work costs less there
(docs/benchmarks.md). A class named (`-k asyncio`), or a config file, is hypercorn's to follow.

The loop the app chooses is uvloop's, keeping what `add_signal_handler` registered where the
drain reads it: asyncio's own loop keeps it (`_signal_handlers`), uvloop's keeps it out of
Python's reach."""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from tritonactor.frontends.hypercorn_command import leaves_worker_class

log = logging.getLogger(__name__)

SignalHandler = tuple[Callable[..., Any], tuple[Any, ...]]

try:
    import uvloop
except ImportError:  # (a dependency through uvicorn[standard], where uvloop builds)
    uvloop = None  # type: ignore[assignment]


def choose_event_loop(argv: Sequence[str]) -> bool:
    """Where `argv` is a hypercorn command line that leaves the worker class to hypercorn's
    default, have the process's next event loop made by uvloop (a `SignalsKept` loop), through
    an event-loop policy, which hypercorn's worker asks for its loop. True when it was."""
    if uvloop is None or not leaves_worker_class(argv):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (event-loop policies, Python 3.14)
        # (Both gone in Python 3.16, where hypercorn's loop cannot be chosen this way.)
        if not hasattr(asyncio, "set_event_loop_policy") or not hasattr(uvloop, "EventLoopPolicy"):
            return False

        class Policy(uvloop.EventLoopPolicy):  # type: ignore[misc,name-defined]
            def _loop_factory(self) -> SignalsKept:
                return SignalsKept()

        asyncio.set_event_loop_policy(Policy())
    return True


def registered_signal_handler(loop: asyncio.AbstractEventLoop, sig: int) -> SignalHandler | None:
    """The callback and arguments `loop.add_signal_handler` registered for `sig`, or None when
    it registered none or the loop does not say (a uvloop loop the app did not make)."""
    kept = getattr(loop, "kept_signal_handlers", None)
    if isinstance(kept, dict):
        return kept.get(int(sig))
    handlers = getattr(loop, "_signal_handlers", None)  # asyncio's own loop
    handle = handlers.get(sig) if isinstance(handlers, dict) else None
    if handle is None:
        return None
    return handle._callback, handle._args


def log_event_loop() -> None:
    """Say which event loop this process serves on (once, as its lifespan starts): the
    library's class (uvloop's `Loop` for a `SignalsKept`)."""
    loop = next(
        kind
        for kind in type(asyncio.get_running_loop()).__mro__
        if not kind.__module__.startswith("tritonactor.")
    )
    log.info(
        "process %d serves on the event loop %s.%s", os.getpid(), loop.__module__, loop.__qualname__
    )


if uvloop is not None:

    class SignalsKept(uvloop.Loop):  # type: ignore[misc,name-defined]
        """uvloop's loop, keeping what `add_signal_handler` registered readable."""

        def __init__(self) -> None:
            super().__init__()
            self.kept_signal_handlers: dict[int, SignalHandler] = {}

        def add_signal_handler(self, sig: int, callback: Callable[..., Any], *args: Any) -> None:
            super().add_signal_handler(sig, callback, *args)
            # (By number: a real-time signal has no `signal.Signals` member.)
            self.kept_signal_handlers[int(sig)] = (callback, args)

        def remove_signal_handler(self, sig: int) -> bool:
            removed = bool(super().remove_signal_handler(sig))
            if removed:  # (uvloop removes none while it does not listen for signals)
                self.kept_signal_handlers.pop(int(sig), None)
            return removed
