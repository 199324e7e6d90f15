"""One journal record: an event as a line of JSON and back, checked against the event's dataclass
fields both ways; and what a line that cannot be read still shows (`JournalLineSkipped`). The
file itself is `journal`'s."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from tritonactor.control import events

SCHEMA_VERSION = 1

_NEWLINE = b"\n"
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.)*")')
_TYPE_FIELD = re.compile(rb'"type"\s*:\s*"([A-Za-z]+)"')


class JournalError(ValueError):
    """A record that cannot be encoded or decoded: unknown type or version, a missing field, a
    value of the wrong kind."""


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    hint: Any
    required: bool


def _field_specs(cls: type[events.Event]) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    specs = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        _check_supported(hint, f"{cls.__name__}.{field.name}")
        has_default = (
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING
        )
        specs.append(_FieldSpec(field.name, hint, required=not has_default))
    return tuple(specs)


def _find_event_types() -> dict[str, tuple[type[events.Event], tuple[_FieldSpec, ...]]]:
    found = {}
    for value in vars(events).values():
        # The base class is the shape every event shares, not a fact anyone records.
        if (
            isinstance(value, type)
            and issubclass(value, events.Event)
            and value is not events.Event
            and value.__module__ == events.__name__
        ):
            found[value.__name__] = (value, _field_specs(value))
    return found


_SCALARS = (str, int, float, bool, type(None))


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _check_supported(hint: Any, where: str) -> None:
    # Refusing at import beats writing records that cannot be read back.
    if hint in _SCALARS or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return
    if _is_union(hint) or typing.get_origin(hint) is tuple:
        for arg in typing.get_args(hint):
            if arg is not Ellipsis:
                _check_supported(arg, where)
        return
    raise TypeError(f"the journal cannot store {where} of type {hint!r}")


_FOUND = _find_event_types()
# Every event class of `events`, by the name its records carry.
EVENT_TYPES: Mapping[str, type[events.Event]] = types.MappingProxyType(
    {name: cls for name, (cls, _) in _FOUND.items()}
)
_SPECS: Mapping[type[events.Event], tuple[_FieldSpec, ...]] = dict(_FOUND.values())


def _kind_error(where: str, hint: Any, value: Any) -> JournalError:
    name = hint.__name__ if isinstance(hint, type) else repr(hint)
    return JournalError(f"{where}: expected {name}, got {value!r}")


def _convert(hint: Any, value: Any, where: str, *, to_json: bool) -> Any:
    """`value` as JSON (to_json) or back from JSON, checked against the field's type hint.

    The same walk serves both directions, so whatever is written can be read back.
    """
    if _is_union(hint):
        if value is None and type(None) in typing.get_args(hint):
            return None
        for arg in typing.get_args(hint):
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where, to_json=to_json)
            except JournalError:
                continue
        raise _kind_error(where, hint, value)
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list | tuple):
            raise _kind_error(where, hint, value)
        args = typing.get_args(hint)
        kinds = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(kinds) != len(value):
            raise _kind_error(where, hint, value)
        items = [
            _convert(kind, item, f"{where}[{index}]", to_json=to_json)
            for index, (kind, item) in enumerate(zip(kinds, value, strict=True))
        ]
        return items if to_json else tuple(items)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            member = hint(value)
        except (ValueError, TypeError):
            raise _kind_error(where, hint, value) from None
        return member.value if to_json else member
    if hint is float:
        # JSON has one number type: a float field may arrive as an integer.
        if type(value) in (int, float):
            return float(value)
        raise _kind_error(where, hint, value)
    if hint is str and isinstance(value, str):
        # A StrEnum member in a plain str field is written, and read back, as its text.
        return str.__str__(value)
    # Exact types: a bool is not an int here, nor a numpy integer.
    if type(value) is hint:
        return value
    raise _kind_error(where, hint, value)


def encode(event: events.Event) -> dict[str, Any]:
    """The JSON record for `event`: `{"v": 1, "type": <class name>, "fields": {...}}`."""
    cls = type(event)
    specs = _SPECS.get(cls)
    if specs is None or EVENT_TYPES.get(cls.__name__) is not cls:
        raise JournalError(f"{cls.__qualname__} is not an event of tritonactor.control.events")
    values = {
        spec.name: _convert(
            spec.hint, getattr(event, spec.name), f"{cls.__name__}.{spec.name}", to_json=True
        )
        for spec in specs
    }
    return {"v": SCHEMA_VERSION, "type": cls.__name__, "fields": values}


def decode(record: Any) -> events.Event:
    """The event a record holds; fields it does not know are ignored, defaulted ones may be absent.

    Raises `JournalError` for anything else: not an object, an unknown schema version or type,
    a missing required field, a value of the wrong kind.
    """
    if not isinstance(record, dict):
        raise JournalError(f"a record is a JSON object, not {type(record).__name__}")
    version = record.get("v")
    # `True == 1` in Python; a schema version is an integer, nothing else.
    if type(version) is not int or version != SCHEMA_VERSION:
        raise JournalError(
            f"unknown schema version {version!r} (this server reads {SCHEMA_VERSION})"
        )
    name = record.get("type")
    cls = EVENT_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise JournalError(f"unknown event type {name!r}")
    values = record.get("fields")
    if not isinstance(values, dict):
        raise JournalError(f"{name}: 'fields' is a JSON object, not {values!r}")
    arguments = {}
    for spec in _SPECS[cls]:
        if spec.name not in values:
            if spec.required:
                raise JournalError(f"{name}: missing field {spec.name!r}")
            continue
        arguments[spec.name] = _convert(
            spec.hint, values[spec.name], f"{name}.{spec.name}", to_json=False
        )
    return cls(**arguments)


def encode_line(event: events.Event) -> bytes:
    # ASCII escapes keep any string (a lone surrogate from an undecodable path included)
    # representable; allow_nan=False keeps every line standard JSON.
    record = encode(event)
    try:
        text = json.dumps(record, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        raise JournalError(f"{type(event).__name__}: {exc}") from None
    return text.encode("ascii") + _NEWLINE


def read_line(seq: int, line: bytes) -> events.Event:
    """The event of line `seq`, or the `JournalLineSkipped` it replays as when it is not JSON or
    not a good record."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        return _skipped(seq, line, f"not JSON ({exc})", None)
    try:
        return decode(record)
    except JournalError as exc:
        return _skipped(seq, line, str(exc), record)


