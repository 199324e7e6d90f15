"""The ASGI app: `hypercorn tritonactor.app:app`.

`app` is built at import from the TRITONACTOR_* environment (hypercorn looks the name up in the
module's namespace): building it only reads settings, so a bad setting stops the server at once
with its message. Nothing starts until the ASGI lifespan does. Tests use `create_app(settings)`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext

from starlette.applications import Starlette

from tritonactor.control.journal import JournalLocationError
from tritonactor.engine.launch import (
    WORKERS,
    EngineFailed,
    die_with_parent,
    engine_socket,
    ensure_engine,
    usable_cpus,
)
from tritonactor.engine.listeners import shared_grpc_socket
from tritonactor.engine.remote import RemoteServer
from tritonactor.frontends.drain import Drain
from tritonactor.frontends.event_loop import choose_event_loop, log_event_loop
from tritonactor.frontends.grpc.listener import grpc_listener
from tritonactor.frontends.http.app import create_http_app
from tritonactor.frontends.http.direct import HttpApp
from tritonactor.frontends.hypercorn_command import hypercorn_config
from tritonactor.frontends.listen import ListenFailed, address_text, refuse_shared
from tritonactor.frontends.signals import held_signals
from tritonactor.frontends.tls import check_hand_started_http
from tritonactor.observability import logging as log_settings
from tritonactor.observability.endpoint import metrics_listener
from tritonactor.observability.logging import configure_logging
from tritonactor.server import Server, StartupFailed
from tritonactor.settings import Settings, SettingsError
from tritonactor.store.remote import StoreError


def create_app(settings: Settings | None = None, workers: int | None = None) -> Starlette:
    """The HTTP app of a server built from `settings` (default: the environment). The server's
    actors start and its models load in the ASGI lifespan. With front-end `workers` (default:
    as the command line says) the app is one front end of the server's engine process; with
    0, the app is the whole server."""
    server = Server(settings if settings is not None else Settings.from_env())
    if workers is None:
        workers = frontend_workers(os.environ, sys.argv)
    if workers > 0:
        return _front_end_app(server)
    drain = Drain(server.settings.exit_timeout_secs)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        configure_logging(server.settings)
        server.log_startup()
        log_event_loop()
        drain.open()
        try:
            async with (
                server.running(),
                grpc_listener(server, drain=drain),
                metrics_listener(server),
            ):
                # Every admitted request is answered before the models stop (docs/shutdown.md),
                # the signals held until then: the ASGI server may end its HTTP side first (a
                # hypercorn worker), and a signal must not end the gRPC calls still running.
                _log_http_started(server.settings)
                with held_signals(drain):
                    yield
                    await drain.wait()
        except* (StartupFailed, ListenFailed, SettingsError, StoreError, JournalLocationError):
            _exit_worker()
            raise

    return _gated(create_http_app(server, lifespan=lifespan), server, drain)


def _front_end_app(server: Server) -> Starlette:
    """One of the server's front-end processes: the engine (models, schedulers, journal, metrics)
    runs in its own process, started by the first front end to need it (engine/launch.py)."""
    front = RemoteServer(server, engine_socket(server.settings))
    drain = Drain(server.settings.exit_timeout_secs)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        configure_logging(server.settings)
        log_event_loop()
        drain.open()
        _end_with_supervisor()
        try:
            if hypercorn_bind(sys.argv) is not None:  # a plain `hypercorn --workers N`
                settings = server.settings
                refuse_shared("HTTP", settings.http_host, settings.http_port)
            front.path, found = await ensure_engine(server.settings)
            # (`found`, a connection to an engine that already ran, is held until this front
            # end has joined it: engine/launch.py)
            with found or nullcontext():
                # The gRPC socket is the engine's, bound once; every front end accepts on it.
                grpc_socket = await shared_grpc_socket(front.path)
                async with front.running(), grpc_listener(front, grpc_socket, drain=drain):  # type: ignore[arg-type]
                    if found is not None:
                        found.close()  # joined
                    _log_http_started(server.settings)
                    # This front end leaves the engine once it has answered what it admitted.
                    with held_signals(drain):
                        yield
                        await drain.wait()
            if front.engine_lost and multiprocessing.parent_process() is None:
                # The only front end, in the ASGI server's own process (`tritonactor serve
                # --workers 1`): no supervisor starts it again, so the server stops with status
                # 1, for its process manager to restart it, rather than 0 as if asked to stop.
                logging.getLogger(__name__).error(
                    "the server stops with status 1: its engine went away and no supervisor "
                    "starts its one front end again"
                )
                _exit_now(1)
        except* (EngineFailed, ListenFailed, SettingsError):
            _exit_worker()
            raise

    return _gated(create_http_app(front, lifespan=lifespan), front, drain)  # type: ignore[arg-type]


def _log_http_started(settings: Settings) -> None:
    """Triton's line as the HTTP endpoint serves (each front end writes it, as each writes
    its gRPC line): scripts wait for it. Under uvicorn (`tritonactor serve`) uvicorn's own line
    becomes it, with the port it bound (observability/logging.py `AsgiServerNotices`)."""
    if log_settings.asgi_server_logs:
        return
    address = address_text(settings.http_host, settings.http_port)
    logging.getLogger(__name__).info("Started HTTPService at %s", address)


def _gated(app: Starlette, server: Server | RemoteServer, drain: Drain) -> Starlette:
    """`app`, each HTTP request passing `drain` first."""
    assert isinstance(app, HttpApp)
    app.gate = drain.http
    if app.lane is not None:
        app.lane.drain = drain
    app.state.server = server
    app.state.drain = drain
    return app


def frontend_workers(env: Mapping[str, str], argv: Sequence[str], cores: int | None = None) -> int:
    """How many front-end processes serve this app in front of an engine process; 0 when the
    app is the whole server, in one process. What `tritonactor serve` says (`--workers`), else
    hypercorn's `--workers`/`-w` as hypercorn reads its command line: each worker is a front
    end, and one worker (its default) is one only where the process may use two `cores` or
    more (default: `usable_cpus()`), as `serve` runs one front end beside the engine on two
    cores; 0 (the app in hypercorn's own process) is the one-process server."""
    given = env.get(WORKERS, "").strip()
    if given.isdigit():
        return int(given)
    config = hypercorn_config(argv)
    workers = 0 if config is None else int(config.workers)
    if workers == 1 and (usable_cpus() if cores is None else cores) < 2:
        return 0
    return max(workers, 0)


def _exit_now(status: int) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _end_with_supervisor() -> None:
    """In a worker process of the ASGI server (`--workers N`): drain and end (SIGTERM) when
    the supervisor ends, killed outright too, rather than serve on orphaned, holding the ports
    (docs/architecture.md, "Starting and stopping")."""
    parent = multiprocessing.parent_process()
    if parent is None or sys.platform != "linux":
        return
    die_with_parent()
    if os.getppid() != parent.pid:  # it ended before the watch was set
        os.kill(os.getpid(), signal.SIGTERM)


def _exit_worker() -> None:
    """In a worker process of hypercorn (`--workers N`), end the process with status 1, so
    that hypercorn's parent stops the other workers instead of starting this one again. (With
    `--workers 0` hypercorn runs the app in its own process and exits 1 itself; with worker
    processes, hypercorn 0.18's parent exits with the status of the last worker it saw stop,
    most often 0: docs/operations.md, "Ports".)"""
    if multiprocessing.parent_process() is None:
        return
    _exit_now(1)


def hypercorn_bind(argv: Sequence[str]) -> tuple[str, int] | None:
    """The (host, port) of the first TCP `--bind` of a hypercorn command line (hypercorn's own
    default, 127.0.0.1:8000, when it gives none); None when `argv` is not hypercorn's or binds no
    TCP address. So that a plain `hypercorn tritonactor.app:app` serves gRPC and metrics where it
    serves HTTP (the app is not told where hypercorn binds)."""
    config = hypercorn_config(argv)
    if config is None:
        return None
    binds: list[str] = list(config.bind)
    for bind in binds or ["127.0.0.1:8000"]:
        if bind.startswith(("unix:", "fd://")):
            continue
        host, _, port = bind.rpartition(":")
        if not host:
            host, port = bind, "8000"
        if not port.isdigit():
            continue
        return host.removeprefix("[").removesuffix("]"), int(port)
    return None


def _bound_like_hypercorn(env: Mapping[str, str], argv: Sequence[str]) -> dict[str, str]:
    """`env`, with the HTTP address and port hypercorn binds when the environment does not say
    (`tritonactor serve` always says)."""
    bound = dict(env)
    bind = hypercorn_bind(argv)
    if bind is None:
        return bound
    if not env.get("TRITONACTOR_HTTP_HOST", "").strip():
        bound["TRITONACTOR_HTTP_HOST"] = bind[0]
    if not env.get("TRITONACTOR_HTTP_PORT", "").strip():
        # The port the server listens on makes it this server (its engine is found by it).
        bound["TRITONACTOR_HTTP_PORT"] = str(bind[1])
    return bound


def _app_from_environment() -> Starlette:
    try:
        settings = Settings.from_env(_bound_like_hypercorn(os.environ, sys.argv))
        if WORKERS not in os.environ:  # started by hand, not by `tritonactor serve`
            check_hand_started_http(settings, sys.argv)
        return create_app(settings)
    except SettingsError as error:
        print(f"tritonactor: {error}", file=sys.stderr)
        raise SystemExit(2) from None


choose_event_loop(sys.argv)
app = _app_from_environment()
