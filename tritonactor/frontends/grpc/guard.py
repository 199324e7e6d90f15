"""Triton's `--grpc-restricted-protocol` on grpclib handlers: the methods of a restricted
category answer UNAVAILABLE unless the call's metadata carries the category's header."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpclib
import grpclib.const
import grpclib.server

from tritonactor.frontends.restrictions import (
    GRPC_HEADER_PREFIX,
    GRPC_METHODS,
    Restriction,
    Restrictions,
    grpc_message,
)


def guard(
    mapping: dict[str, grpclib.const.Handler], restrictions: Iterable[Restriction]
) -> dict[str, grpclib.const.Handler]:
    """`mapping` with each method of a restricted category answering UNAVAILABLE unless the
    call's metadata carries the category's header (Triton's `--grpc-restricted-protocol`)."""
    needs = Restrictions(restrictions, GRPC_HEADER_PREFIX)
    if not needs:
        return mapping
    guarded = dict(mapping)
    for method, handler in mapping.items():
        category = GRPC_METHODS.get(method)
        if category is not None:
            guarded[method] = handler._replace(func=_guarded(needs, category, handler.func))
    return guarded


def _guarded(
    needs: Restrictions, category: str, func: Callable[[Any], Awaitable[None]]
) -> Callable[[Any], Awaitable[None]]:
    async def call(stream: grpclib.server.Stream[Any, Any]) -> None:
        missing = needs.missing(category, stream.metadata.get)
        if missing is not None:
            raise grpclib.GRPCError(grpclib.const.Status.UNAVAILABLE, grpc_message(missing))
        await func(stream)

    return call
