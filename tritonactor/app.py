"""The ASGI app: `hypercorn tritonactor.app:app`.

`app` is built at import from the TRITONACTOR_* environment (hypercorn looks the name up in the
module's namespace): building it only reads settings, so a bad setting stops the server at once
with its message. Nothing starts until the ASGI lifespan does. Tests use `create_app(settings)`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette

from tritonactor.frontends.grpc.listener import grpc_listener
from tritonactor.frontends.http.app import create_http_app
from tritonactor.observability.endpoint import metrics_listener
from tritonactor.observability.logging import configure_logging
from tritonactor.server import Server, StartupFailed
from tritonactor.settings import Settings, SettingsError


def create_app(settings: Settings | None = None) -> Starlette:
    """The HTTP app of a server built from `settings` (default: the environment). The server's
    actors start and its models load in the ASGI lifespan."""
    server = Server(settings if settings is not None else Settings.from_env())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        configure_logging(server.settings)
        server.log_startup()
        try:
            async with server.running(), grpc_listener(server), metrics_listener(server):
                yield
        except* StartupFailed:
            _exit_worker()
            raise

    app = create_http_app(server, lifespan=lifespan)
    app.state.server = server
    return app


def _exit_worker() -> None:
    """In a worker process of hypercorn (`--workers N`), end the process with status 1, so
    that hypercorn's parent stops the other workers instead of starting this one again. (With
    one worker hypercorn runs the app in its own process and exits 1 itself; with several,
    hypercorn 0.18's parent exits with the status of the last worker it stopped, 0.)"""
    if multiprocessing.parent_process() is None:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _app_from_environment() -> Starlette:
    try:
        return create_app()
    except SettingsError as error:
        print(f"tritonactor: {error}", file=sys.stderr)
        raise SystemExit(2) from None


app = _app_from_environment()
