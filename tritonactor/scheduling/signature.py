"""What a model accepts, precomputed from its config, and the one request-validation path that
every front end shares. Messages follow Triton's wording so clients see the same errors."""

from __future__ import annotations

from dataclasses import dataclass

from tritonactor._proto.inference import ModelConfig, ModelInput, ModelOutput
from tritonactor.core.datatypes import config_to_wire
from tritonactor.core.errors import invalid_arg, unsupported
from tritonactor.core.types import InferenceRequest


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str  # wire name, e.g. "INT32", "BYTES"
    dims: tuple[int, ...]  # without the batch dimension when the model batches
    optional: bool = False

    def shape(self, max_batch_size: int) -> list[int]:
        """The full shape as metadata reports it: -1 leads when the model batches."""
        return [-1, *self.dims] if max_batch_size > 0 else list(self.dims)


class ModelSignature:
    """A model's inputs and outputs as clients see them."""

    __slots__ = ("_inputs", "_outputs", "_required", "inputs", "max_batch_size", "name", "outputs")

    def __init__(
        self,
        name: str,
        max_batch_size: int,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
    ) -> None:
        self.name = name
        self.max_batch_size = max_batch_size
        self.inputs = inputs
        self.outputs = outputs
        self._inputs = {spec.name: spec for spec in inputs}
        self._outputs = {spec.name for spec in outputs}
        self._required = [spec.name for spec in inputs if not spec.optional]

    @classmethod
    def from_config(cls, config: ModelConfig) -> ModelSignature:
        return cls(
            name=config.name,
            max_batch_size=config.max_batch_size,
            inputs=tuple(_spec(t, t.optional) for t in config.input),
            outputs=tuple(_spec(t, False) for t in config.output),
        )

    def validate(self, request: InferenceRequest) -> None:
        """Raise INVALID_ARG if the request does not fit the model (UNSUPPORTED if it asks for
        what this server cannot do); change nothing."""
        prefix = f"[request id: {request.id or '<id_unknown>'}] "
        inputs = self._inputs
        given = [tensor.name for tensor in request.inputs]
        missing = [name for name in self._required if name not in given]
        # As in Triton, the count comes first: too many inputs is reported as a count even when
        # one is unknown, and an unknown name within the count by that name.
        if not len(self._required) <= len(given) <= len(inputs):
            raise invalid_arg(f"{prefix}{self._count_message(given, missing)}")
        for name in given:
            if name not in inputs:
                raise invalid_arg(
                    f"{prefix}unexpected inference input '{name}' for model '{self.name}'"
                )
        if missing:  # an optional input was given in place of a required one
            raise invalid_arg(f"{prefix}{self._count_message(given, missing)}")
        batch_size = self._batch_size(request, prefix)
        for tensor in request.inputs:
            spec = inputs[tensor.name]
            if tensor.datatype != spec.datatype:
                raise invalid_arg(
                    f"{prefix}inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                    f"but model '{self.name}' expects '{spec.datatype}'"
                )
            shape = tensor.shape[1:] if batch_size is not None else tensor.shape
            if not _matches(shape, spec.dims):
                raise invalid_arg(
                    f"{prefix}unexpected shape for input '{tensor.name}' for model "
                    f"'{self.name}'. Expected {_dims(spec.shape(self.max_batch_size))}, "
                    f"got {_dims(tensor.shape)}. {_BATCH_NOTE if batch_size is not None else ''}"
                )
        outputs = self._outputs
        for output in request.outputs:
            if output.name not in outputs:
                raise invalid_arg(
                    f"unexpected inference output '{output.name}' for model '{self.name}'"
                )
            if "classification" in output.parameters:
                # Not implemented yet: answering the raw tensor instead would mislead the client.
                raise unsupported(
                    f"classification of output '{output.name}' of model '{self.name}' is not "
                    "supported by this server"
                )

    def _count_message(self, given: list[str], missing: list[str]) -> str:
        required = len(self._required)
        if required == len(self.inputs):
            expected = f"expected {required} inputs"
        else:
            expected = f"expected number of inputs between {required} and {len(self.inputs)}"
        return (
            f"{expected} but got {len(given)} inputs for model '{self.name}'. Got input(s) "
            f"{_names(given)}, but missing required input(s) {_names(missing)}. Please provide "
            "all required input(s)."
        )

    def _batch_size(self, request: InferenceRequest, prefix: str) -> int | None:
        """The batch size every input agrees on; None when the model does not batch."""
        if self.max_batch_size == 0:
            return None
        batch_size = None
        for tensor in request.inputs:
            if not tensor.shape:
                raise invalid_arg(
                    f"{prefix}input '{tensor.name}' has no batch dimension for '{self.name}'"
                )
            if batch_size is None:
                batch_size = tensor.shape[0]
            elif tensor.shape[0] != batch_size:
                raise invalid_arg(
                    f"{prefix}input '{tensor.name}' batch size does not match other inputs "
                    f"for '{self.name}'"
                )
        if batch_size is not None and not 1 <= batch_size <= self.max_batch_size:
            raise invalid_arg(
                f"{prefix}inference request batch-size must be <= {self.max_batch_size} "
                f"for '{self.name}'"
            )
        return batch_size


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the batch "
    "dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def _spec(tensor: ModelInput | ModelOutput, optional: bool) -> TensorSpec:
    # Clients see the config's dims; a `reshape` is applied inside the backend.
    return TensorSpec(
        name=tensor.name,
        datatype=config_to_wire(tensor.data_type.name),
        dims=tuple(tensor.dims),
        optional=optional,
    )


def _matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(want == -1 or want == got for got, want in zip(shape, dims, strict=True))


def _dims(dims: list[int] | tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"
