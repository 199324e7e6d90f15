"""Triton's logging settings (GET/POST /v2/logging, the LogSettings RPC) applied to the
``tritonactor`` logger tree, and the per-request log line the front ends write through it. The
line formats the settings choose between are in log_format.py.

The settings live on the one handler installed on the ``tritonactor`` logger, because Python's
logging is process-wide state already: ``current()`` and ``update()`` read and change that handler,
so the HTTP route and the gRPC RPC need nothing passed to them. See docs/logging.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from types import TracebackType
from typing import IO, Any

from opentelemetry.trace import SpanContext

from tritonactor._proto import inference as pb
from tritonactor.core.errors import TritonError, invalid_arg, unsupported
from tritonactor.frontends.listen import address_text
from tritonactor.observability.log_format import (
    NOTICE,
    JsonFormatter,
    LogFormat,
    TextFormatter,
    trace_fields,
)
from tritonactor.settings import VARIABLES, Settings, SettingsError

TREE = "tritonactor"
REQUESTS = "tritonactor.requests"
# Triton's environment variable: "0" writes messages as they are instead of as JSON strings.
ESCAPE_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"
# log_verbose_level travels as a uint32 in gRPC, so no larger level can be answered.
MAX_VERBOSE_LEVEL = 2**32 - 1

# In the order Triton answers them.
SETTING_NAMES = (
    "log_file",
    "log_info",
    "log_warning",
    "log_error",
    "log_verbose_level",
    "log_format",
)
# Looked up once: getLogger takes logging's module lock, and request_logger runs per request.
_request_log = logging.getLogger(REQUESTS)

# Triton's protocol document spells these two in the plural while its server reads the singular;
# both are accepted, so that a client written from the document is not silently ignored.
_ALIASES = {"log_warnings": "log_warning", "log_errors": "log_error"}


def verbose(level: int) -> int:
    """The logging level of a verbose message of ``level`` (1 = DEBUG, 2 just below, ...): it is
    written when log_verbose_level >= ``level``."""
    return max(1, logging.DEBUG - (level - 1))


@dataclasses.dataclass(frozen=True)
class LogSettings:
    """What the server logs and how. The first six are Triton's settings; ``json_lines`` is ours
    (TRITONACTOR_LOG_FORMAT=json) and is not part of Triton's answer."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: LogFormat = LogFormat.DEFAULT
    json_lines: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_format", LogFormat(self.log_format))
        if not 0 <= self.log_verbose_level <= MAX_VERBOSE_LEVEL:
            raise ValueError(f"log_verbose_level must be 0..{MAX_VERBOSE_LEVEL}")

    def to_json(self) -> dict[str, object]:
        """Triton's answer to GET and POST /v2/logging."""
        return {
            "log_file": self.log_file,
            "log_info": self.log_info,
            "log_warning": self.log_warning,
            "log_error": self.log_error,
            "log_verbose_level": self.log_verbose_level,
            "log_format": self.log_format.value,
        }

    def updated(self, request: Mapping[str, object]) -> LogSettings:
        """These settings with a logging request applied; raises TritonError, changing nothing,
        when any part of the request is wrong."""
        if not isinstance(request, Mapping):
            raise invalid_arg("the log settings must be a JSON object")
        changes: dict[str, object] = {}
        for given, value in request.items():
            name = _ALIASES.get(given, given)
            if name not in SETTING_NAMES:
                raise invalid_arg(
                    f"unknown log setting '{given}': expected one of {', '.join(SETTING_NAMES)}"
                )
            if value is not None:  # null leaves a setting as it is, as in Triton
                changes[name] = _checked(name, value)
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def _checked(name: str, value: object) -> object:
    if name == "log_file":
        # Triton refuses it too: a client could otherwise make the server write any file.
        raise unsupported("log file location can not be updated through network protocol")
    if name == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid_arg(f"expect uint32 for '{name}', got {_json(value)}")
        if not 0 <= value <= MAX_VERBOSE_LEVEL:
            raise invalid_arg(f"expect uint32 for '{name}', got {value}")
        return value
    if name == "log_format":
        if not isinstance(value, str):
            raise invalid_arg(f"expect string for '{name}', got {_json(value)}")
        if value not in {member.value for member in LogFormat}:
            raise invalid_arg(f"invalid argument for log_format, got: {value}")
        return LogFormat(value)
    if not isinstance(value, bool):
        raise invalid_arg(f"expect boolean for '{name}', got {_json(value)}")
    return value


def _json(value: object) -> str:
    return json.dumps(value, default=str)


# -- the two translations ------------------------------------------------------------------------


def current() -> dict[str, object]:
    """Triton's answer to GET /v2/logging (and to a LogSettings RPC without settings)."""
    return _handler().settings.to_json()


def update(settings_json: Mapping[str, object]) -> dict[str, object]:
    """Apply a POST /v2/logging body (or a translated LogSettings RPC) and answer with every
    setting. Raises TritonError, with nothing changed, when any setting is wrong."""
    settings = _handler().settings.updated(settings_json)
    apply(settings)
    return settings.to_json()


