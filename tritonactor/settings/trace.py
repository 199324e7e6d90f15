"""The initial trace settings that tritonserver's trace flags ask for: `--trace-level`,
`--trace-rate`, `--trace-count`, `--trace-log-frequency` and `--trace-config`, combined as
tritonserver combines them (a `--trace-config` value wins over the older flag)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tritonactor.settings.pairs import GroupSetting, trace_level

# `--trace-config opentelemetry,<setting>`: the OpenTelemetry SDK reads these from variables.
_OTEL_VARIABLES = {
    "url": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "resource": "OTEL_RESOURCE_ATTRIBUTES",
    "bsp_max_queue_size": "OTEL_BSP_MAX_QUEUE_SIZE",
    "bsp_schedule_delay": "OTEL_BSP_SCHEDULE_DELAY",
    "bsp_max_export_batch_size": "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
}
_LEVEL_ORDER = ("TIMESTAMPS", "TENSORS")


@dataclass(frozen=True, slots=True)
class TraceDefaults:
    """The trace settings to start with; None where nothing was given. `notes`: what was given
    that means nothing here, one warning each."""

    level: tuple[str, ...] | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None
    notes: tuple[str, ...] = ()


def trace_defaults(
    levels: Sequence[str],
    rate: int | None,
    count: int | None,
    log_frequency: int | None,
    config: Sequence[GroupSetting],
) -> TraceDefaults:
    """What `--trace-level` (`levels`), `--trace-rate`, `--trace-count`,
    `--trace-log-frequency` and the `--trace-config` entries (checked already) add up to."""
    all_levels = list(levels)
    notes: list[str] = []
    for mode, setting, value in config:
        flag = f"--trace-config {mode + ',' if mode else ''}{setting}={value}"
        if (mode, setting) == ("", "level"):
            all_levels.append(trace_level(value))
        elif (mode, setting) == ("", "rate"):
            rate = int(value)
        elif (mode, setting) == ("", "count"):
            count = int(value)
        elif (mode, setting) == ("triton", "log-frequency"):
            log_frequency = int(value)
        elif (mode, setting) == ("", "mode") and value == "opentelemetry":
            pass  # what tritonactor does anyway
        elif (mode, setting) == ("", "mode"):
            notes.append(f"{flag}: accepted, ignored: tritonactor traces with OpenTelemetry only")
        elif mode == "opentelemetry" and setting in _OTEL_VARIABLES:
            notes.append(
                f"{flag}: accepted, ignored: set {_OTEL_VARIABLES[setting]} instead (the "
                "OpenTelemetry SDK reads it)"
            )
        else:
            notes.append(f"{flag}: accepted, ignored: the setting has no meaning here")
    return TraceDefaults(_level(all_levels), rate, count, log_frequency, tuple(notes))


def _level(levels: Sequence[str]) -> tuple[str, ...] | None:
    """tritonserver adds levels up; an OFF anywhere turns tracing off."""
    if not levels:
        return None
    if "OFF" in levels:
        return ("OFF",)
    return tuple(level for level in _LEVEL_ORDER if level in levels)
