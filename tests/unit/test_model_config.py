"""config.pbtxt and JSON <-> ModelConfig through protobuf's own parsers."""

from __future__ import annotations

import pytest

from tritonactor._proto.inference import DataType
from tritonactor.config.model_config import (
    ConfigError,
    config_from_json,
    config_to_json,
    parse_pbtxt,
)

TEXT = """
name: "m"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
dynamic_batching {
  max_queue_delay_microseconds: 100
  priority_queue_policy { key: 2 value { max_queue_size: 3 } }
}
parameters { key: "k" value { string_value: "v" } }
"""


def test_text_format_fields() -> None:
    config = parse_pbtxt(TEXT)
    assert config.max_batch_size == 8
    assert config.input[0].data_type == DataType.TYPE_FP32
    assert config.input[0].dims == [-1, 3]
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.priority_queue_policy[2].max_queue_size == 3
    assert config.parameters["k"].string_value == "v"


def test_json_uses_numbers_for_64_bit_integers_and_round_trips() -> None:
    config = parse_pbtxt(TEXT)
    data = config_to_json(config)
    assert data["input"][0]["dims"] == [-1, 3]
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert config_from_json(data) == config


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ('name: "m"\nmax_batch_size: "x"', "cfg.pbtxt:2:17", "Couldn't parse integer"),
        ('name: "m"\n  nonsense: 1', "cfg.pbtxt:2:3", 'no field named "nonsense"'),
        ('name: "m"\ninput [ { name: "a" ', "cfg.pbtxt:2:", "Expected"),
    ],
)
def test_parse_errors_name_file_line_and_column(text: str, where: str, what: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pbtxt(text, "cfg.pbtxt")
    assert str(caught.value).startswith(where)
    assert what in str(caught.value)


def test_bad_json_override_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid model config JSON"):
        config_from_json({"max_batch_size": "lots"})
    with pytest.raises(ConfigError) as caught:
        config_from_json({"name": "m", "input": [{"name": "a", "data_type": "type_fp32"}]})
    assert str(caught.value).endswith("at ModelConfig.input[0].data_type")  # not "type.."


def test_the_64_bit_fields_triton_leaves_as_strings() -> None:
    """Triton's config JSON turns its 64-bit fields into numbers one by one, and not these two
    (a secondary device's id was "0" on Triton 2.51's /config)."""
    config = config_to_json(
        parse_pbtxt(
            'name: "m" input [ { name: "a" dims: [ 4 ] } ] instance_group [ { kind: KIND_CPU '
            "secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ] } ] optimization { cuda { "
            'graph_spec [ { batch_size: 1 input { key: "a" value: { dim: [ 2, 3 ] } } } ] } }'
        )
    )
    assert config["input"][0]["dims"] == [4]
    assert config["instance_group"][0]["secondary_devices"][0]["device_id"] == "0"
    assert config["optimization"]["cuda"]["graph_spec"][0]["input"]["a"]["dim"] == ["2", "3"]
