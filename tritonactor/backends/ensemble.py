"""Triton ensembles (`platform: "ensemble"`): a DAG of steps, each a request to another model.

What can be checked from the ensemble's config alone is checked at load (`plan_ensemble`); what
needs its step models' configs (`check_steps`, `plan_flow`) once they are loaded. The ensemble
has no instances: `scheduling.ensemble.EnsembleScheduler` runs its requests through the router."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
)
from tritonactor.core.datatypes import dims_text
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
    # The ensemble's own batching, and its outputs' dims by name (without the batch dimension,
    # as `reshape` gives them if it does): what its answer's tensors are reshaped against
    # (`batch_reshaped`).
    max_batch_size: int = 0
    output_dims: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def models(self) -> list[str]:
        return sorted({step.model_name for step in self.steps})


def plan_ensemble(config: ModelConfig) -> EnsemblePlan:
    """The ensemble's steps. The config passed config/validate_ensemble.py (every step named
    and mapped, each tensor written once, every input read, every output written, no tensor
    left over, so no cycle); one check is left here, stricter than Triton: a step may not
    write an ensemble input (INVALID_ARG)."""
    name = config.name
    scheduling = config.ensemble_scheduling
    assert scheduling is not None
    inputs = tuple(tensor.name for tensor in config.input)
    outputs = tuple(tensor.name for tensor in config.output)
    steps: list[EnsembleStep] = []
    for index, step in enumerate(scheduling.step):
        for tensor in step.output_map.values():
            if tensor in inputs:
                raise invalid_arg(
                    f"ensemble '{name}': tensor '{tensor}' is both an ensemble input and "
                    f"written by step {index} (model '{step.model_name}')"
                )
        version = str(step.model_version) if step.model_version > 0 else ""
        steps.append(
            EnsembleStep(
                index, step.model_name, version, dict(step.input_map), dict(step.output_map)
            )
        )
    return EnsemblePlan(
        name,
        inputs,
        outputs,
        tuple(steps),
        scheduling.max_inflight_requests,
        config.max_batch_size,
        {
            tensor.name: tuple(tensor.reshape.shape if tensor.reshape else tensor.dims)
            for tensor in config.output
        },
    )


def batch_reshaped(
    dims: tuple[int, ...], batching: bool, batch_size: int, shape: tuple[int, ...]
) -> tuple[int, ...]:
    """The shape a tensor takes where it goes, as Triton's ensembles convert it between a side
    that batches and one that does not: `dims` and `batching` are the receiving side's (a step
    model's input, or the ensemble's output), `batch_size` the batch the tensor was made in (0:
    by a side that does not batch). An unbatched tensor that fits `dims` gains a batch of 1; a
    batch of 1 that does not fit `dims` loses its batch dimension; any other tensor is left as
    it is (the model's validation says what is wrong with it)."""
    if batching == (batch_size != 0):
        return shape
    if batching:
        return (1, *shape) if _same_shape(dims, shape) else shape
    if batch_size == 1 and not _same_shape(dims, shape):
        return shape[1:]
    return shape


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
    is not checked), in Triton's order and words: no step model allows a smaller batch than
    the ensemble; each mapped input exists in the model; every input of the model that is not
    `optional` is mapped; each mapped output exists; an ensemble tensor has one data type and
    compatible shapes everywhere it appears (-1 matches any size; a batching model's shape
    counts its batch dimension when compared with a non-batching one's). INVALID_ARG."""
    name = plan.name
    batching = ensemble.max_batch_size > 0
    specs: dict[str, _TensorSpec] = {}

    def declare(tensor: str, spec: _TensorSpec) -> None:
        known = specs.setdefault(tensor, spec)
        where = f"in ensemble {name}, ensemble tensor {tensor}: inconsistent"
        if known.data_type != spec.data_type:
            raise invalid_arg(
                f"{where} data type: {known.data_type} is inferred from model {known.origin} "
                f"while {spec.data_type} is inferred from model {spec.origin}"
            )
        if not _same_shape(known.dims, spec.dims) and not _same_shape(
            known.full_dims, spec.full_dims
        ):
            raise invalid_arg(
                f"{where} shape: {dims_text(known.full_dims)} is inferred from model "
                f"{known.origin} while {dims_text(spec.full_dims)} is inferred from model "
                f"{spec.origin}"
            )

    for tensor in (*ensemble.input, *ensemble.output):
        dims = tensor.reshape.shape if tensor.reshape is not None else tensor.dims
        declare(tensor.name, _TensorSpec(tensor.data_type.name, tuple(dims), batching, name))
    for step in plan.steps:
        config = steps.get(step.index)
        if config is None:
            continue
        model = step.model_name
        if 0 < config.max_batch_size < ensemble.max_batch_size:
            raise invalid_arg(
                f"ensemble {name} allows maximum batch size {ensemble.max_batch_size}, but it "
                f"contains model {model} which only allows maximum batch size to be "
                f"{config.max_batch_size}"
            )
        step_batching = config.max_batch_size > 0
        model_inputs = {tensor.name: tensor for tensor in config.input}
        for model_input, tensor in step.inputs.items():
            if model_input not in model_inputs:
                raise invalid_arg(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing "
                    f"input {model_input} in model {model}"
                )
        for spec in config.input:
            tensor = step.inputs.get(spec.name)
            if tensor is None:
                if spec.optional:
                    continue
                raise invalid_arg(
                    f"in ensemble {name}, input {spec.name} in model {model} is not mapped to "
                    "any ensemble tensors"
                )
            declare(
                tensor, _TensorSpec(spec.data_type.name, tuple(spec.dims), step_batching, model)
            )
        model_outputs = {tensor.name: tensor for tensor in config.output}
        for model_output, tensor in step.outputs.items():
            if model_output not in model_outputs:
                raise invalid_arg(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing "
                    f"output {model_output} in model {model}"
                )
            spec = model_outputs[model_output]
            declare(
                tensor, _TensorSpec(spec.data_type.name, tuple(spec.dims), step_batching, model)
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
            raise invalid_arg(_mixed_streams(name, step.model_name))
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
        raise invalid_arg(_mixed_streams(name, name))  # the ensemble's outputs, as Triton says
    return EnsembleFlow(tuple(stream_of), tuple(opens), tuple(decoupled), outputs.pop())


def _mixed_streams(name: str, model: str) -> str:
    return (
        f"in ensemble {name}, step of model '{model}' receives inputs originated from different "
        "decoupled models"
    )


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
