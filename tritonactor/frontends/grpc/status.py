"""Triton's error codes as gRPC statuses (the one mapping every gRPC handler uses)."""

from __future__ import annotations

import grpclib
import grpclib.const

from tritonactor.core.errors import ErrorCode, TritonError

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
