"""Implicit state (`sequence_batching { state [...] }`): the sequence batcher, not the model,
keeps each sequence's state between its requests. A request gets the state as the input
`input_name`; the model's output `output_name` becomes the state of the sequence's next request.
The rules are written down in docs/scheduling.md ("Implicit state")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonactor._proto.inference import (
    ModelConfig,
    ModelSequenceBatchingInitialState,
    ModelSequenceBatchingState,
)
from tritonactor.core.datatypes import (
    config_to_wire,
    deserialize_bytes,
    is_datatype,
    num_elements,
    to_numpy_dtype,
)
from tritonactor.core.errors import internal, invalid_arg
from tritonactor.core.paths import inside
from tritonactor.core.types import InferenceResponse, RequestedOutput, Tensor

__all__ = ["INITIAL_STATE_FOLDER", "StateSpec", "parse_states", "requested_outputs", "take_states"]

# Triton reads `initial_state { data_file }` from this folder of the model's directory (beside
# the version folders, which is why a repository scan never takes it for a version).
INITIAL_STATE_FOLDER = "initial_state"

# A sequence's state: one tensor per state, named as the model input it feeds.
SavedState = dict[str, Tensor]


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One state, checked at load. `initial` is what the first request of a sequence (or one
    that restarts it) gets, with the batch dimension when the model batches."""

    input_name: str
    output_name: str
    datatype: str
    initial: np.ndarray

    def initial_tensor(self) -> Tensor:
        return Tensor(self.input_name, self.datatype, tuple(self.initial.shape), self.initial)


def parse_states(name: str, config: ModelConfig, model_dir: Path | None) -> tuple[StateSpec, ...]:
    """The config's states; INVALID_ARG (the load fails) for one without names, a name that
    clashes with a model input, a control input or another state, or a bad initial state.
    `model_dir` is where `initial_state/` lives; None when it is not known."""
    batching = config.sequence_batching
    assert batching is not None
    inputs = {tensor.name for tensor in config.input}
    controls = {control.name for control in batching.control_input}
    specs: list[StateSpec] = []
    for index, state in enumerate(batching.state):
        where = f"model '{name}': sequence_batching state {index}"
        if not state.input_name:
            raise invalid_arg(f"{where} must specify an input_name")
        if not state.output_name:
            raise invalid_arg(f"{where} ('{state.input_name}') must specify an output_name")
        where = f"model '{name}': state '{state.input_name}'"
        if state.input_name in inputs:
            raise invalid_arg(f"{where}: input_name is also a model input")
        if state.input_name in controls:
            raise invalid_arg(f"{where}: input_name is also a control input")
        if state.output_name in inputs or state.output_name in controls:
            raise invalid_arg(
                f"{where}: output_name '{state.output_name}' is also a model or control input"
            )
        if any(spec.input_name == state.input_name for spec in specs):
            raise invalid_arg(f"{where}: input_name is given by more than one state")
        if any(spec.output_name == state.output_name for spec in specs):
            raise invalid_arg(
                f"{where}: output_name '{state.output_name}' is given by more than one state"
            )
        datatype = _datatype(where, state.data_type.name)
        initial = _initial(where, state, datatype, model_dir)
        if config.max_batch_size > 0:
            initial = initial.reshape((1, *initial.shape))
        specs.append(StateSpec(state.input_name, state.output_name, datatype, initial))
    return tuple(specs)


def _datatype(where: str, config_type: str | None) -> str:
    if config_type in (None, "TYPE_INVALID"):
        raise invalid_arg(f"{where} must specify a data_type")
    datatype = config_to_wire(config_type)
    if not is_datatype(datatype):
        raise invalid_arg(f"{where} has data_type {config_type}, which this server cannot hold")
    return datatype


