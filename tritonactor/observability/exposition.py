"""The Prometheus text format, written as Triton writes it.

prometheus_client's `generate_latest` names every counter family `<name>_total` in its TYPE
line, which Triton's counters (`nv_inference_request_success`, ...) do not have: a scraper
would see a family with no samples beside samples of an untyped one. Here a family's TYPE line
takes the name its samples carry, so Triton's counters keep their names and ours (which end in
`_total`, as Prometheus advises) keep theirs. A value is written as Triton's Prometheus library
writes it (16 significant digits, the shortest form): a count as `4`, not Python's `4.0`."""

from __future__ import annotations

import math

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = CONTENT_TYPE_LATEST


def render(registry: Collector) -> bytes:
    """Every family `registry` collects, in the text format."""
    lines: list[str] = []
    for family in registry.collect():
        name = family.name
        kind = family.type
        if kind == "counter" and family.samples:
            name = family.samples[0].name
        elif kind == "unknown":
            kind = "untyped"
        if family.documentation:  # (none without one, as Triton writes it)
            lines.append(f"# HELP {name} {_escape_help(family.documentation)}\n")
        lines.append(f"# TYPE {name} {kind}\n")
        created = f"{family.name}_created"  # prometheus_client's (a model's family may end so)
        for sample in family.samples:
            if sample.name == created:
                continue  # OpenMetrics only; the classic format has no place for it
            labels = ",".join(
                f'{key}="{_escape_label(value)}"' for key, value in sorted(sample.labels.items())
            )
            selector = f"{{{labels}}}" if labels else ""
            lines.append(f"{sample.name}{selector} {_value(sample.value)}\n")
    text = "".join(lines)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate a model put in a label: not the whole scrape
        return text.encode("utf-8", "replace")


def _value(value: float) -> str:
    """`value` as Triton writes a sample's (prometheus-cpp: C++'s default float format at 16
    significant digits, as `%.16g`): `120`, `25276182528`, `0.25`; NaN and the infinities as
    Prometheus spells them."""
    if math.isfinite(value):
        return format(value, ".16g")
    return floatToGoString(value)


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
