"""What a model accepts, precomputed from its config, and the one request-validation path that
every front end shares. Messages follow Triton's wording so clients see the same errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tritonactor._proto.inference import ModelConfig, ModelInput, ModelOutput
from tritonactor.core.datatypes import config_to_wire, dims_text
from tritonactor.core.errors import TritonError, internal, invalid_arg
from tritonactor.core.paths import inside
from tritonactor.core.tensors import DATA_ERROR
from tritonactor.core.types import InferenceRequest, RequestedOutput

# request.context key: {output name: Classification} for the outputs a request asks to have
# classified; set by `ModelSignature.validate`, read where the response is encoded.
CLASSIFICATION = "classification"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str  # wire name, e.g. "INT32", "BYTES"
    dims: tuple[int, ...]  # without the batch dimension when the model batches
    optional: bool = False

    def shape(self, max_batch_size: int) -> list[int]:
        """The full shape as metadata reports it: -1 leads when the model batches."""
        return [-1, *self.dims] if max_batch_size > 0 else list(self.dims)


@dataclass(frozen=True, slots=True)
class Classification:
    """An output asked for as its top `count` classes: what the front end needs to answer
    `value:index[:label]` strings in its place."""

    count: int
    labels: tuple[bytes, ...]  # the output's label file, one label a line (empty: none)
    batched: bool  # the model batches: the output's first dimension is the batch


class ModelSignature:
    """A model's inputs and outputs as clients see them, and its outputs' class labels."""

    __slots__ = (
        "_inputs",
        "_labels",
        "_outputs",
        "_required",
        "inputs",
        "max_batch_size",
        "name",
        "outputs",
    )

    def __init__(
        self,
        name: str,
        max_batch_size: int,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        labels: dict[str, tuple[bytes, ...]] | None = None,
    ) -> None:
        self.name = name
        self.max_batch_size = max_batch_size
        self.inputs = inputs
        self.outputs = outputs
        self._inputs = {spec.name: spec for spec in inputs}
        self._outputs = {spec.name for spec in outputs}
        self._required = [spec.name for spec in inputs if not spec.optional]
        self._labels = labels or {}

    @classmethod
    def from_config(
        cls,
        config: ModelConfig,
        model_dir: Path | None = None,
        steps: Callable[[str, str], ModelSignature] | None = None,
    ) -> ModelSignature:
        """The signature of `config`; with `model_dir`, the outputs' `label_filename` files
        (relative to it) are read now, once: a file that cannot be read fails the load with
        INTERNAL, as in Triton. For an ensemble, `steps` gives the signature of a step's model
        (name, version; "" = the highest ready): an output with no label file of its own takes
        the labels of the first step output mapped to it, as Triton does."""
        labels = {}
        if model_dir is not None:
            labels = {
                t.name: read_labels(label_path(model_dir, t.name, t.label_filename))
                for t in config.output
                if t.label_filename
            }
        if steps is not None and config.ensemble_scheduling is not None:
            labels.update(_step_labels(config, set(labels), steps))
        return cls(
            name=config.name,
            max_batch_size=config.max_batch_size,
            inputs=tuple(_spec(t, t.optional) for t in config.input),
            outputs=tuple(_spec(t, False) for t in config.output),
            labels=labels,
        )

    def labels(self, output: str) -> tuple[bytes, ...]:
        """The class labels of `output` (empty when its config names no label file)."""
        return self._labels.get(output, ())

    def validate(self, request: InferenceRequest) -> None:
        """Raise INVALID_ARG if the request does not fit the model; change nothing but, for a
        request that asks for classification, `request.context[CLASSIFICATION]`."""
        if not self._plainly_valid(request):
            self._check(request)
        if DATA_ERROR in request.context:  # told of once the rest of the request is right
            # (kept: a request may be validated again, `Router.prepare` then `submit`)
            raise request.context[DATA_ERROR]

    def _plainly_valid(self, request: InferenceRequest) -> bool:
        """Whether `request` passes every check of `_check` with nothing to note: the common
        request, in one pass over its tensors (every input known, given once, the required
        ones all there, datatypes and shapes as configured, one batch size in range; outputs
        the model has, none asking for classification). False leaves the request to `_check`,
        which finds and words what is wrong, in Triton's order. (`validate` runs twice a
        request: in the front end and in the engine.)"""
        inputs = self._inputs
        given = request.inputs
        batched = self.max_batch_size != 0  # as `_batch_size` reads it
        batch_size = None
        required = 0
        for tensor in given:
            spec = inputs.get(tensor.name)
            if spec is None or tensor.datatype != spec.datatype:
                return False
            shape = tensor.shape
            if batched:
                if not len(shape):
                    return False
                if batch_size is None:
                    batch_size = shape[0]
                elif shape[0] != batch_size:
                    return False
                shape = shape[1:]
            # (A shape not a tuple, a numpy array's say, is compared by `_matches` alone.)
            if not (type(shape) is tuple and shape == spec.dims) and not _matches(shape, spec.dims):
                return False
            if not spec.optional:
                required += 1
        if required != len(self._required):
            return False
        if len(given) > 1 and len({tensor.name for tensor in given}) != len(given):
            return False  # a name twice
        if batched and (batch_size is None or not 1 <= batch_size <= self.max_batch_size):
            return False
        outputs = self._outputs
        for output in request.outputs:
            if output.name not in outputs or "classification" in output.parameters:
                return False
        return True

    def _check(self, request: InferenceRequest) -> None:
        """`validate`'s checks, one by one, in Triton's order."""
        prefix = f"[request id: {request.id or '<id_unknown>'}] "
        # As in Triton, the front end reads the requested outputs' parameters before the core
        # looks at the inputs: a bad class count is reported first.
        counts: dict[str, int] = {}
        for output in request.outputs:  # as Triton, the first of a repeated output counts
            counts.setdefault(output.name, _class_count(output))
        inputs = self._inputs
        given = [tensor.name for tensor in request.inputs]
        missing = [name for name in self._required if name not in given]
        # As in Triton, the count comes first: too many inputs is reported as a count even when
        # one is unknown, and an unknown name within the count by that name.
        if not len(self._required) <= len(given) <= len(inputs):
            raise invalid_arg(f"{prefix}{self._count_message(given, missing)}")
        for name in given:
            if name not in inputs:  # (Triton's model answers it: no request id before it)
                raise invalid_arg(f"unexpected inference input '{name}' for model '{self.name}'")
        if missing:
            # An optional input given in place of a required one: Triton 2.51 counts the inputs
            # only, and runs the model without it (docs/decisions.md).
            raise invalid_arg(
                f"{prefix}model '{self.name}' got input(s) {_names(given)}, but missing required "
                f"input(s) {_names(missing)}. Please provide all required input(s)."
            )
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
                note = _BATCH_NOTE if batch_size is not None else ""
                raise invalid_arg(
                    f"{prefix}unexpected shape for input '{tensor.name}' for model "
                    f"'{self.name}'. Expected {dims_text(spec.shape(self.max_batch_size))}, "
                    f"got {dims_text(tensor.shape)}. {note}"
                )
        outputs = self._outputs
        for output in request.outputs:
            if output.name not in outputs:
                raise invalid_arg(
                    f"unexpected inference output '{output.name}' for model '{self.name}'"
                )
        classified = {
            name: Classification(count, self.labels(name), self.max_batch_size > 0)
            for name, count in counts.items()
            if count
        }
        if classified:
            request.context[CLASSIFICATION] = classified

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
                    f"{prefix}input '{tensor.name}' has no shape but model requires batch "
                    f"dimension for '{self.name}'"
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


def _class_count(output: RequestedOutput) -> int:
    """The number of classes `output` asks for (0: none). Triton's gRPC front end words the
    errors; its HTTP one accepts 0 as "no classification", which both front ends do here."""
    parameters = output.parameters
    if "classification" not in parameters:
        return 0
    count = parameters["classification"]
    if not isinstance(count, int) or isinstance(count, bool):
        raise invalid_arg("invalid value type for 'classification' parameter, expected int64_param")
    if count < 0:
        raise invalid_arg("invalid value for 'classification' parameter, expected >= 0")
    if count and "shared_memory_region" in parameters:
        raise invalid_arg("Output can't set both 'shared_memory_region' and 'classification'")
    return count


def label_path(model_dir: Path, output: str, filename: str) -> Path:
    """Where an output's `label_filename` is: joined to the model folder as Triton joins it (a
    leading `/` names a path inside the folder). A name that leaves the folder (`..`) is
    refused (`core.paths.inside`); the load checked a caller's config for links already."""
    return inside(model_dir, filename, what=label_description(output, filename), trust_links=True)


