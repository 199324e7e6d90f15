"""`pb_utils.Logger`: messages for the server's log, at Triton's levels."""

from __future__ import annotations

import enum
import sys

from tritonactor.backends.python import _pb_runtime as runtime


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Logger.log(message, level=Logger.LogLevel.INFO) and log_info/log_warn/log_error/
    log_verbose. As in Triton, the level is a LogLevel (a bare number is a TypeError)."""

    LogLevel = LogLevel

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        if not isinstance(level, LogLevel):
            raise TypeError(f"Logger.log level must be a Logger.LogLevel, not {level!r}")
        _emit(message, level)

    @staticmethod
    def log_info(message: str) -> None:
        _emit(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        _emit(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        _emit(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        _emit(message, LogLevel.VERBOSE)


def _emit(message: str, level: LogLevel) -> None:
    if isinstance(message, bytes):  # Triton's bindings take bytes as the text they hold
        message = message.decode("utf-8", errors="replace")
    if not isinstance(message, str):
        raise TypeError(f"a log message must be a str, not {type(message).__name__}")
    if runtime.stub is None:
        print(message, file=sys.stderr)
    else:
        # Where the model called the logger (Logger.log_*() -> here), which the server's line
        # names, as Triton's names the model's file and line.
        caller = sys._getframe(2)
        runtime.stub.log(int(level), message, caller.f_code.co_filename, caller.f_lineno)
