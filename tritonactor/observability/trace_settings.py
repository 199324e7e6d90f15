"""Triton's trace settings (the trace extension): one global setting and per-model overrides,
read and changed at run time through `/v2[/models/{m}]/trace/setting` and the TraceSetting RPC,
and the sampling decision they make for each inference request a client did not decide for.

Values travel as Triton has them: strings, and a list of strings for `trace_level`. A model's
override holds only the settings that were set for it; the others follow the global setting,
also when it changes later. JSON null (an empty value list over gRPC) clears a setting: a
model's falls back to the global one, a global one goes back to the server's default.

Counters belong to the scope that defines the value: a model with its own `trace_rate` counts
its requests towards it, models without one share the global count, and `trace_count` (the
traces left to take, -1 without limit) goes down where it is defined."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonactor.core.errors import invalid_arg, unsupported

OFF = "OFF"
LEVELS = ("TIMESTAMPS", "TENSORS")  # in the order Triton lists them
TRACE_MODE = "opentelemetry"
# The settings a request may name. Triton's answer in its OpenTelemetry mode, the one mode
# tritonactor traces in, lists the first three, trace_mode and EXPORTER_NAMES; log_frequency and
# trace_file belong to its trace files, which tritonactor does not write.
NAMES = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
# Where spans go and how they are batched: OTEL_* variables read at start, shown in every
# answer as Triton shows them; a request may name them (Triton takes them) and they stay.
EXPORTER_NAMES = ("url", "bsp_max_export_batch_size", "bsp_schedule_delay", "bsp_max_queue_size")

UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1

SettingJson = str | list[str]


@dataclass(slots=True)
class _Scope:
    """The global setting (every value) or one model's override (the values set for it)."""

    values: dict[str, Any]
    # Requests counted against this scope's trace_rate since it was last set.
    seen: int = 0


