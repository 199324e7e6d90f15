"""The defaults Triton fills into a model config before serving it, and the instances it implies."""

from __future__ import annotations

from dataclasses import dataclass

from tritonactor._proto.inference import (
    ModelConfig,
    ModelInstanceGroup,
    ModelInstanceGroupKind,
    ModelOptimizationPolicy,
    ModelOptimizationPolicyPinnedMemoryBuffer,
    ModelVersionPolicy,
    ModelVersionPolicyLatest,
)
from tritonactor.config.model_config import ConfigError


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    name: str
    group: str
    kind: str  # "KIND_CPU" | "KIND_GPU" | "KIND_MODEL"
    device_id: int
    index: int
    # A passive group's instance (`passive: true`): created, initialized and warmed up, but
    # given no requests, as in Triton.
    passive: bool = False


# Backends whose CPU groups get two instances when the config gives no count (Triton's
# default_cpu_instance_count); the others get one.
TWO_CPU_INSTANCES = frozenset({"onnxruntime", "tensorflow"})
SEQUENCE_IDLE_DEFAULT_US = 1_000_000  # Triton's max_sequence_idle_microseconds default
# The platforms of Triton's own backends, and their backend (the one table: the registry
# serves those it has, validate.py refuses a platform named with another of these backends).
PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}
# The platform Triton writes into a config that names one of these backends and no platform
# (TensorFlow's it reads from the model's files; tritonactor serves no TensorFlow).
BACKEND_PLATFORMS = {
    backend: platform for platform, backend in PLATFORM_BACKENDS.items() if backend != "tensorflow"
}


def fill_defaults(config: ModelConfig, gpus: int, backend: str = "") -> ModelConfig:
    """A copy of `config` with Triton's defaults: the platform of `backend` where it has one
    (ONNX Runtime, TensorRT, PyTorch) and the config none, a version policy, the batchers' preferred
    sizes (`max_batch_size`) and the sequence batcher's idle time, the pinned-memory
    optimization defaults, and instance groups with names, counts (by `backend`), kinds
    (KIND_AUTO resolved) and GPU lists (an ensemble gets only the version policy)."""
    filled = ModelConfig.parse(bytes(config))
    if not filled.platform and backend in BACKEND_PLATFORMS:
        filled.platform = BACKEND_PLATFORMS[backend]
    if filled.version_policy is None:
        filled.version_policy = ModelVersionPolicy(latest=ModelVersionPolicyLatest(num_versions=1))
    batch = [filled.max_batch_size] if filled.max_batch_size > 0 else []
    if filled.dynamic_batching is not None and not filled.dynamic_batching.preferred_batch_size:
        filled.dynamic_batching.preferred_batch_size = list(batch)
    sequence = filled.sequence_batching
    if sequence is not None:
        if not sequence.max_sequence_idle_microseconds:
            sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if sequence.oldest is not None and not sequence.oldest.preferred_batch_size:
            sequence.oldest.preferred_batch_size = list(batch)
    if filled.ensemble_scheduling is not None:
        return filled  # no instances, nothing to optimize: Triton fills neither in
    optimization = filled.optimization = filled.optimization or ModelOptimizationPolicy()
    if optimization.input_pinned_memory is None:
        optimization.input_pinned_memory = ModelOptimizationPolicyPinnedMemoryBuffer(enable=True)
    if optimization.output_pinned_memory is None:
        optimization.output_pinned_memory = ModelOptimizationPolicyPinnedMemoryBuffer(enable=True)
    if not filled.instance_group:
        filled.instance_group = [ModelInstanceGroup(name=filled.name)]
    for index, group in enumerate(filled.instance_group):
        if not group.name:
            group.name = f"{filled.name}_{index}"
        if group.kind == ModelInstanceGroupKind.AUTO:
            group.kind = ModelInstanceGroupKind.GPU if gpus else ModelInstanceGroupKind.CPU
        if group.count < 1:
            cpu = group.kind == ModelInstanceGroupKind.CPU
            group.count = 2 if cpu and backend in TWO_CPU_INSTANCES else 1
        if group.kind == ModelInstanceGroupKind.GPU and not group.gpus:
            group.gpus = list(range(gpus))
        if group.kind == ModelInstanceGroupKind.GPU and not group.gpus:
            raise ConfigError(
                f"instance group {group.name} of model {filled.name} has kind KIND_GPU "
                "but no GPUs are available"
            )
        unknown = [g for g in group.gpus if g >= gpus or g < 0]
        if group.kind == ModelInstanceGroupKind.GPU and unknown:
            raise ConfigError(
                f"instance group {group.name} of model {filled.name} specifies invalid or "
                f"unsupported gpu id {unknown[0]}; {gpus} GPU(s) are visible"
            )
    return filled


def instance_specs(config: ModelConfig) -> list[InstanceSpec]:
    """Every instance the (filled) config asks for: `count` per GPU for KIND_GPU groups. An
    ensemble has none: its scheduler sends each step to the step's model."""
    if config.ensemble_scheduling is not None:
        return []
    specs: list[InstanceSpec] = []
    for group in config.instance_group:
        kind = f"KIND_{ModelInstanceGroupKind(group.kind).name}"
        devices = group.gpus if group.kind == ModelInstanceGroupKind.GPU else [0]
        index = 0
        for device in devices:
            for _ in range(group.count):
                name = f"{group.name}_{index}"
                specs.append(InstanceSpec(name, group.name, kind, device, index, group.passive))
                index += 1
    return specs