def settings_from_grpc(request: pb.LogSettingsRequest) -> dict[str, object]:
    """A LogSettingsRequest as the JSON object ``update`` takes. A value with no parameter set is
    null, as tritonclient sends a None, and leaves its setting alone; so does a map entry without
    a value (it holds the empty value: protobuf's rule)."""
    settings: dict[str, object] = {}
    for name, value in request.settings.items():
        if value is None:
            settings[name] = None
        elif value.bool_param is not None:
            settings[name] = value.bool_param
        elif value.uint32_param is not None:
            settings[name] = value.uint32_param
        else:
            settings[name] = value.string_param
    return settings


def settings_to_grpc(answer: Mapping[str, object]) -> pb.LogSettingsResponse:
    """``current()`` or ``update()``'s answer as a LogSettingsResponse."""
    settings: dict[str, pb.LogSettingsResponseSettingValue] = {}
    for name, value in answer.items():
        # bool before int: a bool is an int in Python.
        if isinstance(value, bool):
            settings[name] = pb.LogSettingsResponseSettingValue(bool_param=value)
        elif isinstance(value, int):
            settings[name] = pb.LogSettingsResponseSettingValue(uint32_param=value)
        else:
            settings[name] = pb.LogSettingsResponseSettingValue(string_param=str(value))
    return pb.LogSettingsResponse(settings=settings)


# -- applying settings to Python's logging -------------------------------------------------------


def configure_logging(settings: Settings) -> LogSettings:
    """Set up the ``tritonactor`` logger tree from the server's settings, at start. Raises
    SettingsError when the log file cannot be opened."""
    log_settings = LogSettings(
        log_file=settings.log_file,
        log_info=settings.log_info,
        log_warning=settings.log_warning,
        log_error=settings.log_error,
        # A level beyond what gRPC can carry already means "everything".
        log_verbose_level=min(settings.log_verbose, MAX_VERBOSE_LEVEL),
        log_format=LogFormat.ISO8601 if settings.log_format == "ISO8601" else LogFormat.DEFAULT,
        json_lines=settings.log_format == "json",
    )
    try:
        apply(log_settings)
    except OSError as error:
        variable = VARIABLES["log_file"]
        raise SettingsError(
            f"{variable}={settings.log_file!r} cannot be opened: {error.strerror or error}",
            variable=variable,
        ) from None
    return log_settings


def apply(settings: LogSettings) -> None:
    """Make ``settings`` the ones in force. Raises OSError, with nothing changed, when a new
    log_file cannot be opened."""
    handler = _handler()
    handler.use(settings)
    logging.getLogger(TREE).setLevel(_threshold(settings))


def _threshold(settings: LogSettings) -> int:
    """The lowest level any enabled kind of message has; the handler's filter does the rest."""
    if settings.log_verbose_level:
        return verbose(settings.log_verbose_level)
    if settings.log_info:
        return logging.INFO
    if settings.log_warning:
        return logging.WARNING
    if settings.log_error:
        return logging.ERROR
    return logging.CRITICAL + 1


def _handler() -> _SettingsHandler:
    """The handler that holds the settings, installed with the defaults the first time."""
    tree = logging.getLogger(TREE)
    for handler in tree.handlers:
        if isinstance(handler, _SettingsHandler):
            return handler
    handler = _SettingsHandler(LogSettings())
    tree.addHandler(handler)
    # The settings decide what the tree writes: a record passed on to the root's handlers would
    # be written twice, or written although its kind is switched off.
    tree.propagate = False
    root = logging.getLogger()
    if not root.handlers:
        # Other libraries' warnings and errors then reach the same place in the same format.
        # A root someone else configured (hypercorn's --log-config, a test runner) is theirs.
        root.addHandler(handler)
    tree.setLevel(_threshold(handler.settings))
    return handler


