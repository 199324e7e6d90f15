"""The checks an ensemble's config must pass on its own, with Triton's words: its steps named
and mapped, each ensemble tensor written once, every input read, every output written from the
inputs, no tensor left over (which also refuses a cycle: its tensors are never written), and
none of what an ensemble cannot have (instance groups, optimization, warmup).

What the steps' own models must agree with (their inputs and outputs, data types, shapes and
batch sizes) is checked once they are loaded (`backends/ensemble.py`, `check_steps`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tritonactor._proto.inference import ModelConfig
from tritonactor.config.model_config import ConfigError

__all__ = ["ENSEMBLE_PLATFORM", "check_ensemble"]

ENSEMBLE_PLATFORM = "ensemble"


@dataclass(slots=True)
class _Tensor:
    """An ensemble tensor in the data flow: the tensors a step reads to write it (`before`) and
    those written from it (`after`)."""

    name: str
    written: bool
    ready: bool = False
    before: list[_Tensor] = field(default_factory=list)
    after: list[_Tensor] = field(default_factory=list)


def check_ensemble(config: ModelConfig) -> None:
    """ConfigError, with Triton's message, for an ensemble config that cannot run (and for an
    ensemble platform without steps, or steps on another platform)."""
    name = config.name
    scheduling = config.ensemble_scheduling
    if config.platform == ENSEMBLE_PLATFORM and config.backend:
        raise ConfigError(
            f"Ensemble model '{name}' must have platform type '{ENSEMBLE_PLATFORM}' and empty "
            "backend type"
        )
    if scheduling is None:
        if config.platform == ENSEMBLE_PLATFORM:
            raise ConfigError(
                f"ensemble scheduling must be set for ensemble {name} whose platform is "
                f"{ENSEMBLE_PLATFORM}"
            )
        return
    if config.platform != ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}"
        )
    if config.instance_group:
        raise ConfigError(f"instance group should not be specified for ensemble '{name}'")
    if config.optimization is not None:
        raise ConfigError(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise ConfigError(f"model_warmup can not be specified for ensemble '{name}'")
    if not scheduling.step:
        raise ConfigError(f"must specify 'step' for ensemble '{name}'")
    tensors = _flow(config)
    _check_flow(config, tensors)


def _flow(config: ModelConfig) -> dict[str, _Tensor]:
    """The ensemble tensors, each linked to those its step reads and those read to write it."""
    name = config.name
    tensors: dict[str, _Tensor] = {}
    assert config.ensemble_scheduling is not None
    for index, step in enumerate(config.ensemble_scheduling.step):
        for what, present in (
            ("model_name", step.model_name),
            ("input_map", step.input_map),
            ("output_map", step.output_map),
        ):
            if not present:
                raise ConfigError(f"must specify '{what}' in step {index} of ensemble '{name}'")
        written: list[_Tensor] = []
        # In the order of the models' tensor names: a protobuf map keeps none, and the tensor
        # a message names must not change from one load to the next.
        for _, tensor_name in sorted(step.output_map.items()):
            tensor = tensors.get(tensor_name)
            if tensor is None:
                tensor = tensors[tensor_name] = _Tensor(tensor_name, written=True)
            elif tensor.written:
                raise ConfigError(
                    f"ensemble tensor '{tensor_name}' can appear in an output map only once "
                    f"for ensemble '{name}' step {index}"
                )
            else:
                tensor.written = True
            written.append(tensor)
        for _, tensor_name in sorted(step.input_map.items()):
            read = tensors.setdefault(tensor_name, _Tensor(tensor_name, written=False))
            for tensor in written:
                tensor.before.append(read)
                read.after.append(tensor)
    return tensors


def _check_flow(config: ModelConfig, tensors: dict[str, _Tensor]) -> None:
    """From the ensemble's inputs, the tensors whose every source is ready become ready; every
    output must be, and every other tensor ready and read."""
    name = config.name
    queue: deque[_Tensor] = deque()
    for tensor_config in config.input:
        tensor = _used(tensors, "input", tensor_config.name, name)
        tensor.ready = True
        queue.append(tensor)
    while queue:
        for tensor in queue.popleft().after:
            if not tensor.ready and all(source.ready for source in tensor.before):
                tensor.ready = True
                queue.append(tensor)
    outputs: set[str] = set()
    for tensor_config in config.output:
        tensor = _used(tensors, "output", tensor_config.name, name)
        if not tensor.ready:
            raise ConfigError(_not_written(name, tensor))
        outputs.add(tensor.name)
    for tensor in tensors.values():
        if tensor.name not in outputs and (not tensor.ready or not tensor.after):
            raise ConfigError(f"ensemble tensor '{tensor.name}' is unused in ensemble '{name}'")


def _used(tensors: dict[str, _Tensor], kind: str, tensor: str, name: str) -> _Tensor:
    """The ensemble's input or output `tensor` in the flow; a step must read or write it.
    (Triton's message has one quote mark after the ensemble's name, none before.)"""
    found = tensors.get(tensor)
    if found is None:
        raise ConfigError(f"ensemble {kind} '{tensor}' for ensemble {name}' is not used")
    return found


def _not_written(name: str, output: _Tensor) -> str:
    """Triton's message for an output never written, naming the first tensor up its sources
    that is not ready and has none that is (once each: a cycle ends the walk)."""
    message = f"output '{output.name}' for ensemble '{name}' is not written"
    last, sources, seen = output, output.before, set()
    while sources:
        unready = next((s for s in sources if not s.ready and s.name not in seen), None)
        if unready is None:
            break
        seen.add(unready.name)
        last, sources = unready, unready.before
    if last is not output:
        message += f": at least one of its depending tensors, '{last.name}', is not connected"
    return message
