"""How a front-end process learns that it is to stop, before its ASGI server acts on it
(docs/shutdown.md).

uvicorn and hypercorn, told to stop, close their listener and every idle keep-alive connection
at once, and cancel what still runs after their own graceful timeout (hypercorn's default: 3 s).
So while the app serves, SIGTERM and SIGINT are *held*: the signal begins the drain
(frontends/drain.py), and reaches the ASGI server's own handler only once every admitted
request has been answered (or the exit timeout has ended them). Meanwhile the connections stay
open and a new request on any of them is answered 503 with `Connection: close`.

Where the ASGI server is told otherwise (a hypercorn worker process: its parent sets a
multiprocessing event), the drain begins when that event is set, and hypercorn's graceful
timeout is raised to the exit timeout unless its command line sets one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tritonactor.frontends.drain import Drain
from tritonactor.frontends.event_loop import registered_signal_handler

log = logging.getLogger("tritonactor.drain")

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How often a hypercorn worker looks at its parent's stop event (hypercorn's own interval).
WATCH_INTERVAL_S = 0.1


@contextlib.contextmanager
def held_signals(drain: Drain) -> Iterator[None]:
    """Within: SIGTERM/SIGINT begin `drain` and are passed on to the ASGI server once the
    drain has ended. Must be entered on the running event loop, in the main thread."""
    loop = asyncio.get_running_loop()
    hold = _Hold(drain, loop)
    restore: list[Callable[[], None]] = []
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            undo = hold.intercept(sig)
            if undo is not None:
                restore.append(undo)
    watching = _watch_hypercorn_worker(drain)
    try:
        yield
    finally:
        if watching is not None:
            watching.cancel()
        for undo in reversed(restore):
            undo()


class _Hold:
    def __init__(self, drain: Drain, loop: asyncio.AbstractEventLoop) -> None:
        self.drain = drain
        self.loop = loop
        self.forwarding: asyncio.Task[None] | None = None

    def intercept(self, sig: signal.Signals) -> Callable[[], None] | None:
        """Put the hold in front of the ASGI server's handler of `sig`; returns what puts
        that handler back, or None when `sig` is ignored here."""
        loop = self.loop
        registered = registered_signal_handler(loop, sig)
        if registered is not None:
            # hypercorn, one process: a handler of its event loop (add_signal_handler).
            callback, args = registered
            loop.add_signal_handler(sig, self.received, sig, lambda: callback(*args))
            return lambda: loop.add_signal_handler(sig, callback, *args)
        previous = signal.getsignal(sig)
        if getattr(previous, "__self__", None) is loop:
            # The loop's own handler of the signal module, for a handler the loop does not show
            # (uvloop's own loop: `hypercorn -k uvloop` in one process): the ASGI server's
            # handler runs at once, whatever is held here.
            log.warning(
                "%s stops the server at once, without the drain: its handler is one the event "
                "loop does not show (uvloop's own, hypercorn's -k uvloop); without -k, the app "
                "runs on a uvloop loop that drains (docs/shutdown.md)",
                sig.name,
            )
        if previous in (signal.SIG_IGN, None):
            return None
        if callable(previous):
            # uvicorn (every worker): a handler of the signal module.
            handler = previous
            owner = getattr(handler, "__self__", None)

            def forward() -> None:
                if hasattr(owner, "should_exit"):
                    # uvicorn's Server: stop it as its handler does, without noting the
                    # signal, which uvicorn would raise again once stopped (the process would
                    # end killed by it rather than exit 0, as tritonserver does).
                    owner.should_exit = True
                else:
                    handler(sig, None)

        else:
            # The signal's default: it ends the process, once drained. In hypercorn's worker
            # process, unless its parent's event is set: hypercorn is then stopping the worker
            # itself (the parent's SIGTERM to its workers comes on top of the event).
            worker = _hypercorn_worker()
            stopping = worker["shutdown_event"] if worker is not None else None

            def forward() -> None:
                if stopping is not None and stopping.is_set():
                    return
                signal.signal(sig, signal.SIG_DFL)
                signal.raise_signal(sig)

        def on_signal(number: int, frame: object) -> None:
            loop.call_soon_threadsafe(self.received, sig, forward)

        signal.signal(sig, on_signal)
        return lambda: signal.signal(sig, previous)

    def received(self, sig: signal.Signals, forward: Callable[[], None]) -> None:
        """On the loop: the first signal begins the drain and is passed on when it ends;
        the drain's exit timeout bounds it, so later signals are not passed on."""
        if self.forwarding is not None:
            log.info("%s: already shutting down", sig.name)
            return
        log.info("%s: shutting down", sig.name)
        self.drain.begin()
        self.forwarding = self.loop.create_task(self._forward_after_drain(forward))

    async def _forward_after_drain(self, forward: Callable[[], None]) -> None:
        await self.drain.wait()
        forward()


def _hypercorn_worker() -> Any | None:
    """In a worker process hypercorn started (`--workers N`): the arguments it gave the worker
    (its config, and the event its parent sets to stop the workers); None elsewhere."""
    process = multiprocessing.current_process()
    if multiprocessing.parent_process() is None:
        return None
    arguments = getattr(process, "_kwargs", None)
    if not isinstance(arguments, dict) or "shutdown_event" not in arguments:
        return None
    config = arguments.get("config")
    if type(config).__module__ != "hypercorn.config":
        return None
    return arguments


def _watch_hypercorn_worker(drain: Drain) -> asyncio.Task[None] | None:
    arguments = _hypercorn_worker()
    if arguments is None:
        return None
    config = arguments["config"]
    if not any(a.startswith("--graceful-timeout") for a in sys.argv):
        # hypercorn's own default (3 s) would cut the drain short.
        config.graceful_timeout = max(float(config.graceful_timeout), drain.exit_timeout)
    # The lifespan's shutdown (what is left of the drain, then the models' own exit timeout)
    # within hypercorn's limit for it (60 s), whatever the exit timeout.
    config.shutdown_timeout = max(float(config.shutdown_timeout), 2 * drain.exit_timeout + 30)
    stop = arguments["shutdown_event"]
    if stop is None:
        return None

    async def watch() -> None:
        # Polled on the loop, as hypercorn polls it: a thread blocked in the event's wait()
        # holds its lock when woken, and a worker that dies then (the first to stop is killed
        # by its signal) would leave the lock held, and every other worker stuck on it.
        while not stop.is_set():
            await asyncio.sleep(WATCH_INTERVAL_S)
        drain.begin()

    return asyncio.get_running_loop().create_task(watch())
