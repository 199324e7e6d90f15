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


def fill_defaults(config: ModelConfig, gpus: int) -> ModelConfig:
    """A copy of `config` with Triton's defaults: a version policy, the optimization defaults,
    and instance groups with names, counts, kinds (KIND_AUTO resolved) and GPU lists (an
    ensemble gets only the version policy)."""
    filled = ModelConfig.parse(bytes(config))
    if filled.version_policy is None:
        filled.version_policy = ModelVersionPolicy(latest=ModelVersionPolicyLatest(num_versions=1))
    if filled.ensemble_scheduling is not None:
        return filled  # no instances, nothing to optimize: Triton fills neither in
    if filled.optimization is None:
        pinned = ModelOptimizationPolicyPinnedMemoryBuffer(enable=True)
        filled.optimization = ModelOptimizationPolicy(
            input_pinned_memory=pinned, output_pinned_memory=pinned
        )
    if not filled.instance_group:
        filled.instance_group = [ModelInstanceGroup()]
    for index, group in enumerate(filled.instance_group):
        if not group.name:
            group.name = f"{filled.name}_{index}"
        if group.count < 1:
            group.count = 1
        if group.kind == ModelInstanceGroupKind.AUTO:
            group.kind = ModelInstanceGroupKind.GPU if gpus else ModelInstanceGroupKind.CPU
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
                specs.append(InstanceSpec(f"{group.name}_{index}", group.name, kind, device, index))
                index += 1
    return specs
