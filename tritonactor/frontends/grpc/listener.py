"""The gRPC listener, started and stopped with the ASGI app's lifespan. With a `Drain`, every
call passes it, and the listener closes only once the drain has answered every admitted call
(docs/shutdown.md)."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from grpclib.config import Configuration

from tritonactor.frontends.drain import Drain
from tritonactor.frontends.grpc.connection import GrpcServer
from tritonactor.frontends.grpc.health import HealthService
from tritonactor.frontends.grpc.service import InferenceService
from tritonactor.frontends.listen import BACKLOG, ListenFailed, address_text, listening_socket
from tritonactor.frontends.tls import describe, server_context
from tritonactor.settings import SettingsError

if TYPE_CHECKING:
    from tritonactor.server import Server

log = logging.getLogger(__name__)

# Flow-control windows sized for large tensors: grpclib's 4 MiB default makes a 256 MiB tensor
# wait on dozens of window updates.
WINDOW = 64 * 1024 * 1024


@asynccontextmanager
async def grpc_listener(
    server: Server, sock: socket.socket | None = None, drain: Drain | None = None
) -> AsyncIterator[GrpcServer | None]:
    """Serve gRPC while the block runs: on `sock` (a front end's share of the socket the engine
    bound), else on a socket bound here (frontends/listen.py). Raises ListenFailed, or
    SettingsError for TLS files that cannot be used."""
    settings = server.settings
    if not settings.grpc_enabled:
        yield None
        return
    try:
        context = server_context(settings, "grpc")
        if sock is None:
            sock = listening_socket("gRPC", settings.grpc_host, settings.grpc_port)
    except (ListenFailed, SettingsError) as error:
        log.error("%s", error)
        raise
    inference = InferenceService(server, drain)
    services = [inference, HealthService(server)]
    if drain is not None:
        services = [drain.grpc_service(service) for service in services]
    listener = GrpcServer(
        services,
        config=Configuration(http2_connection_window_size=WINDOW, http2_stream_window_size=WINDOW),
        lanes=settings.grpc_lane,
        direct=inference.direct_infer(),
    )
    # One socket, bound once: never SO_REUSEPORT, which would let another process share it.
    await listener.start(sock=sock, ssl=context, backlog=BACKLOG)
    port = sock.getsockname()[1]
    address = address_text(settings.grpc_host, port)
    log.info("Started GRPCInferenceService at %s%s", address, describe(context))
    try:
        yield listener
    finally:
        if drain is not None:
            await drain.wait()
        listener.close()
        await listener.wait_closed()
