"""tritonserver's pair options: `--backend-config=<backend>,<setting>=<value>`,
`--cache-config`, `--trace-config`, `--http-restricted-api=<api>,...:<key>=<value>`, ...

Each is repeatable; its variable holds the flag's values as a JSON list (or one value alone), and
the settings keep them parsed. Formats, and which parts may be empty, follow tritonserver 2.51.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from tritonactor.core.protocol import RESTRICTED_CATEGORIES
from tritonactor.settings.kinds import Kind, entries, join_entries, split_entries

# The APIs (HTTP) and protocols (gRPC) a restriction may name: tritonserver's categories.

TRACE_MODES = ("triton", "opentelemetry")
TRACE_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
# tritonserver's spellings of a trace level, lower-cased.
_TRACE_LEVEL_WORDS = {
    "false": "OFF",
    "off": "OFF",
    "true": "TIMESTAMPS",
    "on": "TIMESTAMPS",
    "min": "TIMESTAMPS",
    "max": "TIMESTAMPS",
    "timestamps": "TIMESTAMPS",
    "tensors": "TENSORS",
}
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Restriction:
    """`--http-restricted-api` / `--grpc-restricted-protocol`: the `apis` answer only a request
    that carries header `key` with `value` (over gRPC the header is
    `triton-grpc-protocol-<key>`, as in Triton)."""

    apis: frozenset[str]
    key: str
    value: str


class GroupSetting(NamedTuple):
    """One `[<group>,]<setting>=<value>` entry; group "" when none was given."""

    group: str
    setting: str
    value: str


def _grouped(text: str, what: str, group_required: bool) -> GroupSetting:
    """`<group>,<setting>=<value>`, or `<setting>=<value>` when the group is optional. The
    first `=` ends the setting; a `,` before it ends the group."""
    form = f"'<{what}>,<setting>=<value>'" + ("" if group_required else " or '<setting>=<value>'")
    head, equals, value = text.partition("=")
    group, comma, setting = head.partition(",")
    if not comma:
        group, setting = "", head
    if not equals or not setting or not value:
        raise ValueError(f"expected {form}")
    if comma and not group:
        raise ValueError(f"no {what} before ','; expected {form}")
    if group_required and not group:
        raise ValueError(f"no {what} given; expected {form}")
    return GroupSetting(group, setting, value)


def _format_grouped(entry: GroupSetting) -> str:
    prefix = f"{entry.group}," if entry.group else ""
    return f"{prefix}{entry.setting}={entry.value}"


def _entry_error(entry: str, reason: str) -> ValueError:
    return ValueError(f"has {entry!r}: {reason}")


# -- backend-config and cache-config: name -> settings -------------------------------------------


def _settings_by_group(what: str, group_required: bool) -> Kind:
    """A repeatable `<name>,<setting>=<value>` option kept as {name: {setting: value}} (name ""
    for a setting of every one, where allowed). A later value of a setting wins."""

    def parse(text: str) -> dict[str, dict[str, str]]:
        config: dict[str, dict[str, str]] = {}
        for entry in split_entries(text):
            try:
                group, setting, value = _grouped(entry, what, group_required)
            except ValueError as error:
                raise _entry_error(entry, str(error)) from None
            config.setdefault(group, {})[setting] = value
        return config

    def format(config: Mapping[str, Mapping[str, str]]) -> str:
        return join_entries(
            [
                _format_grouped(GroupSetting(group, setting, value))
                for group, settings in config.items()
                for setting, value in settings.items()
            ]
        )

    def check(config: Mapping[str, Mapping[str, str]]) -> str | None:
        # What a config given directly to Settings(...) must keep so that it can be written
        # as entries and read back the same.
        for group, settings in config.items():
            for setting, value in settings.items():
                entry = _format_grouped(GroupSetting(group, setting, value))
                try:
                    parsed = _grouped(entry, what, group_required)
                except ValueError as error:
                    return f"has {entry!r}: {error}"
                if parsed != (group, setting, value):
                    return f"has {entry!r}: a {what} name cannot hold ',' nor a setting '='"
        return None

    return Kind(
        parse,
        format=format,
        check=check,
        metavar=f"<{what}>,<setting>=<value>",
        many=True,
        join=join_entries,
    )


BACKEND_CONFIG = _settings_by_group("backend name", group_required=False)
CACHE_CONFIG = _settings_by_group("cache name", group_required=True)


# -- trace-config ------------------------------------------------------------------------------


def trace_level(word: str) -> str:
    """OFF, TIMESTAMPS or TENSORS from any of tritonserver's spellings."""
    try:
        return _TRACE_LEVEL_WORDS[word.lower()]
    except KeyError:
        raise ValueError(
            f"invalid value for trace level option: {word} (expected OFF, TIMESTAMPS or TENSORS)"
        ) from None


