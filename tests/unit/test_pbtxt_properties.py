"""Properties of the model-configuration loader (tritonactor/config/model_config.py): generated
`config.pbtxt` texts load as what they say, survive the trip through the text and JSON forms,
and any other text or JSON is refused with ConfigError, the loader's documented error."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonactor._proto.inference import ModelConfig
from tritonactor.config.model_config import (
    _PROTOBUF_CLASS,
    ConfigError,
    config_from_json,
    config_to_json,
    parse_pbtxt,
    read_pbtxt,
)

BOUNDED = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,12}", fullmatch=True)
config_types = st.sampled_from(
    ["TYPE_BOOL", "TYPE_UINT8", "TYPE_INT8", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16",
     "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"]
)  # fmt: skip
dims = st.lists(st.integers(-1, 1 << 40), min_size=1, max_size=4)
# Text the writer may put between tokens: spaces, newlines and comments.
gaps = st.sampled_from([" ", "\n", "  ", "\n  # a comment\n", "\t"])


def _string(value: str) -> str:
    """`value` quoted as protobuf's text format reads it back."""
    escaped = "".join(
        f"\\x{ord(c):02x}" if ord(c) < 0x20 else "\\" + c if c in '\\"' else c for c in value
    )
    return f'"{escaped}"'


@st.composite
def tensor_text(draw: st.DrawFn, name: str) -> tuple[str, dict[str, Any]]:
    datatype, shape = draw(config_types), draw(dims)
    gap = draw(gaps)
    text = (
        f"{{{gap}name: {_string(name)}{gap}data_type: {datatype}{gap}"
        f"dims: [ {', '.join(map(str, shape))} ]{gap}}}"
    )
    return text, {"name": name, "data_type": datatype, "dims": shape}


@st.composite
def configs(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A config.pbtxt text and what it says."""
    gap = draw(gaps)
    name = draw(names)
    backend = draw(st.sampled_from(["python", "onnxruntime", "pytorch", "identity"]))
    batch = draw(st.integers(0, 1 << 20))
    io_names = draw(st.lists(names, min_size=2, max_size=6, unique=True))
    split = draw(st.integers(1, len(io_names) - 1))
    inputs = [draw(tensor_text(n)) for n in io_names[:split]]
    outputs = [draw(tensor_text(n)) for n in io_names[split:]]
    count = draw(st.integers(1, 8))
    params = draw(st.dictionaries(names, st.text(max_size=10), max_size=3))
    parts = [
        f"name: {_string(name)}",
        f"backend: {_string(backend)}",
        f"max_batch_size: {batch}",
        f"input [{gap}{f',{gap}'.join(t for t, _ in inputs)}{gap}]",
        f"output [{gap}{f',{gap}'.join(t for t, _ in outputs)}{gap}]",
        f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]",
        *(
            f"parameters {{ key: {_string(k)} value: {{ string_value: {_string(v)} }} }}"
            for k, v in params.items()
        ),
    ]
    if draw(st.booleans()):
        delay = draw(st.integers(0, 1 << 30))
        parts.append(f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}")
    text = gap.join(parts) + "\n"
    expected = {
        "name": name,
        "backend": backend,
        "max_batch_size": batch,
        "input": [e for _, e in inputs],
        "output": [e for _, e in outputs],
        "count": count,
        "parameters": params,
    }
    return text, expected


def _text(config: ModelConfig) -> str:
    return text_format.MessageToString(_PROTOBUF_CLASS.FromString(bytes(config)))


@BOUNDED
@given(configs())
def test_generated_config_loads_as_written(case: tuple[str, dict[str, Any]]) -> None:
    text, expected = case
    config = parse_pbtxt(text)
    assert config.name == expected["name"]
    assert config.backend == expected["backend"]
    assert config.max_batch_size == expected["max_batch_size"]
    for got, want in ((config.input, expected["input"]), (config.output, expected["output"])):
        assert [(t.name, t.data_type.name, list(t.dims)) for t in got] == [
            (w["name"], w["data_type"], w["dims"]) for w in want
        ]
    assert [g.count for g in config.instance_group] == [expected["count"]]
    assert {k: v.string_value for k, v in config.parameters.items()} == expected["parameters"]


@BOUNDED
@given(configs())
def test_text_and_json_forms_round_trip(case: tuple[str, dict[str, Any]]) -> None:
    config = parse_pbtxt(case[0])
    assert parse_pbtxt(_text(config)) == config
    as_json = config_to_json(config)
    assert config_from_json(as_json) == config
    assert config_from_json(json.dumps(as_json)) == config


@BOUNDED
@given(st.text(max_size=200))
def test_any_text_loads_or_is_refused(text: str) -> None:
    with contextlib.suppress(ConfigError):
        parse_pbtxt(text)


@BOUNDED
@given(configs(), st.integers(0, 400), st.text(min_size=1, max_size=5))
def test_damaged_config_loads_or_is_refused_with_its_place(
    case: tuple[str, dict[str, Any]], at: int, junk: str
) -> None:
    text = case[0]
    at = min(at, len(text))
    try:
        parse_pbtxt(text[:at] + junk + text[at:], "m/config.pbtxt")
    except ConfigError as error:
        assert str(error).startswith("m/config.pbtxt")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
config_keys = st.sampled_from(
    ["name", "backend", "max_batch_size", "input", "output", "instance_group", "parameters",
     "dynamic_batching", "version_policy", "sequence_batching", "nosuch"]
)  # fmt: skip


@BOUNDED
@given(st.dictionaries(config_keys, json_values, max_size=5) | json_values)
def test_any_json_loads_or_is_refused(document: Any) -> None:
    with contextlib.suppress(ConfigError):
        config_from_json(json.dumps(document))
    if isinstance(document, dict):
        with contextlib.suppress(ConfigError):
            config_from_json(document)


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=100))
def test_any_file_loads_or_is_refused(tmp_path_factory: Any, data: bytes) -> None:
    path = Path(tmp_path_factory.mktemp("pbtxt")) / "config.pbtxt"
    path.write_bytes(data)
    with contextlib.suppress(ConfigError):
        read_pbtxt(path)