def _skipped(seq: int, line: bytes, reason: str, record: Any) -> events.JournalLineSkipped:
    """What can still be read of a bad line: the models it names and its event type."""
    models: list[str] = []
    kind = ""
    fields = record.get("fields") if isinstance(record, dict) else None
    if isinstance(fields, dict) and isinstance(fields.get("model"), str):
        models.append(fields["model"])
    else:
        for match in _MODEL_FIELD.finditer(line):
            try:
                name = json.loads(match.group(1))
            except ValueError:
                continue
            if isinstance(name, str) and name not in models:
                models.append(name)
    if isinstance(record, dict) and isinstance(record.get("type"), str):
        kind = record["type"]
    else:
        # Two records run together are judged by the one that may have asked something.
        kinds = [found.group(1).decode("ascii") for found in _TYPE_FIELD.finditer(line)]
        kind = next((k for k in kinds if not events.asks_nothing(k)), kinds[0] if kinds else "")
    models = [name for name in models if name]  # ServerStarted's model is ""
    if not line.strip():
        kind = events.BLANK_LINE  # (skipped, and said, but no record can be lost in it)
    return events.JournalLineSkipped(
        model=models[0] if models else "",
        time=0.0,  # unknown
        line=seq,
        reason=reason,
        models=tuple(models),
        kind=kind,
    )
