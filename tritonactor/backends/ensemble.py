"""Triton ensembles (`platform: "ensemble"`): a DAG of steps, each a request to another model.

The backend only checks the DAG at load time; the ensemble has no instances. Its requests are
run by `scheduling.ensemble.EnsembleScheduler`, which sends each step through the router."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
)
from tritonactor.core.errors import internal, invalid_arg


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step: `inputs` maps the model's input names to ensemble tensors, `outputs` maps the
    model's output names to ensemble tensors."""

    index: int
    model_name: str
    model_version: str  # "" = the model's version policy decides (Triton's -1)
    inputs: dict[str, str]
    outputs: dict[str, str]


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[EnsembleStep, ...]

    @property
    def models(self) -> list[str]:
        return sorted({step.model_name for step in self.steps})


def plan_ensemble(config: ModelConfig) -> EnsemblePlan:
    """The ensemble's steps, after checking that the DAG makes sense: every step names a model;
    no tensor is produced twice (an ensemble input counts as produced); every tensor a step
    reads is an ensemble input or some step's output; every ensemble input is read and every
    ensemble output produced; and no step depends on itself through others (no cycle).
    Raises INVALID_ARG with the reason otherwise."""
    name = config.name
    scheduling = config.ensemble_scheduling
    if scheduling is None or not scheduling.step:
        raise invalid_arg(f"ensemble '{name}' must have at least one step")
    inputs = tuple(tensor.name for tensor in config.input)
    outputs = tuple(tensor.name for tensor in config.output)
    steps: list[EnsembleStep] = []
    producer: dict[str, str] = {tensor: "the ensemble's inputs" for tensor in inputs}
    for index, step in enumerate(scheduling.step):
        if not step.model_name:
            raise invalid_arg(f"ensemble '{name}': step {index} names no model")
        version = str(step.model_version) if step.model_version > 0 else ""
        where = f"step {index} (model '{step.model_name}')"
        for tensor in step.output_map.values():
            if tensor in producer:
                raise invalid_arg(
                    f"ensemble '{name}': tensor '{tensor}' is produced by both "
                    f"{producer[tensor]} and {where}"
                )
            producer[tensor] = where
        steps.append(
            EnsembleStep(
                index, step.model_name, version, dict(step.input_map), dict(step.output_map)
            )
        )
    consumed = {tensor for step in steps for tensor in step.inputs.values()}
    for step in steps:
        for tensor in step.inputs.values():
            if tensor not in producer:
                raise invalid_arg(
                    f"ensemble '{name}': tensor '{tensor}' read by step {step.index} "
                    f"(model '{step.model_name}') is neither an ensemble input nor any step's "
                    "output"
                )
    for tensor in inputs:
        if tensor not in consumed:
            raise invalid_arg(f"ensemble '{name}': input '{tensor}' is not read by any step")
    for tensor in outputs:
        if tensor not in producer or tensor in inputs:
            raise invalid_arg(f"ensemble '{name}': output '{tensor}' is not produced by any step")
    _check_acyclic(name, steps, set(inputs))
    return EnsemblePlan(name, inputs, outputs, tuple(steps))


def _check_acyclic(name: str, steps: list[EnsembleStep], available: set[str]) -> None:
    """Every step can run once the ensemble inputs are there: else some steps wait on each
    other (a cycle)."""
    pending = list(steps)
    while pending:
        ready = [s for s in pending if all(t in available for t in s.inputs.values())]
        if not ready:
            models = ", ".join(f"'{s.model_name}'" for s in pending)
            raise invalid_arg(f"ensemble '{name}' has a cycle among the steps of models {models}")
        for step in ready:
            available.update(step.outputs.values())
            pending.remove(step)


class EnsembleModel(BackendModel):
    def __init__(self, plan: EnsemblePlan) -> None:
        self.plan = plan

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        raise internal(f"ensemble '{self.plan.name}' has no instances")


class EnsembleBackend(Backend):
    name = "ensemble"
    platforms = ("ensemble",)
    default_model_filename = ""

    def load_model(self, context: ModelContext) -> BackendModel:
        plan = plan_ensemble(context.config)
        _check_models_exist(plan, context.model_dir.parent)
        return EnsembleModel(plan)


def _check_models_exist(plan: EnsemblePlan, repository: Path) -> None:
    """Each step's model must be a folder of the ensemble's own repository. (Whether it loaded
    is known only when a request reaches it: the models of a repository load concurrently.)"""
    for model in plan.models:
        if not (repository / model).is_dir():
            raise invalid_arg(
                f"ensemble '{plan.name}': step model '{model}' is not in the model repository "
                f"'{repository}'"
            )