def _trace_levels(text: str) -> tuple[str, ...]:
    return tuple(trace_level(word.strip()) for word in text.split(",") if word.strip())


def _check_trace_levels(levels: tuple[str, ...]) -> str | None:
    for level in levels:
        if level not in TRACE_LEVELS:
            return f"has {level!r}: expected OFF, TIMESTAMPS or TENSORS"
    return None


TRACE_LEVEL = Kind(
    _trace_levels,
    format=",".join,
    check=_check_trace_levels,
    metavar="OFF|TIMESTAMPS|TENSORS",
    many=True,
)


def _integer(text: str, low: int, high: int) -> int:
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if not low <= number <= high:
        raise ValueError(f"{number} is out of range [{low}, {high}]")
    return number


# The values tritonserver checks as it parses them: (mode, setting) -> check.
_TRACE_VALUE_CHECKS: dict[tuple[str, str], Callable[[str], object]] = {
    ("", "level"): trace_level,
    ("", "rate"): lambda text: _integer(text, 0, UINT32_MAX),  # 0: only what clients sample
    ("", "count"): lambda text: _integer(text, -1, INT32_MAX),
    ("", "mode"): lambda text: _trace_mode(text),
    ("triton", "log-frequency"): lambda text: _integer(text, 0, UINT32_MAX),
    ("opentelemetry", "bsp_max_queue_size"): lambda text: _integer(text, 0, UINT32_MAX),
    ("opentelemetry", "bsp_schedule_delay"): lambda text: _integer(text, 0, UINT32_MAX),
    ("opentelemetry", "bsp_max_export_batch_size"): lambda text: _integer(text, 0, UINT32_MAX),
}


def _trace_mode(text: str) -> str:
    if text.lower() not in TRACE_MODES:
        raise ValueError(
            f"invalid value for trace mode option: {text}. "
            'Available options are "triton" and "opentelemetry"'
        )
    return text.lower()


def _trace_entry(text: str) -> GroupSetting:
    mode, setting, value = _grouped(text, "trace mode", group_required=False)
    if mode:
        mode = _trace_mode(mode)
    check = _TRACE_VALUE_CHECKS.get((mode, setting))
    if check is not None:
        check(value)
    return GroupSetting(mode, setting, value)


def _parse_trace_config(text: str) -> tuple[GroupSetting, ...]:
    parsed = []
    for entry in split_entries(text):
        try:
            parsed.append(_trace_entry(entry))
        except ValueError as error:
            raise _entry_error(entry, str(error)) from None
    return tuple(parsed)


def _check_trace_config(config: tuple[GroupSetting, ...]) -> str | None:
    for entry in config:
        text = _format_grouped(GroupSetting(*entry))
        try:
            if _trace_entry(text) != tuple(entry):
                return f"has {text!r}: a trace mode is written in lower case"
        except ValueError as error:
            return f"has {text!r}: {error}"
    return None


TRACE_CONFIG = Kind(
    _parse_trace_config,
    format=lambda config: join_entries([_format_grouped(GroupSetting(*e)) for e in config]),
    check=_check_trace_config,
    metavar="[<mode>,]<setting>=<value>",
    many=True,
    join=join_entries,
)


# -- restricted APIs and protocols ---------------------------------------------------------------


