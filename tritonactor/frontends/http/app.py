"""The HTTP front end: KServe v2 with Triton's extensions, on starlette. It only translates the
wire format; every decision is the server's (router, control plane). This module assembles the
app: the route table, each route behind the restricted-API guard, the exception handlers and the
direct infer route (direct.py); the handlers themselves are in routes.py, generate.py and
shared_memory.py."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Send

from tritonactor.core.errors import TritonError
from tritonactor.frontends.http.direct import HttpApp
from tritonactor.frontends.http.errors import (
    client_gone,
    drain_body,
    error_response,
    http_error,
    internal_error,
    triton_error,
)
from tritonactor.frontends.http.generate import GenerateRoutes
from tritonactor.frontends.http.infer_lane import InferLane
from tritonactor.frontends.http.limits import BodyLimits
from tritonactor.frontends.http.openapi import serve_openapi
from tritonactor.frontends.http.routes import Routes
from tritonactor.frontends.http.shared_memory import shared_memory_routes
from tritonactor.frontends.restrictions import (
    HEALTH,
    INFERENCE,
    LOGGING,
    METADATA,
    MODEL_CONFIG,
    MODEL_REPOSITORY,
    SHARED_MEMORY,
    STATISTICS,
    TRACE,
    Restrictions,
    http_message,
)
from tritonactor.observability.endpoint import metrics_route

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tritonactor.server import Server

Handler = Callable[[Request], Awaitable[Response]]


def create_http_app(
    server: Server,
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]] | None = None,
) -> Starlette:
    routes = Routes(server)
    generate = GenerateRoutes(server.router, server.settings.http_max_json_depth)
    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version:int}"
    both = (model, versioned)
    restrictions = Restrictions(server.settings.http_restricted_api)

    def route(path: str, endpoint: Handler, category: str, methods: list[str]) -> Route:
        return Route(path, _guarded(restrictions, category, endpoint), methods=methods)

    app = HttpApp(
        routes=[
            route("/v2", routes.server_metadata, METADATA, ["GET"]),
            route("/v2/openapi.json", serve_openapi, METADATA, ["GET"]),
            route("/v2/health/live", routes.live, HEALTH, ["GET"]),
            route("/v2/health/ready", routes.ready, HEALTH, ["GET"]),
            route("/v2/repository/index", routes.repository_index, MODEL_REPOSITORY, ["POST"]),
            route(
                "/v2/repository/models/{model}/load", routes.load_model, MODEL_REPOSITORY, ["POST"]
            ),
            route(
                "/v2/repository/models/{model}/unload",
                routes.unload_model,
                MODEL_REPOSITORY,
                ["POST"],
            ),
            route("/v2/repository/events", routes.repository_events, MODEL_REPOSITORY, ["GET"]),
            # A repository named in the path, as Triton's routes take it: its index is the
            # server's, a load or unload through it is not supported.
            route(
                "/v2/repository/{repository}/index",
                routes.repository_index,
                MODEL_REPOSITORY,
                ["POST"],
            ),
            *(
                route(
                    f"/v2/repository/{{repository}}/models/{{model}}/{action}",
                    routes.named_repository_control,
                    MODEL_REPOSITORY,
                    ["POST"],
                )
                for action in ("load", "unload")
            ),
            route("/v2/trace/setting", routes.trace_setting, TRACE, ["GET", "POST"]),
            route("/v2/logging", routes.logging, LOGGING, ["GET", "POST"]),
            *shared_memory_routes(
                server,
                lambda path, endpoint, methods: route(path, endpoint, SHARED_MEMORY, methods),
            ),
            # Triton's metrics are on a port of their own, outside the restricted categories.
            metrics_route(server),
            route(f"{model}/trace/setting", routes.trace_setting, TRACE, ["GET", "POST"]),
            # Before the model routes, which would take "stats" for a model's name.
            route("/v2/models/stats", routes.model_statistics, STATISTICS, ["GET"]),
            *(route(f"{b}/stats", routes.model_statistics, STATISTICS, ["GET"]) for b in both),
            *(route(b, routes.model_metadata, METADATA, ["GET"]) for b in both),
            *(route(f"{b}/ready", routes.model_ready, HEALTH, ["GET"]) for b in both),
            *(route(f"{b}/config", routes.model_config, MODEL_CONFIG, ["GET"]) for b in both),
            *(route(f"{b}/infer", routes.infer, INFERENCE, ["POST"]) for b in both),
            *(route(f"{b}/generate", generate.generate, INFERENCE, ["POST"]) for b in both),
            *(
                route(f"{b}/generate_stream", generate.generate_stream, INFERENCE, ["POST"])
                for b in both
            ),
        ],
        exception_handlers={
            ClientDisconnect: client_gone,
            TritonError: triton_error,
            HTTPException: http_error,
            Exception: internal_error,
        },
        lifespan=lifespan,
    )
    # Triton answers a path with a trailing slash 404, not a redirect, and HEAD 405: starlette
    # would redirect the one and serve the other as a GET.
    app.router.redirect_slashes = False
    for route in app.routes:
        if isinstance(route, Route) and route.methods is not None:
            route.methods.discard("HEAD")
    app.infer = functools.partial(_answer, _guarded(restrictions, INFERENCE, routes.infer))
    app.limits = BodyLimits.of(server.settings)
    if server.settings.http_lane and not restrictions.restricts(INFERENCE):
        app.lane = InferLane(app, routes, app.limits.max_size)
    return app


async def _answer(endpoint: Handler, request: Request, send: Send) -> None:
    """Run `endpoint` and send its response (the direct infer route); an error is answered as
    the app's exception handlers answer it (an unexpected one is raised again once answered, as
    starlette does)."""
    try:
        response = await endpoint(request)
    except ClientDisconnect as error:
        await client_gone(request, error)
        return
    except TritonError as error:
        response = await triton_error(request, error)
    except HTTPException as error:
        response = await http_error(request, error)
    except Exception as error:
        await (await internal_error(request, error))(request.scope, request.receive, send)
        raise
    await response(request.scope, request.receive, send)


def _guarded(restrictions: Restrictions, category: str, endpoint: Handler) -> Handler:
    """`endpoint`, answering 403 when its category is restricted and the call lacks the
    header (Triton's restricted APIs)."""
    if not restrictions:
        return endpoint

    async def guarded(request: Request) -> Response:
        missing = restrictions.missing(category, request.headers.get)
        if missing is not None:
            await drain_body(request)
            return error_response(http_message(missing), 403)
        return await endpoint(request)

    return guarded