def _initial(
    where: str, state: ModelSequenceBatchingState, datatype: str, model_dir: Path | None
) -> np.ndarray:
    """The state of a sequence's first request, without the batch dimension. Without
    `initial_state`, zeros, each variable (-1) dim taken as 1 (Triton leaves that tensor
    uninitialized, with 1 for a variable dim; zeros make it deterministic)."""
    if not state.initial_state:
        shape = tuple(1 if dim == -1 else dim for dim in state.dims)
        return _zeros(datatype, shape)
    if len(state.initial_state) > 1:
        raise invalid_arg(f"{where} has more than one initial_state")
    initial = state.initial_state[0]
    where = f"{where}: initial_state"
    if initial.data_type != state.data_type:
        raise invalid_arg(f"{where} has a data_type other than the state's")
    if not initial.name:
        raise invalid_arg(f"{where} must specify a name")
    if len(initial.dims) != len(state.dims):
        raise invalid_arg(
            f"{where} has {len(initial.dims)} dims but the state has {len(state.dims)}"
        )
    for initial_dim, state_dim in zip(initial.dims, state.dims, strict=True):
        if initial_dim < 0:
            raise invalid_arg(f"{where} has a variable dim; its dims must be fixed")
        if state_dim != -1 and initial_dim != state_dim:
            raise invalid_arg(
                f"{where} dims {list(initial.dims)} do not match the state dims {list(state.dims)}"
            )
    shape = tuple(initial.dims)
    if initial.zero_data is not None:
        return _zeros(datatype, shape)
    if initial.data_file is not None:
        return _from_file(where, initial, datatype, shape, model_dir)
    raise invalid_arg(f"{where} must set zero_data or data_file")


def _zeros(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=to_numpy_dtype(datatype))


def _from_file(
    where: str,
    initial: ModelSequenceBatchingInitialState,
    datatype: str,
    shape: tuple[int, ...],
    model_dir: Path | None,
) -> np.ndarray:
    """Raw row-major little-endian elements (BYTES: each behind its 4-byte length), as Triton
    reads them; a longer file is cut to the size the dims need."""
    name = initial.data_file or ""
    if model_dir is None:
        raise invalid_arg(f"{where} data_file '{name}' cannot be read: no model directory")
    # The load checked a caller's config for links leaving the folder already.
    folder = model_dir / INITIAL_STATE_FOLDER
    path = inside(
        folder,
        name,
        what=f"{where} data_file '{name}'",
        where=f"the model's {INITIAL_STATE_FOLDER} folder",
        trust_links=True,
    )
    try:
        data = path.read_bytes()
    except OSError as error:
        raise invalid_arg(f"{where} data_file {path} cannot be read: {error.strerror}") from None
    count = num_elements(shape)
    if datatype == "BYTES":
        try:
            return deserialize_bytes(data, count).reshape(shape)
        except ValueError as error:
            raise invalid_arg(f"{where} data_file {path}: {error}") from None
    dtype = to_numpy_dtype(datatype).newbyteorder("<")
    needed = count * dtype.itemsize
    if len(data) < needed:
        raise invalid_arg(
            f"{where} needs {needed} bytes, but data_file {path} has only {len(data)}"
        )
    array = np.frombuffer(data[:needed], dtype=dtype).astype(dtype.newbyteorder("="))
    return array.reshape(shape)


def requested_outputs(
    specs: Iterable[StateSpec], asked: list[RequestedOutput], config_outputs: tuple[str, ...]
) -> tuple[list[RequestedOutput], frozenset[str]]:
    """The outputs to ask the backend for: the client's (every config output when it named
    none) and every state output; and the state outputs its answer must not show."""
    shown = {output.name for output in asked} if asked else set(config_outputs)
    outputs = list(asked) if asked else [RequestedOutput(name) for name in config_outputs]
    hidden: set[str] = set()
    for spec in specs:
        if spec.output_name not in shown:
            outputs.append(RequestedOutput(spec.output_name))
            hidden.add(spec.output_name)
    return outputs, frozenset(hidden)


def take_states(
    model: str,
    specs: Iterable[StateSpec],
    response: InferenceResponse,
    hidden: frozenset[str],
    previous: SavedState | None = None,
) -> tuple[InferenceResponse, SavedState]:
    """The sequence's next state from the model's answer, and that answer without the state
    outputs the client did not ask for. A state the model did not return stays as it was
    (`previous`; its initial value when there is none): Triton serves such a model, whose
    python backend carries no state at all. INTERNAL for a state output of another data
    type: the model breaks the state contract."""
    by_name = {tensor.name: tensor for tensor in response.outputs}
    saved: SavedState = dict(previous) if previous else {}
    for spec in specs:
        tensor = by_name.get(spec.output_name)
        if tensor is None:
            continue
        if tensor.datatype != spec.datatype:
            raise internal(
                f"model '{model}' returned the state output '{spec.output_name}' as "
                f"{tensor.datatype}, but the state is {spec.datatype}"
            )
        saved[spec.input_name] = Tensor(spec.input_name, spec.datatype, tensor.shape, tensor.data)
    if hidden:
        response.outputs = [tensor for tensor in response.outputs if tensor.name not in hidden]
    return response, saved
