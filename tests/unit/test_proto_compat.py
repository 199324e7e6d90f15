"""Our protos/ are wire-compatible with Triton's: compared, message by message, with the
descriptors that tritonclient ships."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from tritonactor._proto.grpc.health.v1 import HealthCheckResponse
from tritonactor._proto.inference import ModelConfig, ModelInferRequest

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


def file_proto(descriptor: Any) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    descriptor.CopyToProto(proto)
    return proto


def enums(enum_types: Any, prefix: str) -> dict[str, dict[str, int]]:
    return {f"{prefix}{e.name}": {v.name: v.number for v in e.value} for e in enum_types}


def messages(message_types: Any, prefix: str = "") -> dict[str, Any]:
    """name -> fields (number, type, label, type name, oneof) and nested enums, flattened."""
    found: dict[str, Any] = {}
    for message in message_types:
        name = f"{prefix}{message.name}"
        oneofs = [o.name for o in message.oneof_decl]
        found[name] = {
            field.name: (
                field.number,
                field.type,
                field.label,
                field.type_name,
                oneofs[field.oneof_index] if field.HasField("oneof_index") else None,
            )
            for field in message.field
        }
        found.update(enums(message.enum_type, f"{name}."))
        found.update(messages(message.nested_type, f"{name}."))
    return found


def services(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    return {
        f"{service.name}.{method.name}": (
            method.input_type,
            method.output_type,
            method.client_streaming,
            method.server_streaming,
        )
        for service in proto.service
        for method in service.method
    }


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (ModelConfig.DESCRIPTOR.file, model_config_pb2.DESCRIPTOR),
        (ModelInferRequest.DESCRIPTOR.file, service_pb2.DESCRIPTOR),
    ],
    ids=["model_config.proto", "grpc_service.proto"],
)
def test_same_messages_fields_enums_and_rpcs(ours: Any, theirs: Any) -> None:
    mine, reference = file_proto(ours), file_proto(theirs)
    assert mine.package == reference.package == "inference"
    assert messages(mine.message_type) == messages(reference.message_type)
    assert enums(mine.enum_type, "") == enums(reference.enum_type, "")
    assert services(mine) == services(reference)
    assert len(messages(mine.message_type)) > 20  # the comparison saw real content


def test_health_service_matches_the_standard() -> None:
    proto = file_proto(HealthCheckResponse.DESCRIPTOR.file)
    assert proto.package == "grpc.health.v1"
    assert services(proto) == {
        "Health.Check": (
            ".grpc.health.v1.HealthCheckRequest",
            ".grpc.health.v1.HealthCheckResponse",
            False,
            False,
        ),
        "Health.Watch": (
            ".grpc.health.v1.HealthCheckRequest",
            ".grpc.health.v1.HealthCheckResponse",
            False,
            True,
        ),
    }
    status = messages(proto.message_type)["HealthCheckResponse.ServingStatus"]
    assert status == {"UNKNOWN": 0, "SERVING": 1, "NOT_SERVING": 2, "SERVICE_UNKNOWN": 3}
