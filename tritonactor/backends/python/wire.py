"""The server's side of what travels to and from a stub: a request's entry in an execute
message, and a response's wire form back into an `InferenceResponse`; the config's `reshape`s
between what clients send and get and what the model sees and makes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonactor.backends.base import reshaped, undo_reshape
from tritonactor.config.model_config import ModelConfig
from tritonactor.core.errors import ErrorCode, TritonError, internal, invalid_arg
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor

_SEQUENCE_START = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
_SEQUENCE_END = 2


def request_entry(
    key: int, request: InferenceRequest, all_outputs: Sequence[str]
) -> dict[str, Any]:
    """What the stub needs to rebuild `request` (its tensors travel in shared memory)."""
    parameters = request.parameters
    flags = (_SEQUENCE_START if parameters.get("sequence_start") is True else 0) | (
        _SEQUENCE_END if parameters.get("sequence_end") is True else 0
    )
    return {
        "key": key,
        "model_name": request.model_name,
        "model_version": request.resolved_version or -1,
        "id": request.id,
        "correlation_id": parameters.get("sequence_id", 0),
        "flags": flags,
        # What the model's request.timeout() answers: the request's own, in microseconds.
        "timeout": _timeout(parameters.get("timeout")),
        # As in Triton, the parameters the server acts on (sequence controls...) are not the
        # model's.
        "parameters": dict(request.model_parameters),
        "inputs": len(request.inputs),
        # As in Triton, a request that names no outputs asks for all of them.
        "outputs": request.requested_output_names or list(all_outputs),
        # What the model's request.trace().get_context() answers.
        "trace": None if request.trace is None else request.trace.carrier(),
    }


def _timeout(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def bls_parameters(message: dict[str, Any]) -> dict[str, Any]:
    """What the server acts on of a BLS request (its correlation id, sequence flags and
    timeout) in the form its schedulers read them. The call's own parameters are the model's
    alone, whatever their names (`bls_model_parameters`), as in Triton."""
    parameters: dict[str, Any] = {}
    timeout = _timeout(message.get("timeout"))
    if timeout:
        parameters["timeout"] = timeout
    correlation_id = message.get("correlation_id") or 0
    if correlation_id:
        parameters["sequence_id"] = correlation_id
    flags = message.get("flags") or 0
    if flags & _SEQUENCE_START:
        parameters["sequence_start"] = True
    if flags & _SEQUENCE_END:
        parameters["sequence_end"] = True
    return parameters


def bls_model_parameters(message: dict[str, Any]) -> dict[str, Any]:
    """A BLS request's own parameters: the called model sees them as given (a `priority` or a
    `sequence_id` among them is no control of the server's, as in Triton)."""
    return dict(message.get("parameters") or {})


def error_from_wire(error: tuple[str, str]) -> TritonError:
    code, text = error
    return TritonError(ErrorCode.named(code), text)


@dataclass(frozen=True)
class Reshapes:
    """A model config's `reshape`s, as Triton applies them for every backend: an input goes to
    the model in its `reshape` (after the batch dimension, when the model batches), and an
    output the model makes in its `reshape` goes back to the client in the config's `dims`.
    Each -1 of the shape a tensor goes to takes, in order, the size of the tensor's own
    variable dimensions (-1 in the shape it comes in)."""

    model: str
    batching: bool
    inputs: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]  # name: (dims, reshape)
    outputs: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]  # name: (reshape, dims)

    @classmethod
    def of(cls, model: str, config: ModelConfig) -> Reshapes | None:
        """The config's reshapes; None where it has none (most models)."""
        inputs = {
            t.name: (tuple(t.dims), tuple(t.reshape.shape))
            for t in config.input
            if t.reshape is not None
        }
        outputs = {
            t.name: (tuple(t.reshape.shape), tuple(t.dims))
            for t in config.output
            if t.reshape is not None
        }
        if not inputs and not outputs:
            return None
        return cls(model, config.max_batch_size > 0, inputs, outputs)

    def input(self, name: str, data: np.ndarray) -> np.ndarray:
        """Input `name` in the shape the model gets it."""
        shapes = self.inputs.get(name)
        if shapes is None:
            return data
        dims, reshape = shapes
        try:
            return reshaped(data, dims, reshape, self.batching)
        except ValueError:
            raise invalid_arg(
                f"model '{self.model}' tensor '{name}' of shape {list(data.shape)} cannot take "
                f"the config's shape {list(reshape)}"
            ) from None

    def output(self, name: str, data: np.ndarray) -> np.ndarray:
        """Output `name` in the shape the client gets it (the model's error, INTERNAL, when it
        cannot take it: as every backend's)."""
        shapes = self.outputs.get(name)
        if shapes is None:
            return data
        reshape, dims = shapes
        return undo_reshape(self.model, name, data, dims, self.batching, reshape)


def response_from_wire(
    model_name: str,
    model_version: str,
    request: InferenceRequest,
    wire: dict[str, Any],
    arrays: Iterator[tuple[str, str, np.ndarray]],
    reshapes: Reshapes | None = None,
) -> InferenceResponse | TritonError:
    """A response the stub sent for `request` (its tensors taken from `arrays`), or the error it
    carries. Outputs the client did not ask for are dropped; an output the config reshapes goes
    back to its dims (`reshapes`)."""
    count = wire["outputs"]
    tensors = list(itertools.islice(arrays, count))
    if len(tensors) != count:
        raise internal(f"a response of model '{model_name}' lacks {count - len(tensors)} tensors")
    if wire["error"] is not None:
        return error_from_wire(wire["error"])
    wanted = set(request.requested_output_names) if request.outputs else None
    if reshapes is not None:
        try:
            tensors = [(n, d, reshapes.output(n, array)) for n, d, array in tensors]
        except TritonError as error:
            return error
    outputs = [
        Tensor(name=name, datatype=datatype, shape=tuple(array.shape), data=array)
        for name, datatype, array in tensors
        if wanted is None or name in wanted
    ]
    given = wire.get("parameters")
    parameters = (
        {k: v for k, v in given.items() if isinstance(v, bool | int | float | str)} if given else {}
    )
    return InferenceResponse(
        model_name=model_name,
        model_version=model_version,
        id=request.id,
        outputs=outputs,
        parameters=parameters,
    )


def response_to_wire(
    response: InferenceResponse | None, error: TritonError | None
) -> tuple[dict[str, Any], list[tuple[str, np.ndarray]]]:
    """A response (or error) the server gives a BLS call, and the tensors that go with it."""
    if error is not None or response is None:
        failure = error or TritonError(ErrorCode.INTERNAL, "no response")
        return {"descriptors": [], "error": (failure.code.name, failure.message)}, []
    return (
        {"descriptors": [], "error": None, "parameters": dict(response.parameters)},
        [(t.name, t.data) for t in response.outputs],
    )
