"""Triton ensembles (`platform: "ensemble"`): a DAG of steps, each a request to another model.

What can be checked from the ensemble's config alone is checked at load (`plan_ensemble`); what
needs its step models' configs (`check_steps`, `plan_flow`) once they are loaded. The ensemble
has no instances: `scheduling.ensemble.EnsembleScheduler` runs its requests through the router."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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
    # At most this many requests in flight at each step, over all the ensemble's requests
    # (0: no limit).
    max_inflight_requests: int = 0

    @property
    def models(self) -> list[str]:
        return sorted({step.model_name for step in self.steps})


def plan_ensemble(config: ModelConfig) -> EnsemblePlan:
    """The ensemble's steps, after checking that the DAG makes sense: every step names a model
    (not the ensemble itself); no tensor is produced twice (an ensemble input counts as
    produced); every tensor a step reads is an ensemble input or some step's output; every
    ensemble input is read and every ensemble output produced; and no step depends on itself
    through others (no cycle).
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
        if step.model_name == name:
            raise invalid_arg(f"ensemble '{name}': step {index} names the ensemble itself")
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
    _in_dependency_order(name, steps, set(inputs))
    return EnsemblePlan(name, inputs, outputs, tuple(steps), scheduling.max_inflight_requests)


def needed_steps(plan: EnsemblePlan, outputs: Iterable[str]) -> frozenset[int]:
    """The indices of the steps a request for `outputs` needs: those producing them, and those
    producing what they read, and so on. The others are pruned: they never run for it (as in
    Triton, which runs only the steps leading to the requested outputs)."""
    producer = {tensor: step for step in plan.steps for tensor in step.outputs.values()}
    wanted = list(outputs)
    needed: set[int] = set()
    while wanted:
        step = producer.get(wanted.pop())
        if step is None or step.index in needed:
            continue  # an ensemble input, or a step already counted
        needed.add(step.index)
        wanted.extend(step.inputs.values())
    return frozenset(needed)


def _in_dependency_order(
    name: str, steps: Sequence[EnsembleStep], available: set[str]
) -> list[EnsembleStep]:
    """The steps, each after those it reads from. None can be placed once the others wait on
    each other: a cycle."""
    ordered: list[EnsembleStep] = []
    pending = list(steps)
    while pending:
        ready = [s for s in pending if all(t in available for t in s.inputs.values())]
        if not ready:
            models = ", ".join(f"'{s.model_name}'" for s in pending)
            raise invalid_arg(f"ensemble '{name}' has a cycle among the steps of models {models}")
        for step in ready:
            available.update(step.outputs.values())
            pending.remove(step)
        ordered.extend(ready)
    return ordered


# -- against the step models ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _TensorSpec:
    """What one side (the ensemble, or a step's model) says an ensemble tensor is."""

    data_type: str
    dims: tuple[int, ...]
    batching: bool
    origin: str

    @property
    def full_dims(self) -> tuple[int, ...]:
        return (-1, *self.dims) if self.batching else self.dims


def check_steps(
    ensemble: ModelConfig, plan: EnsemblePlan, steps: Mapping[int, ModelConfig]
) -> None:
    """Check the steps against their models' configs (`steps`: by step index; a step left out
    is not checked): each mapped input and output exists in the model; every input of the model
    that is not optional is mapped; an ensemble tensor has one data type and compatible shapes
    everywhere it appears (-1 matches any size; a batching model's shape counts its batch
    dimension when compared with a non-batching one's); and no step model allows a smaller
    batch than the ensemble. Raises INVALID_ARG with the reason."""
    name = plan.name
    batching = ensemble.max_batch_size > 0
    specs: dict[str, _TensorSpec] = {}

    def declare(tensor: str, spec: _TensorSpec) -> None:
        known = specs.setdefault(tensor, spec)
        if known.data_type != spec.data_type:
            raise invalid_arg(
                f"in ensemble '{name}', ensemble tensor '{tensor}' has inconsistent data types: "
                f"{known.data_type} from {known.origin}, {spec.data_type} from {spec.origin}"
            )
        if not _same_shape(known.dims, spec.dims) and not _same_shape(
            known.full_dims, spec.full_dims
        ):
            raise invalid_arg(
                f"in ensemble '{name}', ensemble tensor '{tensor}' has inconsistent shapes: "
                f"{list(known.full_dims)} from {known.origin}, {list(spec.full_dims)} from "
                f"{spec.origin}"
            )

    origin = f"ensemble '{name}'"
    for tensor in (*ensemble.input, *ensemble.output):
        dims = tensor.reshape.shape if tensor.reshape is not None else tensor.dims
        declare(tensor.name, _TensorSpec(tensor.data_type.name, tuple(dims), batching, origin))
    for step in plan.steps:
        config = steps.get(step.index)
        if config is None:
            continue
        model = f"model '{step.model_name}'"
        if 0 < config.max_batch_size < ensemble.max_batch_size:
            raise invalid_arg(
                f"ensemble '{name}' allows maximum batch size {ensemble.max_batch_size}, but its "
                f"step {model} only allows {config.max_batch_size}"
            )
        step_batching = config.max_batch_size > 0
        model_inputs = {tensor.name: tensor for tensor in config.input}
        for model_input, tensor in step.inputs.items():
            if model_input not in model_inputs:
                raise invalid_arg(
                    f"in ensemble '{name}', step {step.index} maps ensemble tensor '{tensor}' to "
                    f"input '{model_input}', which {model} does not have"
                )
            spec = model_inputs[model_input]
            declare(
                tensor,
                _TensorSpec(spec.data_type.name, tuple(spec.dims), step_batching, model),
            )
        for model_input in model_inputs.values():
            if model_input.name not in step.inputs and not model_input.optional:
                raise invalid_arg(
                    f"in ensemble '{name}', input '{model_input.name}' of {model} is not mapped "
                    "to any ensemble tensor"
                )
        model_outputs = {tensor.name: tensor for tensor in config.output}
        for model_output, tensor in step.outputs.items():
            if model_output not in model_outputs:
                raise invalid_arg(
                    f"in ensemble '{name}', step {step.index} maps output '{model_output}', "
                    f"which {model} does not have, to ensemble tensor '{tensor}'"
                )
            spec = model_outputs[model_output]
            declare(
                tensor,
                _TensorSpec(spec.data_type.name, tuple(spec.dims), step_batching, model),
            )