def label_description(output: str, filename: str) -> str:
    """How a refused label file is named in the error."""
    return f"label_filename '{filename}' of output '{output}'"


def label_stamp(config: ModelConfig, model_dir: Path) -> str:
    """Size and modification time of each of `config`'s label files: a change means the
    labels must be read again (they are outside the version folders)."""
    stamps = []
    for t in config.output:
        if t.label_filename:
            try:
                path = label_path(model_dir, t.name, t.label_filename)
                info = path.stat()
                stamps.append(f"{t.name}:{info.st_size}:{info.st_mtime_ns}")
            except (OSError, TritonError):
                stamps.append(f"{t.name}:-")
    return " ".join(stamps)


# A label file larger than this fails the load (it would be held in memory per version).
LABEL_FILE_LIMIT = 64 * 1024 * 1024


def read_labels(path: Path) -> tuple[bytes, ...]:
    """A label file: one label a line, as bytes (a last line without a newline counts; a
    trailing newline adds no empty label)."""
    try:
        with path.open("rb") as file:
            text = file.read(LABEL_FILE_LIMIT + 1)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise internal(f"failed to open text file for read {path}: {reason}") from None
    if len(text) > LABEL_FILE_LIMIT:
        raise internal(f"label file {path} is larger than the limit of {LABEL_FILE_LIMIT} bytes")
    lines = text.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return tuple(lines)


def _step_labels(
    config: ModelConfig, own: set[str], steps: Callable[[str, str], ModelSignature]
) -> dict[str, tuple[bytes, ...]]:
    """Labels for the ensemble outputs without a label file: the first step output mapped to
    each (a step whose model is not loaded gives none)."""
    wanted = {t.name for t in config.output} - own
    found: dict[str, tuple[bytes, ...]] = {}
    for step in config.ensemble_scheduling.step:
        mapped = [(key, value) for key, value in step.output_map.items() if value in wanted]
        if not mapped:
            continue
        version = str(step.model_version) if step.model_version > 0 else ""
        try:
            signature = steps(step.model_name, version)
        except TritonError:
            continue
        for key, value in mapped:
            if value not in found:
                found[value] = signature.labels(key)
    return found


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


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"
