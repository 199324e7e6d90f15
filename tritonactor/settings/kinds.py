"""Kinds of setting values: how each is read from its text (a variable, a flag), written back,
and checked.

A kind's `parse` and `check` raise or return the rule a value breaks, worded to follow
``TRITONACTOR_X='value' `` in a message; the settings add the variable (and the CLI the flag).
Every `parse(format(value)) == value`: that is how the settings reach hypercorn's workers.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from tritonactor.core.protocol import compile_forward_pattern
from tritonactor.store.location import StoreLocation, is_store_url, parse_location

# A port of 0 asks the OS for a free one, as a bind to port 0 always does; tests use it to avoid
# collisions. Turning an endpoint off is what TRITONACTOR_ALLOW_GRPC / _ALLOW_METRICS are for.
MIN_PORT, MAX_PORT = 0, 65535

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def _no_rule(value: Any) -> str | None:
    return None


def _plain(value: Any) -> str:
    return str(value)


@dataclass(frozen=True, slots=True)
class Kind:
    """How one setting's value is written and checked.

    `parse` turns text into the value, raising ValueError with the rule the text breaks;
    `format` writes a value as text that `parse` reads back; `check` returns the rule a value
    (parsed, or given directly to `Settings(...)`) breaks, or None. `many`: the flag may be
    repeated, and `join` turns its values into the one variable."""

    parse: Callable[[str], Any]
    format: Callable[[Any], str] = _plain
    check: Callable[[Any], str | None] = _no_rule
    metavar: str = "VALUE"
    boolean: bool = False
    many: bool = False
    join: Callable[[Sequence[str]], str] = ",".join


def checked(kind: Kind, check: Callable[[Any], str | None], metavar: str = "") -> Kind:
    """`kind` with one more rule."""

    def both(value: Any) -> str | None:
        return kind.check(value) or check(value)

    return Kind(
        kind.parse,
        kind.format,
        both,
        metavar or kind.metavar,
        kind.boolean,
        kind.many,
        kind.join,
    )


# -- scalars -----------------------------------------------------------------------------------


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("is not a boolean: expected true/false, 1/0, yes/no or on/off")


BOOL = Kind(
    _parse_bool, lambda value: "true" if value else "false", metavar="true|false", boolean=True
)


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("is not an integer") from None


INT = Kind(_parse_int, metavar="N")


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("is not a number") from None


FLOAT = Kind(_parse_float, metavar="X")
STRING = Kind(str, metavar="TEXT")


def at_least(low: int, metavar: str = "N") -> Kind:
    def rule(value: int) -> str | None:
        return None if value >= low else f"is out of range: expected an integer >= {low}"

    return checked(INT, rule, metavar)


def in_range(low: int, high: int, metavar: str = "N") -> Kind:
    def rule(value: int) -> str | None:
        return None if low <= value <= high else f"is out of range: expected {low}..{high}"

    return checked(INT, rule, metavar)


def choice(*values: str, metavar: str = "") -> Kind:
    """One of `values`, matched without case and stored as spelled here."""
    by_lower = {value.lower(): value for value in values}
    allowed = f"is not one of: {', '.join(values)}"

    def parse(text: str) -> str:
        try:
            return by_lower[text.lower()]
        except KeyError:
            raise ValueError(allowed) from None

    return Kind(
        parse,
        check=lambda value: None if value in values else allowed,
        metavar=metavar or "|".join(values),
    )


def enum(kind: type[Enum]) -> Kind:
    """A value of a string enum, matched without case."""
    allowed = f"is not one of: {', '.join(str(member.value) for member in kind)}"

    def parse(text: str) -> Enum:
        try:
            return kind(text.lower())
        except ValueError:
            raise ValueError(allowed) from None

    return Kind(
        parse,
        format=lambda value: str(value.value),
        metavar="|".join(str(member.value) for member in kind),
    )


# -- the server's own kinds ------------------------------------------------------------------

_PORT_RULE = f"is not a port: expected an integer {MIN_PORT}..{MAX_PORT} (0: any free port)"


def _parse_port(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(_PORT_RULE) from None


PORT = Kind(
    _parse_port,
    check=lambda port: None if MIN_PORT <= port <= MAX_PORT else _PORT_RULE,
    metavar="PORT",
)


def _parse_host(text: str) -> str:
    # Stored bare ("::1", not "[::1]"): grpclib and socket APIs want it so, and the CLI adds the
    # brackets that hypercorn's --bind needs.
    if text.startswith("[") and text.endswith("]"):
        return text[1:-1]
    return text


HOST = Kind(
    _parse_host,
    check=lambda host: None if host else "is empty: expected a host name or IP address",
    metavar="HOST",
)


def _parse_seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("is not a number: expected seconds >= 0") from None


def _poll_rule(secs: float) -> str | None:
    # 0, as in Triton: poll mode loads the repository at start and never polls again.
    if math.isfinite(secs) and secs >= 0:
        return None
    return "is not a poll interval: expected seconds >= 0 (0: never poll after the start)"


POLL_SECONDS = Kind(_parse_seconds, check=_poll_rule, metavar="SECONDS")


def _absolute(text: str) -> str:
    # Absolute, so that every worker means the same file whatever its working directory.
    return os.path.abspath(os.path.expanduser(text))


PATH = Kind(lambda text: Path(_absolute(text)), metavar="PATH")


def _split(text: str) -> list[str]:
    # Blank items are dropped so that "a, b," and "a,,b" mean what they obviously mean.
    return [item.strip() for item in text.split(",") if item.strip()]


def _comma_list(value: Sequence[object]) -> str:
    # Commas separate items, so a path or model name containing one cannot be expressed.
    return ",".join(str(item) for item in value)


def _repository(text: str) -> Path | StoreLocation:
    if is_store_url(text):
        try:
            return parse_location(text)
        except ValueError as error:
            raise ValueError(f"'{text}' {error}") from None
    return Path(_absolute(text))


# Local folders and object-store URLs (s3://, gs://, as://; tritonactor/store/location.py).
REPOSITORIES = Kind(
    lambda text: tuple(_repository(item) for item in _split(text)),
    format=_comma_list,
    metavar="PATH|URL",
    many=True,
)


def _load_models_rule(names: tuple[str, ...]) -> str | None:
    # Triton too refuses "*" next to names: it is unclear whether the names were meant alone.
    if "*" in names and len(names) > 1:
        return "mixes '*' with model names: give either '*' alone or a list of names"
    return None


MODEL_NAMES = Kind(
    lambda text: tuple(_split(text)),
    format=_comma_list,
    check=_load_models_rule,
    metavar="NAME",
    many=True,
)

_SIZE_UNITS = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}


def _parse_size(value: str) -> int:
    """Bytes, with an optional unit: 512MiB, 4GiB, 2G (powers of 1000), 100000."""
    text = value.strip().lower().removesuffix("b").strip()
    number = text.rstrip("kmgti")
    unit = text[len(number) :]
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in _SIZE_UNITS or not math.isfinite(amount) or amount < 0:
        raise ValueError(
            "is not a size: expected bytes, optionally with a unit "
            "(KiB, MiB, GiB, TiB or K, M, G, T), e.g. 4GiB; 0 for no limit"
        )
    return int(amount * _SIZE_UNITS[unit])


SIZE = Kind(
    _parse_size,
    check=lambda size: None if size >= 0 else "is negative: expected bytes >= 0 (0: no limit)",
    metavar="SIZE",
)


def _parse_verbose(text: str) -> int:
    # tritonserver reads true/false as 1/0 here.
    lowered = text.lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    return _parse_int(text)


LOG_VERBOSE = Kind(
    _parse_verbose,
    check=lambda level: None if level >= 0 else "is negative: expected an integer >= 0",
    metavar="LEVEL",
)

LOG_FORMATS = ("text", "ISO8601", "json")
# tritonserver's name for plain text lines.
_LOG_FORMAT_ALIASES = {"default": "text"}


def _parse_log_format(text: str) -> str:
    # Matched without case ("iso8601", "JSON") but stored in one spelling, so that to_env and
    # from_env agree; a name that is none of them is kept for the check to refuse.
    by_lower = {name.lower(): name for name in LOG_FORMATS} | _LOG_FORMAT_ALIASES
    return by_lower.get(text.lower(), text)


LOG_FORMAT = Kind(
    _parse_log_format,
    check=lambda name: (
        None
        if name in LOG_FORMATS
        else f"is not one of: {', '.join(LOG_FORMATS)} (default is an alias of text)"
    ),
    metavar="FORMAT",
)


def _log_file_rule(path: str) -> str | None:
    if not path:
        return None
    if os.path.isdir(path):
        return "is a directory: expected a file path"
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        return "is in a directory that does not exist"
    return None


LOG_FILE = Kind(_absolute, check=_log_file_rule, metavar="PATH")


def _regex_rule(pattern: str) -> str | None:
    try:
        compile_forward_pattern(pattern)
    except re.error as error:
        return f"is not a regular expression: {error}"
    return None


REGEX = Kind(str, check=_regex_rule, metavar="REGEX")


# -- repeated entries ----------------------------------------------------------------------------


def split_entries(text: str) -> list[str]:
    """The entries of a repeatable option's variable: a JSON list of strings, each written as
    the flag's value; a value that is not a JSON list is one entry."""
    if not text.startswith("["):
        return [text]
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"is not a JSON list of strings: {error}") from None
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        raise ValueError("is not a JSON list of strings")
    return entries


def join_entries(entries: Sequence[str]) -> str:
    """`entries` as `split_entries` reads them back; none is the empty (unset) variable."""
    return json.dumps(list(entries)) if entries else ""


def entries(check_entry: Callable[[str], str | None], metavar: str) -> Kind:
    """A repeatable option kept as its entries (tuple[str, ...]), each checked by
    `check_entry`, which returns what is wrong with it or None."""

    def parse(text: str) -> tuple[str, ...]:
        return tuple(split_entries(text))

    def rule(values: tuple[str, ...]) -> str | None:
        for entry in values:
            broken = check_entry(entry)
            if broken:
                return f"has {entry!r}: {broken}"
        return None

    return Kind(
        parse,
        format=join_entries,
        check=rule,
        metavar=metavar,
        many=True,
        join=join_entries,
    )
