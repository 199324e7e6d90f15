"""Triton's config defaults and the instances an instance_group implies."""

from __future__ import annotations

import pytest

from tritonactor.config.model_config import ConfigError, parse_pbtxt
from tritonactor.config.normalize import fill_defaults, instance_specs
from tritonactor.config.validate import validate_config


def test_defaults_without_gpus() -> None:
    config = fill_defaults(parse_pbtxt('name: "m"'), gpus=0)
    assert config.version_policy is not None and config.version_policy.latest is not None
    assert config.version_policy.latest.num_versions == 1
    specs = instance_specs(config)
    # Triton names the group it adds after the model, its instances after the group.
    assert [(s.name, s.group, s.kind, s.device_id) for s in specs] == [("m_0", "m", "KIND_CPU", 0)]


def test_counts_and_kinds() -> None:
    config = fill_defaults(
        parse_pbtxt(
            'name: "m" instance_group [ { count: 3 kind: KIND_CPU }, '
            '{ name: "g" count: 2 kind: KIND_GPU gpus: [0, 1] } ]'
        ),
        gpus=2,
    )
    specs = instance_specs(config)
    assert [s.name for s in specs] == ["m_0_0", "m_0_1", "m_0_2", "g_0", "g_1", "g_2", "g_3"]
    assert [s.device_id for s in specs if s.kind == "KIND_GPU"] == [0, 0, 1, 1]


def test_auto_kind_prefers_gpu_when_present() -> None:
    config = fill_defaults(parse_pbtxt('name: "m"'), gpus=1)
    assert [s.kind for s in instance_specs(config)] == ["KIND_GPU"]


def test_gpu_group_without_gpus_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="KIND_GPU but no GPUs are available"):
        fill_defaults(parse_pbtxt('name: "m" instance_group [ { kind: KIND_GPU } ]'), gpus=0)
    with pytest.raises(ConfigError, match="invalid or unsupported gpu id 3"):
        fill_defaults(parse_pbtxt('name: "m" instance_group [ { kind: KIND_GPU gpus: 3 } ]'), 1)


def test_triton_counts_two_cpu_instances_for_onnx_runtime() -> None:
    onnx = fill_defaults(parse_pbtxt('name: "m"'), gpus=0, backend="onnxruntime")
    assert [s.name for s in instance_specs(onnx)] == ["m_0", "m_1"]
    given = 'name: "m" instance_group [ { count: 1 } ]'
    assert len(instance_specs(fill_defaults(parse_pbtxt(given), 0, "onnxruntime"))) == 1
    assert len(instance_specs(fill_defaults(parse_pbtxt('name: "m"'), 1, "onnxruntime"))) == 1


def test_the_batchers_and_pinned_memory_defaults_are_tritons() -> None:
    config = fill_defaults(
        parse_pbtxt(
            'name: "m" max_batch_size: 8 dynamic_batching { } optimization { graph { level: 1 } }'
        ),
        gpus=0,
    )
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.preferred_batch_size == [8]
    assert config.optimization is not None and config.optimization.graph is not None
    assert config.optimization.input_pinned_memory is not None
    assert config.optimization.input_pinned_memory.enable
    sequence = fill_defaults(
        parse_pbtxt('name: "s" max_batch_size: 4 sequence_batching { oldest { } }'), gpus=0
    ).sequence_batching
    assert sequence is not None and sequence.oldest is not None
    assert sequence.max_sequence_idle_microseconds == 1_000_000
    assert sequence.oldest.preferred_batch_size == [4]
    unbatched = fill_defaults(parse_pbtxt('name: "u" dynamic_batching { }'), gpus=0)
    assert unbatched.dynamic_batching is not None
    assert unbatched.dynamic_batching.preferred_batch_size == []


def test_fill_defaults_leaves_its_input_alone() -> None:
    original = parse_pbtxt('name: "m"')
    fill_defaults(original, gpus=0)
    assert original.instance_group == [] and original.version_policy is None


def test_the_platform_of_a_named_backend_is_filled_in_as_triton_does() -> None:
    """So that the checks of TensorRT-only fields see a TensorRT model as one, strict or not."""
    for backend, platform in (
        ("tensorrt", "tensorrt_plan"),
        ("onnxruntime", "onnxruntime_onnx"),
        ("pytorch", "pytorch_libtorch"),
        ("python", ""),
    ):
        assert fill_defaults(parse_pbtxt('name: "m"'), 0, backend).platform == platform
    shape = (
        'name: "s" backend: "tensorrt" input [ { name: "S" data_type: TYPE_INT32 dims: [ 2 ] '
        'is_shape_tensor: true } ] output [ { name: "O" data_type: TYPE_INT32 dims: [ 2 ] } ]'
    )
    validate_config(fill_defaults(parse_pbtxt(shape), 1, "tensorrt"))