class _SettingsHandler(logging.Handler):
    """Writes the records the settings allow, one line each, to the log file or stderr."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings
        self._file: IO[str] | None = None
        self.setFormatter(_formatter(settings))

    def use(self, settings: LogSettings) -> None:
        opened: IO[str] | None = self._file
        if settings.log_file != self.settings.log_file:
            # Opened before anything changes, so a file that cannot be opened changes nothing.
            # No `with`: the handler keeps it open until the next switch or its close().
            opened = (
                open(settings.log_file, "a", encoding="utf-8")  # noqa: SIM115
                if settings.log_file
                else None
            )
        self.acquire()
        try:
            previous, self._file = self._file, opened
            self.settings = settings
            self.setFormatter(_formatter(settings))
        finally:
            self.release()
        if previous is not None and previous is not opened:
            previous.close()

    def filter(self, record: logging.LogRecord) -> bool | logging.LogRecord:
        settings = self.settings
        level = record.levelno
        if level >= logging.ERROR:
            allowed = settings.log_error
        elif level >= logging.WARNING:
            allowed = settings.log_warning
        elif not _in_tree(record.name) and not getattr(record, NOTICE, False):
            # Through the root: other libraries' chatter (hypercorn's access lines, asyncio's
            # debug) is theirs to configure; only their warnings and errors are ours to show.
            allowed = False
        elif level >= logging.INFO:
            allowed = settings.log_info
        else:
            allowed = settings.log_verbose_level > 0 and level >= verbose(
                settings.log_verbose_level
            )
        return allowed and super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            # sys.stderr looked up each time, so that a replaced stderr (a test's capture, a
            # redirect) is the one written to.
            stream = self._file if self._file is not None else sys.stderr
            stream.write(line + "\n")
            stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        self.acquire()
        try:
            if self._file is not None:
                self._file.close()
                self._file = None
        finally:
            self.release()
        super().close()


def asgi_server_handler() -> logging.Handler:
    """The handler of the ASGI server's own loggers (uvicorn's, through the --log-config that
    `tritonactor serve` gives it), in every process of it, its supervisor included: the one the
    settings in the environment configure, so that its warnings and errors are written as the
    server's are (format, log_file, log_warning); of its information lines only those
    `AsgiServerNotices` picks are written."""
    global asgi_server_logs
    asgi_server_logs = True
    with contextlib.suppress(SettingsError):  # the server reports a wrong setting as it starts
        configure_logging(Settings.from_env())
    return _handler()


# Whether the ASGI server's loggers go through the server's handler in this process (uvicorn
# under `tritonactor serve`): it then tells where HTTP is served (AsgiServerNotices), with the
# port it bound; the app does not.
asgi_server_logs = False
_RUNNING = "Uvicorn running on %s://"


class AsgiServerNotices(logging.Filter):
    """uvicorn's information lines an operator needs, made the server's: `Uvicorn running on
    http://HOST:PORT` becomes Triton's `Started HTTPService at HOST:PORT` (the port bound,
    also where 0 was asked for), and a worker process that died (and is started again) a
    warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("color_message", None)  # uvicorn's terminal colours: no field
        if record.levelno != logging.INFO:
            return True
        if isinstance(record.msg, str) and record.msg.startswith(_RUNNING):
            args = record.args
            if isinstance(args, tuple) and len(args) == 3:
                record.msg = "Started HTTPService at %s"
                record.args = (address_text(str(args[1]), int(args[2])),)
                setattr(record, NOTICE, True)
        elif record.getMessage().startswith("Child process [") and "died" in record.getMessage():
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _formatter(settings: LogSettings) -> logging.Formatter:
    if settings.json_lines:
        return JsonFormatter()
    # Triton's switch, from the environment the server started in: unset or anything but "0"
    # escapes.
    escaped = os.environ.get(ESCAPE_VARIABLE, "1") != "0"
    return TextFormatter(settings.log_format, escaped=escaped)


def _in_tree(name: str) -> bool:
    return name == TREE or name.startswith(TREE + ".")


# -- request lines -------------------------------------------------------------------------------


class RequestLog:
    """One request's log line, written at verbose level >= 1 when the ``with`` block ends:
    ``HTTP POST /v2/models/simple/infer status=200 duration_ms=1.234 model=simple ...`` plus the
    trace context: ``span_context`` when set, or that of ``trace`` (the request's span, once
    tracing started it: read only if the line is written), else the span current at the end
    of the block. Set ``status`` before the block ends; an
    exception escaping it is logged with its error code and message, and re-raised."""

    __slots__ = ("_enabled", "_fields", "_message", "_started", "span_context", "status", "trace")

    def __init__(self, message: str, fields: dict[str, object], enabled: bool) -> None:
        self._message = message
        self._fields = fields
        self._enabled = enabled
        self._started = 0.0
        self.status: object = "OK"
        self.span_context: SpanContext | None = None
        self.trace: Any = None  # an object with a `span_context`

    def __enter__(self) -> RequestLog:
        if self._enabled:
            self._started = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self._enabled:
            return
        duration_ms = round((time.perf_counter() - self._started) * 1000, 3)
        span_context = self.span_context
        if span_context is None and self.trace is not None:
            span_context = self.trace.span_context
        fields = trace_fields(span_context)
        fields |= {"status": self.status, "duration_ms": duration_ms}
        if error is not None:
            fields["status"] = error.code.name if isinstance(error, TritonError) else "INTERNAL"
            fields["error"] = str(error) or type(error).__name__
        fields.update(self._fields)
        # stacklevel: the line names the front end that ran the block, not this module.
        _request_log.debug(self._message, extra=fields, stacklevel=2)


def request_logger(protocol: str, method: str, target: str, **fields: object) -> RequestLog:
    """The log line of one request, as a context manager around its handling::

        with request_logger("HTTP", "POST", path, model=name, version=version) as entry:
            ...
            entry.status = 200

    ``fields`` (model, version, request_id, ...) become fields of the line. When verbose
    logging is off the block costs one level check."""
    enabled = _request_log.isEnabledFor(logging.DEBUG)
    return RequestLog(f"{protocol} {method} {target}" if enabled else "", fields, enabled)
