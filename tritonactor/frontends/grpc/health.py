"""The standard gRPC health service, `grpc.health.v1.Health`, beside Triton's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpclib.const

from tritonactor._proto.grpc.health import v1 as health
from tritonactor.frontends.grpc.guard import guard
from tritonactor.frontends.grpc.limits import bounded
from tritonactor.frontends.grpc.unary import unary_answers

if TYPE_CHECKING:
    from tritonactor.server import Server


class HealthService(health.HealthBase):
    """SERVING when the server is ready (every model that should load is loaded)."""

    def __init__(self, server: Server) -> None:
        self._server = server

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        settings = self._server.settings
        return unary_answers(
            bounded(
                guard(super().__mapping__(), settings.grpc_restricted_protocol),
                settings.grpc_max_message_size,
            )
        )

    async def check(self, message: health.HealthCheckRequest) -> health.HealthCheckResponse:
        ready = await self._server.ready()
        status = (
            health.HealthCheckResponseServingStatus.SERVING
            if ready
            else health.HealthCheckResponseServingStatus.NOT_SERVING
        )
        return health.HealthCheckResponse(status=status)
