"""`config.pbtxt` and JSON <-> the `ModelConfig` message.

The in-memory config is the betterproto2 `ModelConfig` (typed attributes). Text format and JSON go
through protobuf's own parsers, on the protobuf class built from the same descriptor; the two
meet in the binary wire format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, message_factory, text_format
from google.protobuf.message import Message

from tritonactor._proto.inference import DataType, ModelConfig

__all__ = ["ConfigError", "ModelConfig", "config_from_json", "config_to_json", "parse_pbtxt"]

_PROTOBUF_CLASS: type[Message] = message_factory.GetMessageClass(ModelConfig.DESCRIPTOR)


class ConfigError(ValueError):
    """A model configuration that cannot be used; the message names the file and place."""


def parse_pbtxt(text: str, source: str = "config.pbtxt") -> ModelConfig:
    """Parse protobuf text format into a ModelConfig; errors carry `source:line:column`."""
    message = _PROTOBUF_CLASS()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        where = f"{source}:{line}:{column}" if line is not None else source
        raise ConfigError(f"{where}: {_bare_parse_message(exc)}") from None
    return ModelConfig.parse(message.SerializeToString())


def read_pbtxt(path: Path) -> ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_pbtxt(text, str(path))


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """The config as Triton's `/config` answers it: proto field names, enums by name, every field
    present, 64-bit integers as JSON numbers."""
    message = _PROTOBUF_CLASS.FromString(bytes(config))
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return _int64_strings_to_numbers(data, _PROTOBUF_CLASS.DESCRIPTOR)


def config_from_json(data: dict[str, Any] | str | bytes) -> ModelConfig:
    """A ModelConfig from Triton's JSON form (as `/config` answers, or a load override)."""
    message = _PROTOBUF_CLASS()
    try:
        if isinstance(data, (str, bytes)):
            json_format.Parse(data, message)
        else:
            json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        # protobuf ends some of its messages with two full stops ("at ModelConfig.input[0]..")
        reason = str(exc).rstrip(".")
        raise ConfigError(f"invalid model config JSON: {reason}") from None
    return ModelConfig.parse(message.SerializeToString())


def datatype_name(value: DataType | int) -> str:
    """`DataType.TYPE_INT32` -> "TYPE_INT32"."""
    return DataType(value).name


def _bare_parse_message(exc: text_format.ParseError) -> str:
    # protobuf prefixes the message with "line:column : "; we print our own prefix.
    text = str(exc)
    head, sep, rest = text.partition(" : ")
    return rest if sep and ":" in head else text


_INT64_TYPES = frozenset({3, 4, 6, 16, 18})  # int64, uint64, fixed64, sfixed64, sint64
# The 64-bit fields Triton's config JSON leaves as proto3 JSON writes them, strings: it turns
# the others into numbers, field by field (its ModelConfigToJson), and not these.
_INT64_KEPT_AS_STRINGS = frozenset(
    {
        "inference.ModelInstanceGroup.SecondaryDevice.device_id",
        "inference.ModelOptimizationPolicy.Cuda.GraphSpec.Shape.dim",
    }
)


def _int64_strings_to_numbers(value: Any, descriptor: Any) -> Any:
    # Proto3 JSON writes 64-bit integers as strings; Triton's config JSON uses numbers.
    if not isinstance(value, dict):
        return value
    fields = descriptor.fields_by_name
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.message_type is not None:
                    for map_key, map_item in item.items():
                        item[map_key] = _int64_strings_to_numbers(
                            map_item, value_field.message_type
                        )
                elif value_field.type in _INT64_TYPES:
                    value[key] = {k: int(v) for k, v in item.items()}
            elif isinstance(item, list):
                value[key] = [_int64_strings_to_numbers(v, field.message_type) for v in item]
            else:
                value[key] = _int64_strings_to_numbers(item, field.message_type)
        elif field.type in _INT64_TYPES and field.full_name not in _INT64_KEPT_AS_STRINGS:
            value[key] = [int(v) for v in item] if isinstance(item, list) else int(item)
    return value
