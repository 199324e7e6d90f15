"""The gRPC listener, started and stopped with the ASGI app's lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from grpclib.config import Configuration
from grpclib.server import Server as GrpcServer

from tritonactor.frontends.grpc.service import HealthService, InferenceService

if TYPE_CHECKING:
    from tritonactor.server import Server

log = logging.getLogger(__name__)

# Flow-control windows sized for large tensors: grpclib's 4 MiB default makes a 256 MiB tensor
# wait on dozens of window updates.
WINDOW = 64 * 1024 * 1024


@asynccontextmanager
async def grpc_listener(server: Server) -> AsyncIterator[GrpcServer | None]:
    settings = server.settings
    if not settings.grpc_enabled:
        yield None
        return
    listener = GrpcServer(
        [InferenceService(server), HealthService(server)],
        config=Configuration(http2_connection_window_size=WINDOW, http2_stream_window_size=WINDOW),
    )
    # reuse_port: every hypercorn worker binds the same port, and the kernel spreads connections.
    await listener.start(settings.grpc_host, settings.grpc_port, reuse_port=True)
    log.info("gRPC listening on %s:%d", settings.grpc_host, settings.grpc_port)
    try:
        yield listener
    finally:
        listener.close()
        await listener.wait_closed()