def _restriction(text: str, what: str) -> Restriction:
    """`<api>[,<api>...]:<key>=<value>`, every part non-empty, every api a known category."""
    names, colon, rest = text.partition(":")
    key, equals, value = rest.partition("=")
    if not (colon and equals and names and key and value):
        raise ValueError(f"expected '<{what}>[,<{what}>...]:<key>=<value>'")
    apis = [name.strip() for name in names.split(",")]
    for i, api in enumerate(apis):
        if api not in RESTRICTED_CATEGORIES:
            raise ValueError(
                f"unknown restricted {what} '{api}' (known: {', '.join(RESTRICTED_CATEGORIES)})"
            )
        if api in apis[:i]:
            raise ValueError(_twice(what, api))
    return Restriction(frozenset(apis), key, value)


def _format_restriction(restriction: Restriction) -> str:
    names = ",".join(api for api in RESTRICTED_CATEGORIES if api in restriction.apis)
    return f"{names}:{restriction.key}={restriction.value}"


def _twice_rule(restrictions: tuple[Restriction, ...], what: str) -> str | None:
    seen: set[str] = set()
    for restriction in restrictions:
        twice = sorted(restriction.apis & seen)
        if twice:
            return _twice(what, twice[0])
        seen |= restriction.apis
    return None


def _twice(what: str, api: str) -> str:
    # tritonserver's words, after ours.
    return (
        f"restricts {what} '{api}' twice: restricted {what} '{api}' can not be specified in "
        "multiple config groups"
    )


def restrictions(what: str) -> Kind:
    """`--http-restricted-api` (what="api") or `--grpc-restricted-protocol` ("protocol")."""

    def parse(text: str) -> tuple[Restriction, ...]:
        parsed = []
        for entry in split_entries(text):
            try:
                parsed.append(_restriction(entry, what))
            except ValueError as error:
                raise _entry_error(entry, str(error)) from None
        return tuple(parsed)

    def check(value: tuple[Restriction, ...]) -> str | None:
        for restriction in value:
            text = _format_restriction(restriction)
            try:
                if _restriction(text, what) != restriction:
                    return f"has {text!r}: a key cannot hold '='"
            except ValueError as error:
                return f"has {text!r}: {error}"
        return _twice_rule(value, what)

    return Kind(
        parse,
        format=lambda value: join_entries([_format_restriction(r) for r in value]),
        check=check,
        metavar=f"<{what}>[,<{what}>...]:<key>=<value>",
        many=True,
        join=join_entries,
    )


# -- options only checked, for tritonserver's sake -----------------------------------------------


def _checker(parse: Callable[[str], Any]) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        try:
            parse(text)
        except ValueError as error:
            return str(error)
        return None

    return check


def _setting_only(text: str) -> GroupSetting:
    try:
        entry = _grouped(text, "name", group_required=False)
    except ValueError:
        entry = None
    if entry is None or entry.group:
        raise ValueError("expected '<setting>=<value>'")
    return entry


def _int_pair(separator: str, second: Callable[[str], float], form: str) -> Callable[[str], Any]:
    def parse(text: str) -> tuple[int, float]:
        first, found, rest = text.partition(separator)
        try:
            if not found:
                raise ValueError
            return int(first), second(rest)
        except ValueError:
            raise ValueError(f"expected '{form}'") from None

    return parse


def _rate_limit_resource(text: str) -> None:
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError
        for number in parts[1:]:
            int(number)
    except ValueError:
        raise ValueError(
            "expected '<resource_name>:<count>:<device>' or '<resource_name>:<count>'"
        ) from None


METRICS_CONFIG = entries(_checker(_setting_only), "<setting>=<value>")
HOST_POLICY = entries(
    _checker(lambda text: _grouped(text, "policy name", group_required=True)),
    "<policy name>,<setting>=<value>",
)
RATE_LIMIT_RESOURCE = entries(_checker(_rate_limit_resource), "<name>:<count>[:<device>]")
DEVICE_BYTES = entries(_checker(_int_pair(":", int, "<device id>:<bytes>")), "<device id>:<bytes>")
DEVICE_FRACTION = entries(
    _checker(_int_pair(":", float, "<device id>:<fraction>")), "<device id>:<fraction>"
)
PORT_RANGE = Kind(
    str,
    check=_checker(_int_pair("-", int, "<integer>-<integer>")),
    metavar="<integer>-<integer>",
)
