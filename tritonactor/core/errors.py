"""One error model for every front end: a code, a message, and how each wire reports it."""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Triton's TRITONSERVER_Error codes (their numbers in tritonserver.h, so a member compares
    equal to Triton's number: `pb_utils.TritonError.code()` returns these), with the HTTP status
    each one is answered with."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]

    @classmethod
    def named(cls, name: str) -> ErrorCode:
        """The code called `name` (as codes travel between processes); INTERNAL for a name that
        is none."""
        return cls.__members__.get(name, cls.INTERNAL)


# Triton's HTTP front end: the codes with no HTTP status of their own (UNKNOWN, ALREADY_EXISTS,
# CANCELLED) are 400, as INVALID_ARG.
_HTTP_STATUS = {
    ErrorCode.UNKNOWN: 400,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
}


class TritonError(Exception):
    """An error a client sees, with its code. Raised anywhere below the front ends.
    `refused`: the server refused the request before any model had it (`refused`)."""

    refused = False

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"TritonError({self.code.name}, {self.message!r})"


def refused(error: TritonError) -> TritonError:
    """`error`, marked as the server's refusal of a request before any model had it: the
    router's (a model not ready, a request not valid for it) or a scheduler's as it arrived (a
    full queue, a sequence's control it cannot take). Triton gives such a request back unrun: a
    gRPC stream answers it with its id only (and goes on in "triton_grpc_error" mode too), a
    BLS caller sees it prefixed with the model's name."""
    error.refused = True
    return error


def invalid_arg(message: str) -> TritonError:
    return TritonError(ErrorCode.INVALID_ARG, message)


def not_found(message: str) -> TritonError:
    return TritonError(ErrorCode.NOT_FOUND, message)


def unavailable(message: str) -> TritonError:
    return TritonError(ErrorCode.UNAVAILABLE, message)


def unsupported(message: str) -> TritonError:
    return TritonError(ErrorCode.UNSUPPORTED, message)


def internal(message: str) -> TritonError:
    return TritonError(ErrorCode.INTERNAL, message)


def cancelled(message: str) -> TritonError:
    return TritonError(ErrorCode.CANCELLED, message)
