"""The line formats of the ``tritonactor`` logger tree: Triton's two text layouts (log_format
``default`` and ``ISO8601``) and JSON lines (TRITONACTOR_LOG_FORMAT=json), each carrying the trace
context of the line and the record's ``extra=`` fields.

They hold no settings: the handler in logging.py builds the formatter its settings ask for. See
docs/logging.md.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from enum import StrEnum

from opentelemetry import trace
from opentelemetry.trace import SpanContext


class LogFormat(StrEnum):
    """Triton's log_format: how the text lines stamp their time."""

    DEFAULT = "default"
    ISO8601 = "ISO8601"


# The ``extra=`` name of a record's multi-line object (a table), written after its message.
OBJECT = "triton_object"
# Set on a record from outside the ``tritonactor`` tree that the server writes as its own.
NOTICE = "triton_notice"

# Attributes every record has; anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    OBJECT,
    NOTICE,
}


def trace_fields(span_context: SpanContext | None) -> dict[str, object]:
    """``extra=`` fields naming a span that is not the current one: a request's span, which the
    tracing keeps in the request rather than making it current, or a span of another thread."""
    if span_context is None or not span_context.is_valid:
        return {}
    return {
        "trace_id": format(span_context.trace_id, "032x"),
        "span_id": format(span_context.span_id, "016x"),
    }


def context_fields(record: logging.LogRecord) -> dict[str, object]:
    """The trace context of the span current where the log call was made, then the record's
    ``extra=`` fields. A ``trace_id`` given as an extra (``trace_fields``) wins."""
    fields = {name: value for name, value in vars(record).items() if name not in _RECORD_ATTRIBUTES}
    if "trace_id" not in fields:
        # Formatting happens inside the log call, in the caller's context, so the span current
        # now is the one current where the message was logged.
        current_span = trace_fields(trace.get_current_span().get_span_context())
        if current_span:
            fields = current_span | fields
    return fields


class TextFormatter(logging.Formatter):
    """Triton's layouts, with the Python file where Triton has its C++ file:

    default  ``I0520 20:03:25.829575 3355 manager.py:95] "message key=value"``
    ISO8601  ``2024-05-20T20:03:25Z I 3355 manager.py:95] "message key=value"``

    Times are UTC. As in Triton, the message is written as a JSON string (quoted, escaped:
    a line is one record whatever a client put in a name), its fields and any exception text
    inside it; with ``escaped`` False (TRITON_SERVER_ESCAPE_LOG_MESSAGES=0) it is written as it
    is, control characters still escaped. A record's ``OBJECT`` (a table) follows the message on
    lines of its own, as Triton writes its tables: the one multi-line record."""

    def __init__(self, log_format: LogFormat = LogFormat.DEFAULT, escaped: bool = True) -> None:
        super().__init__()
        self.log_format = log_format
        self.escaped = escaped

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        letter = _letter(record.levelno)
        if self.log_format is LogFormat.ISO8601:
            stamp = f"{moment:%Y-%m-%dT%H:%M:%SZ} {letter}"
        else:
            stamp = f"{letter}{moment:%m%d %H:%M:%S}.{moment.microsecond:06d}"
        process = record.process if record.process is not None else os.getpid()
        message = record.getMessage()
        for name, value in context_fields(record).items():
            message += f" {name}={_text_value(value)}"
        message += self._exception_text(record)
        table = getattr(record, OBJECT, None)
        if self.escaped and (message or table is None):  # a table's empty heading stays empty
            message = _json_string(message)
        else:
            message = _escape(message)
        line = f"{stamp} {process} {record.filename}:{record.lineno}] {message}"
        return line if table is None else f"{line}\n{table}"

    def _exception_text(self, record: logging.LogRecord) -> str:
        text = ""
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
            text += "\n" + record.exc_text
        elif record.exc_text:
            text += "\n" + record.exc_text
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (RFC 3339, UTC, microseconds), level, logger, message, then
    trace_id and span_id inside a traced request, the ``extra=`` fields, and any exception."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        entry: dict[str, object] = {
            "time": f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond:06d}Z",
            "level": record.levelname if record.levelno >= logging.DEBUG else "DEBUG",
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.levelno < logging.INFO:
            entry["verbose"] = logging.DEBUG - record.levelno + 1
        for name, value in context_fields(record).items():
            entry.setdefault(name, value)  # an extra cannot pass itself off as a base field
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        table = getattr(record, OBJECT, None)
        if table is not None:
            entry["object"] = table
        return json.dumps(entry, default=str, ensure_ascii=False)


def _letter(level: int) -> str:
    # Triton writes a verbose message as information: it has no letter of its own.
    if level >= logging.ERROR:
        return "E"
    if level >= logging.WARNING:
        return "W"
    return "I"


def _json_string(text: str) -> str:
    """``text`` as a JSON string, as Triton writes a message: quoted, with quotes, backslashes
    and control characters escaped; other characters that are not printable (U+2028, ...)
    escaped too, so that nothing reads as a line break, and the result still JSON."""
    quoted = json.dumps(text, ensure_ascii=False)
    if quoted.isprintable():
        return quoted
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in quoted)


def _escape(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _text_value(value: object) -> str:
    if isinstance(value, str):
        plain = value and value.isprintable() and not any(c in value for c in ' "=')
        return value if plain else json.dumps(value, ensure_ascii=False)
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    return _text_value(str(value))


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Rows as Triton's log writes a table (a record's ``OBJECT``)::

        +--------+---------+--------+
        | Model  | Version | Status |
        +--------+---------+--------+
        | simple | 1       | READY  |
        +--------+---------+--------+

    A cell is one line: its line breaks and other unprintable characters are escaped."""
    cells = [header, *(tuple(_escape(str(cell)) for cell in row) for row in rows)]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    border = "+" + "+".join("-" * (width + 2) for width in widths) + "+"

    def line(row: tuple[str, ...]) -> str:
        padded = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    return "\n".join([border, line(header), border, *(line(row) for row in cells[1:]), border])
