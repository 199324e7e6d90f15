"""A load-time check shared by the backends that read their model file's signature (ONNX
Runtime, TensorRT): does a config tensor describe the model's tensor?"""

from __future__ import annotations

from collections.abc import Sequence

from tritonactor._proto.inference import DataType, ModelInput, ModelOutput
from tritonactor.backends.base import model_reshape
from tritonactor.core.errors import invalid_arg


def check_tensor(
    model: str,
    kind: str,
    entry: ModelInput | ModelOutput,
    data_type: DataType,
    native_type: str,
    shape: Sequence[int | None],
    max_batch_size: int,
    source: str,
) -> None:
    """Raise INVALID_ARG unless `entry` (a config input or output) has the model's data type
    and a shape that agrees with the model's `shape` (its full shape, the batch dimension first
    when `max_batch_size > 0`; None or -1 for a dynamic dimension). The caller has checked that
    the batch dimension is dynamic: how it can fail to be differs by model format. The model
    sees the reshaped shape, so `reshape` is compared when the config has one. `source` names
    the model file in the messages ("ONNX model", "TensorRT engine")."""
    where = f"model '{model}' {kind} '{entry.name}'"
    if entry.data_type != data_type:
        raise invalid_arg(
            f"{where} has data type {DataType(entry.data_type).name} in the config "
            f"but {data_type.name} ({native_type}) in the {source}"
        )
    batching = max_batch_size > 0
    model_shape = list(shape)[1:] if batching else list(shape)
    config_shape = list(entry.reshape.shape) if entry.reshape is not None else list(entry.dims)
    if entry.reshape is None and model_reshape(entry, len(model_shape), batching) == ():
        return  # a scalar of a model that does not batch: dims [1]
    agrees = len(config_shape) == len(model_shape) and all(
        dim in (None, -1) or wanted in (-1, dim)
        for wanted, dim in zip(config_shape, model_shape, strict=True)
    )
    if agrees:
        return
    field = "reshape" if entry.reshape is not None else "dims"
    batch_note = " plus the batch dimension" if batching else ""
    shown = [-1 if dim is None else dim for dim in shape]
    rank = ""
    if len(config_shape) != len(model_shape):
        rank = f" (rank {len(config_shape) + batching} vs {len(shown)})"
    raise invalid_arg(
        f"{where} has {field} {config_shape}{batch_note} in the config but shape {shown} in "
        f"the {source}{rank}"
    )
