"""Triton's error codes as gRPC statuses (the one mapping every gRPC handler uses), and the
handlers' wrapper that applies it (`translate_errors`)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpclib
import grpclib.const

from tritonactor.core.errors import ErrorCode, TritonError

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

STATUS = {
    ErrorCode.UNKNOWN: grpclib.const.Status.UNKNOWN,
    ErrorCode.INVALID_ARG: grpclib.const.Status.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpclib.const.Status.NOT_FOUND,
    ErrorCode.ALREADY_EXISTS: grpclib.const.Status.ALREADY_EXISTS,
    ErrorCode.INTERNAL: grpclib.const.Status.INTERNAL,
    ErrorCode.UNSUPPORTED: grpclib.const.Status.UNIMPLEMENTED,
    ErrorCode.UNAVAILABLE: grpclib.const.Status.UNAVAILABLE,
    ErrorCode.CANCELLED: grpclib.const.Status.CANCELLED,
}


def grpc_error(error: TritonError) -> grpclib.GRPCError:
    return grpclib.GRPCError(STATUS[error.code], error.message)


def translate_errors(method: F) -> F:
    """TritonError -> the matching gRPC status; anything else -> INTERNAL, logged."""

    @functools.wraps(method)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except TritonError as error:
            raise grpc_error(error) from None
        except grpclib.GRPCError:
            raise
        except Exception as error:
            log.exception("gRPC %s failed", method.__name__)
            raise grpclib.GRPCError(
                grpclib.const.Status.INTERNAL, f"internal error: {type(error).__name__}: {error}"
            ) from None

    return wrapper  # type: ignore[return-value]