@dataclass(slots=True)
class TraceSettings:
    """What /v2/trace/setting shows and changes. Only the event loop touches it (the front
    ends' handlers and the sampling of a request as it arrives), so it needs no lock."""

    level: tuple[str, ...] = (OFF,)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    # The EXPORTER_NAMES values in force (`exporter_settings`).
    exporter: Mapping[str, str] = field(default_factory=dict)
    _global: _Scope = field(init=False)
    _models: dict[str, _Scope] = field(init=False, default_factory=dict)
    # Told the scope ("" = global) whose trace_count a traced request used up: a front end
    # tells its engine, which keeps the count of every front end (`use`).
    on_use: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._global = _Scope(self._defaults())

    def _defaults(self) -> dict[str, Any]:
        return {
            "trace_level": self.level,
            "trace_rate": self.rate,
            "trace_count": self.count,
            "log_frequency": self.log_frequency,
        }

    # -- the API ---------------------------------------------------------------------------------

    def get(self, model: str = "") -> dict[str, SettingJson]:
        """The settings in force for `model` ("" = the global ones), as Triton's JSON shows
        them: every value a string, trace_level a list."""
        level = self._value("trace_level", model)
        return {
            "trace_level": list(level),
            "trace_rate": str(self._value("trace_rate", model)),
            "trace_count": str(self._value("trace_count", model)),
            "trace_mode": TRACE_MODE,
            **{name: self.exporter.get(name, "") for name in EXPORTER_NAMES},
        }

    def update(self, changes: Mapping[str, Any], model: str = "") -> dict[str, SettingJson]:
        """Apply `changes` (name -> a string, a list of strings for trace_level, or None to
        clear) to `model`'s override ("" = the global setting); returns the settings then in
        force. Nothing changes unless every value is valid."""
        parsed = {name: _parse(name, value) for name, value in changes.items()}
        if model:
            scope = self._models.get(model)
            if scope is None:
                scope = self._models[model] = _Scope({})
        else:
            scope = self._global
        defaults = self._defaults()
        for name, value in parsed.items():
            if name in ("trace_file", "trace_mode") or name in EXPORTER_NAMES:
                continue  # accepted only as what they already are (see _parse)
            if value is None:
                if model:
                    scope.values.pop(name, None)
                else:
                    scope.values[name] = defaults[name]
            else:
                scope.values[name] = value
            if name == "trace_rate":
                scope.seen = 0
        if model and not scope.values:
            del self._models[model]
        return self.get(model)

    # -- sampling --------------------------------------------------------------------------------

    def enabled(self, model: str) -> bool:
        """Whether requests of `model` may be traced at all (trace_level is not OFF)."""
        return self._value("trace_level", model) != (OFF,)

    def sample(self, model: str) -> Callable[[], None] | None:
        """Whether to trace this request of `model`, by trace_level, trace_rate (1 in N) and
        trace_count: None when not, else the function that uses up one of trace_count, to call
        once the request is really traced (the OpenTelemetry sampler may still drop it)."""
        override = self._models.get(model)
        if override is None:
            values = self._global.values
            if values["trace_level"] == (OFF,) or values["trace_count"] == 0:
                return None
            return self._take(self._global, self._global)
        if self._value("trace_level", model) == (OFF,):
            return None
        counting = override if "trace_count" in override.values else self._global
        if counting.values["trace_count"] == 0:
            return None
        rating = override if "trace_rate" in override.values else self._global
        return self._take(rating, counting, model if counting is override else "")

    def _take(self, rating: _Scope, counting: _Scope, scope: str = "") -> Callable[[], None] | None:
        rate = rating.values["trace_rate"]
        if not rate:  # 0 (a start setting only): traced only where the client asks
            return None
        rating.seen += 1
        if rating.seen % rate:
            return None
        if counting.values["trace_count"] < 0:  # no count: nothing to use up (the usual case)
            return _nothing

        def use_up() -> None:
            if counting.values["trace_count"] > 0:
                counting.values["trace_count"] -= 1
                if self.on_use is not None:
                    self.on_use(scope)

        return use_up

    def count_left(self, scope: str, left: int) -> None:
        """The engine counted `left` of `scope`'s trace_count for every front end: never more
        than this front end still has (its own later uses may not have reached the engine),
        and only where this scope counts."""
        counting = self._counting(scope)
        if counting is None:
            return
        if counting.values["trace_count"] < 0 or left < counting.values["trace_count"]:
            counting.values["trace_count"] = left

    def snapshot(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The global values and every model's override, as a front end joining takes them
        (`restore`)."""
        return dict(self._global.values), {m: dict(s.values) for m, s in self._models.items()}

    def restore(self, snapshot: tuple[dict[str, Any], dict[str, dict[str, Any]]]) -> None:
        global_values, models = snapshot
        self._global = _Scope(dict(global_values))
        self._models = {model: _Scope(dict(values)) for model, values in models.items()}

    def use(self, scope: str) -> int | None:
        """A request of another process (a front end) used up one of `scope`'s trace_count
        ("" = the global one): what is left, or None when that scope counts nothing."""
        counting = self._counting(scope)
        if counting is None:
            return None
        if counting.values["trace_count"] > 0:
            counting.values["trace_count"] -= 1
        return int(counting.values["trace_count"])

    def _counting(self, scope: str) -> _Scope | None:
        """The scope ("" = global) if it has a trace_count of its own."""
        counting = self._models.get(scope) if scope else self._global
        if counting is None or "trace_count" not in counting.values:
            return None
        return counting

    def _value(self, name: str, model: str) -> Any:
        if model:
            override = self._models.get(model)
            if override is not None and name in override.values:
                return override.values[name]
        return self._global.values[name]


def _nothing() -> None:
    """What a traced request uses up where no trace_count counts."""


def _parse(name: str, value: Any) -> Any:
    """A setting's value from the wire, checked with Triton's messages where Triton has one."""
    if name in EXPORTER_NAMES:
        return None  # the OTEL_* variables decide, at start
    if name not in (*NAMES, *EXPORTER_NAMES):
        known = ", ".join((*NAMES, *EXPORTER_NAMES))
        raise invalid_arg(f"Unknown trace setting '{name}'; the settings are {known}")
    if name == "trace_file":
        # Any value, null included (Triton's answer, UNSUPPORTED): tritonactor writes no trace
        # files at all, its traces go through OpenTelemetry (trace_mode 'opentelemetry').
        raise unsupported("trace file location can not be updated through network protocol")
    if value is None:
        return None
    if name == "trace_level":
        return _level(value)
    if not isinstance(value, str):
        raise invalid_arg(f"Unable to parse '{name}', expected a string, got: {value!r}")
    if name == "trace_rate":
        rate = _integer(name, value, 0, UINT32_MAX)
        if rate == 0:  # Triton takes 0 at start only
            raise invalid_arg(
                "Attempting to set invalid trace setting :sample rate must be non-zero"
            )
        return rate
    if name == "log_frequency":
        return _integer(name, value, 0, UINT32_MAX)
    if name == "trace_count":
        return _integer(name, value, -1, INT32_MAX)
    if value != TRACE_MODE:
        raise invalid_arg(
            f"trace_mode cannot be set to '{value}': tritonactor traces through OpenTelemetry "
            f"only (trace_mode '{TRACE_MODE}')"
        )
    return value


def _level(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise invalid_arg(f"Unable to parse 'trace_level', expected an array of strings: {value!r}")
    if not value:
        raise invalid_arg("Unable to parse 'trace_level', expected at least one level")
    if OFF in value:
        if len(value) != 1:
            raise invalid_arg("Expect only one trace level 'OFF' is specified")
        return (OFF,)
    for level in value:
        if level not in LEVELS:
            raise invalid_arg(
                f"Unable to parse 'trace_level', unknown level '{level}' "
                "(expected 'OFF', 'TIMESTAMPS' or 'TENSORS')"
            )
    return tuple(level for level in LEVELS if level in value)


def _integer(name: str, text: str, low: int, high: int) -> int:
    try:
        number = int(text.strip())
    except ValueError:
        raise invalid_arg(f"Unable to parse '{name}', got: {text}") from None
    if name == "trace_count" and number < low:
        raise invalid_arg(f"Unable to parse 'trace_count'. Expecting value >= {low}, got:{text}")
    if not low <= number <= high:
        raise invalid_arg(
            f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {text}"
        )
    return number


def from_grpc(settings: Mapping[str, list[str]]) -> dict[str, Any]:
    """The TraceSetting RPC's map (name -> its repeated values) in the JSON form `update`
    takes: no value clears the setting, trace_level keeps its list, the others take their
    one value."""
    changes: dict[str, Any] = {}
    for name, values in settings.items():
        if not values:
            changes[name] = None
        elif name == "trace_level":
            changes[name] = list(values)
        elif name in EXPORTER_NAMES:
            changes[name] = values[0]  # taken, and left as the environment says, as one value
        elif len(values) == 1:
            changes[name] = values[0]
        else:
            raise invalid_arg(f"expect only 1 value for '{name}'")
    return changes