def _same_shape(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


@dataclass(frozen=True, slots=True)
class EnsembleFlow:
    """How often each step runs. A decoupled step answers a request with any number of
    responses: it opens a new *stream*, and the steps that read its outputs run once per
    response of it. Stream 0 is the ensemble's request itself: its steps run once.

    `stream_of[i]`: the stream step i runs in (that of all the tensors it reads);
    `opens[i]`: the stream its outputs belong to (a new one when step i is decoupled, else its
    own); `output_stream`: that of the ensemble's outputs, one response per item of it."""

    stream_of: tuple[int, ...]
    opens: tuple[int, ...]
    decoupled: tuple[bool, ...]
    output_stream: int

    @property
    def streams_responses(self) -> bool:
        """Whether a request may get any number of responses (its outputs come from a
        decoupled step): Triton then makes the ensemble decoupled."""
        return any(self.decoupled)


def plan_flow(plan: EnsemblePlan, decoupled: Sequence[bool]) -> EnsembleFlow:
    """The streams of the steps, given which step models are decoupled (by step index). A step
    must read all its inputs from one stream, and the ensemble's outputs must all come from
    one: else which response goes with which is undefined (INVALID_ARG, as Triton)."""
    name = plan.name
    stream_of_tensor = dict.fromkeys(plan.inputs, 0)
    stream_of = [0] * len(plan.steps)
    opens = [0] * len(plan.steps)
    streams = 0
    for step in _in_dependency_order(name, plan.steps, set(plan.inputs)):
        read = {stream_of_tensor[tensor] for tensor in step.inputs.values()} or {0}
        if len(read) > 1:
            raise invalid_arg(
                f"in ensemble '{name}', step {step.index} (model '{step.model_name}') reads "
                "tensors that come from different decoupled models"
            )
        stream_of[step.index] = read.pop()
        if decoupled[step.index]:
            streams += 1
            opens[step.index] = streams
        else:
            opens[step.index] = stream_of[step.index]
        for tensor in step.outputs.values():
            stream_of_tensor[tensor] = opens[step.index]
    outputs = {stream_of_tensor[tensor] for tensor in plan.outputs}
    if len(outputs) > 1:
        raise invalid_arg(
            f"in ensemble '{name}', the ensemble's outputs come from different decoupled models"
        )
    return EnsembleFlow(tuple(stream_of), tuple(opens), tuple(decoupled), outputs.pop())


# -- the backend --------------------------------------------------------------------------------


class EnsembleModel(BackendModel):
    def __init__(self, plan: EnsemblePlan) -> None:
        self.plan = plan

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        raise internal(f"ensemble '{self.plan.name}' has no instances")


class EnsembleBackend(Backend):
    """Checks the DAG at load. Whether the step models exist is checked by the scheduler, which
    sees the models of every repository through the router (the steps may live in another
    repository than the ensemble)."""

    name = "ensemble"
    platforms = ("ensemble",)
    default_model_filename = ""

    def load_model(self, context: ModelContext) -> BackendModel:
        return EnsembleModel(plan_ensemble(context.config))
