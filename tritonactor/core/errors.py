"""One error model for every front end: a code, a message, and how each wire reports it."""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Triton's TRITONSERVER_Error codes, with the HTTP status each one is answered with."""

    INVALID_ARG = 400
    NOT_FOUND = 404
    ALREADY_EXISTS = 409
    INTERNAL = 500
    UNSUPPORTED = 501
    UNAVAILABLE = 503
    CANCELLED = 499

    @property
    def http_status(self) -> int:
        return self.value


class TritonError(Exception):
    """An error a client sees, with its code. Raised anywhere below the front ends."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"TritonError({self.code.name}, {self.message!r})"


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
