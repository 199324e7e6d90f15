"""The engine process: `python -m tritonactor.engine`, started by `tritonactor serve` before its
front ends, or by the first front end of a plain `hypercorn --workers N` (engine/launch.py). It
reads the same TRITONACTOR_* settings, runs the server's actors, models, journal and metrics
listener, serves its front ends on a Unix socket, and stops once every front end has gone (or
on SIGTERM/SIGINT)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import anyio

from tritonactor.control.journal import JournalLocationError
from tritonactor.engine.calls import EngineServer
from tritonactor.engine.host import EngineHost, ObservedRouter, table
from tritonactor.engine.launch import SOCKET, STARTER_FD, engine_socket, tell_ready
from tritonactor.engine.listeners import handing_out
from tritonactor.frontends.listen import ListenFailed
from tritonactor.observability.endpoint import metrics_listener
from tritonactor.observability.logging import configure_logging
from tritonactor.server import Server, StartupFailed
from tritonactor.settings import Settings, SettingsError
from tritonactor.store.remote import StoreError

log = logging.getLogger("tritonactor.engine")
# How long past the exit timeout the engine waits for its front ends, which fail their own
# requests at the exit timeout, to answer them and leave.
LEAVE_GRACE = 10.0


async def serve(server: Server, path: str, starter: int | None = None) -> None:
    """`starter`: the process that started the engine (`_stop_if_abandoned`; while the models
    of the start load, `_abandoned_while_starting`)."""
    ready = anyio.Event()
    async with anyio.create_task_group() as starting:
        if starter is not None:
            starting.start_soon(_abandoned_while_starting, starter, ready, starting.cancel_scope)
        await _serve(server, path, starter, ready)
        starting.cancel_scope.cancel()


async def _abandoned_while_starting(
    starter: int, ready: anyio.Event, scope: anyio.CancelScope
) -> None:
    """Stop the engine when the process that started it ends before the start's models have
    loaded (a model whose `initialize` never returns held an engine that nothing stopped: its
    starter killed, it waited for ever, holding the server's ports)."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    # A descriptor of its own: `_stop_if_abandoned` watches `starter` once the engine serves,
    # and a loop has one reader per descriptor (removing this one took that one away).
    watched = os.dup(starter)
    try:
        loop.add_reader(watched, lambda: ended.done() or ended.set_result(None))
    except OSError:
        os.close(watched)
        return  # (`_stop_if_abandoned` says so once the engine serves)
    try:
        async with anyio.create_task_group() as either:

            async def until_ready() -> None:
                await ready.wait()
                either.cancel_scope.cancel()

            either.start_soon(until_ready)
            await ended
            log.warning(
                "the process that started the engine ended while the models loaded: the "
                "engine stops"
            )
            scope.cancel()
            either.cancel_scope.cancel()
    finally:
        loop.remove_reader(watched)
        os.close(watched)


async def _serve(server: Server, path: str, starter: int | None, ready: anyio.Event) -> None:
    engine = EngineServer(server)
    host = EngineHost(engine, path)
    engine.broadcast = host.broadcast
    engine.ask_all = host.ask_all
    router = server.router
    assert isinstance(router, ObservedRouter)
    router.changed = lambda: host.broadcast(table(router))
    server.log_startup()
    # Closed in the reverse order: the metrics port first, then the engine's socket (no new
    # front end), then the models (their `finalize` runs), then the front ends' connections:
    # the last front end to leave waits for that, so that the server's process ends after its
    # models. The gRPC socket is closed once the front ends have left, before all that.
    # The gRPC socket the front ends share is bound first: a taken address fails the start
    # before any model loads (engine/listeners.py).
    async with (
        handing_out(server.settings, path) as listeners,
        host.connected(),
        server.running(),
        host.serving(),
        metrics_listener(server),
    ):
        log.info("engine serving its front ends on %s", path)
        if server.tracing is not None:
            host.continue_trace = server.tracing.continued
        listeners.listen()  # the models have loaded: gRPC takes connections
        ready.set()
        tell_ready("ready")
        try:
            async with anyio.create_task_group() as tasks:

                async def stop_on_signal() -> None:
                    # The engine shares its process group with the front ends: a Ctrl-C or a
                    # process manager's SIGTERM reaches them all. The front ends then drain: each
                    # answers what it admitted (its requests still run here), failing what is left
                    # at the exit timeout, and leaves (docs/shutdown.md). The engine waits for that
                    # rather than failing their last requests; LEAVE_GRACE past the exit timeout
                    # bounds the wait should a front end never leave.
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for _ in signals:
                            log.info("shutting down once the front ends have left")
                            listeners.close()  # new gRPC connections are refused, not queued
                            if host.connections:
                                patience = server.settings.exit_timeout_secs + LEAVE_GRACE
                                with anyio.move_on_after(patience):
                                    await host.deserted.wait()
                            tasks.cancel_scope.cancel()
                            return

                tasks.start_soon(stop_on_signal)
                tasks.start_soon(_stop_if_abandoned, host, starter, tasks.cancel_scope)
                await host.deserted.wait()
                tasks.cancel_scope.cancel()
        finally:
            # Before the last front end is let go (its connection closes as `host.connected()`
            # ends), however this ends: once the server's process has exited, no port of it
            # still accepts, even while models stuck in a request take their time to stop.
            listeners.close()
    log.info("engine stopped")


async def _stop_if_abandoned(
    host: EngineHost, starter: int | None, scope: anyio.CancelScope
) -> None:
    """Stop the engine when the process that started it (`starter`: a pidfd of it, which its
    starter handed over) ends before any front end joined and none is connected. A plain
    hypercorn's worker starts the engine without tying it to itself (the other workers share
    it); a worker killed, or failing, between starting the engine and joining it would
    otherwise leave an engine that nothing stops, holding the server's ports."""
    if starter is None:
        return
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    try:
        loop.add_reader(starter, lambda: ended.done() or ended.set_result(None))
    except OSError as error:
        log.warning("the engine cannot watch the process that started it: %s", error)
        os.close(starter)
        return
    try:
        await ended
    finally:
        loop.remove_reader(starter)
        os.close(starter)
    if host.open and not host.joined:  # one connected may still join
        log.info(
            "the process that started the engine has ended; the engine stops unless one of "
            "the %d connected joins it",
            len(host.open),
        )
    while host.open and not host.joined:
        host.settled.clear()
        await host.settled.wait()
    if host.joined:
        # Its front ends stop it when the last of them leaves.
        if host.connections:
            log.info(
                "the process that started the engine has ended; "
                "the front ends that joined it keep it"
            )
        return
    log.warning(
        "the process that started the engine has ended and no front end joined: the engine stops"
    )
    scope.cancel()


def main() -> int:
    try:
        settings = Settings.from_env()
    except SettingsError as error:
        tell_ready(f"failed: {error}")
        print(f"tritonactor engine: {error}", file=sys.stderr)
        return 2
    configure_logging(settings)
    server = Server(settings, router_class=ObservedRouter)
    path = os.environ.get(SOCKET) or engine_socket(settings)
    # Only an engine a front end started (not one run by hand) watches its starter.
    handed = os.environ.pop(STARTER_FD, "")
    starter = int(handed) if handed.isdigit() else None
    failed: list[BaseException] = []
    try:
        anyio.run(serve, server, path, starter, backend_options=_backend_options())
    except* (StartupFailed, ListenFailed, StoreError, JournalLocationError) as group:
        failed.extend(_leaves(group))
    if failed:
        tell_ready(f"failed: {failed[0]}")
        return 1
    return 0


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, through the groups nested in it (a task
    group's failure inside another's), each told as itself."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _backend_options() -> dict[str, object]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


if __name__ == "__main__":
    sys.exit(main())
