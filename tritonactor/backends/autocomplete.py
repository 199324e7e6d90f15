"""Config auto-complete shared by backends that can read a model file's signature (ONNX
models, TensorRT engines): the tensors a config leaves out, and Triton's batching defaults."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tritonactor._proto.inference import (
    DataType,
    ModelConfig,
    ModelDynamicBatching,
    ModelInput,
    ModelOutput,
    ModelTensorReshape,
)

# name -> the tensor's full shape in the model file, -1 for a dynamic dim.
Shapes = Mapping[str, Sequence[int]]


def complete_batching(config: ModelConfig, max_batch_size: int) -> None:
    """A config that lists no tensors leaves their shape to the model: when every tensor can
    carry a batch dimension, take `max_batch_size` and, as Triton does for a batch size it chose
    itself, turn the dynamic batcher on (unless a scheduler is configured)."""
    if config.max_batch_size != 0 or config.input or config.output or max_batch_size <= 0:
        return
    config.max_batch_size = max_batch_size
    no_scheduler = (
        config.dynamic_batching is None
        and config.sequence_batching is None
        and config.ensemble_scheduling is None
    )
    if max_batch_size > 1 and no_scheduler:
        config.dynamic_batching = ModelDynamicBatching()


def complete_tensors(
    listed: list[ModelInput] | list[ModelOutput],
    shapes: Shapes,
    type_of: Callable[[str], DataType],
    batching: bool,
    factory: Callable[..., ModelInput | ModelOutput],
) -> None:
    """Fill `listed` in place: every model tensor when it is empty, else the missing data types
    and dims of the tensors it names (unknown names are left for the load checks). `type_of`
    gives a tensor's config type (raising for a type Triton lacks), asked only when needed."""
    if not listed:
        for name, shape in shapes.items():
            dims, reshape = _dims(shape, batching)
            listed.append(  # type: ignore[arg-type]
                factory(name=name, data_type=type_of(name), dims=dims, reshape=reshape)
            )
        return
    for tensor in listed:
        shape = shapes.get(tensor.name)
        if shape is None:
            continue
        if tensor.data_type == DataType.TYPE_INVALID:
            tensor.data_type = type_of(tensor.name)
        if not tensor.dims and tensor.reshape is None:
            tensor.dims, tensor.reshape = _dims(shape, batching)


def _dims(shape: Sequence[int], batching: bool) -> tuple[list[int], ModelTensorReshape | None]:
    dims = list(shape[1:] if batching else shape)
    if not dims:
        # A config cannot hold empty dims: a scalar per batch item is dims [1] reshaped to [],
        # a scalar of a model that does not batch dims [1] (Triton refuses an empty reshape
        # there; the backends read dims [1] against a rank-0 tensor: base.model_reshape).
        return [1], ModelTensorReshape(shape=[]) if batching else None
    return dims, None
