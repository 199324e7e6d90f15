"""A raw binary inference request (`Inference-Header-Content-Length: 0`): the whole body is the
data of the model's only input, shaped from the config as Triton does — `[1, *dims]` for a
batching model, `dims` otherwise, with the one variable dimension deduced from the body's size.
A BYTES input must have dims `[1]`: its one element is the body itself, with no 4-byte length
prefix. Every output is answered in binary, since the client sent no JSON to ask otherwise."""

from __future__ import annotations

import numpy as np

from tritonactor.core.datatypes import is_datatype, num_elements, to_numpy_dtype
from tritonactor.core.errors import invalid_arg
from tritonactor.core.tensors import RequestContext, array_from_bytes
from tritonactor.core.types import InferenceRequest, Tensor
from tritonactor.frontends.http.codec import BINARY_DATA_OUTPUT

__all__ = ["decode_raw_request"]


def decode_raw_request(
    body: bytes | bytearray | memoryview,
    input_name: str,
    datatype: str,
    dims: tuple[int, ...],
    batching: bool,
    model_name: str,
    model_version: str,
) -> InferenceRequest:
    """Decode a raw binary request: the whole body is the data of the model's only input.

    `input_name`, `datatype` and `dims` come from the model config (dims without the batch
    dimension); `batching` says whether the model batches (the request is then a batch of one).
    The one -1 dimension is deduced from the body's size. Every output is answered in binary,
    since the client sent no JSON to ask otherwise.
    """
    prefix = "[request id: <id_unknown>] "
    if not is_datatype(datatype):
        raise invalid_arg(f"unknown datatype '{datatype}' for input '{input_name}'")
    lead = (1,) if batching else ()
    if datatype == "BYTES":
        if tuple(dims) != (1,):
            raise invalid_arg(
                f"{prefix}For BYTE datatype raw input '{input_name}', the model must have input "
                "shape [1]"
            )
        data = np.empty(1, dtype=np.object_)
        data[0] = bytes(body)
        concrete = (*lead, 1)
        data = data.reshape(concrete)
    else:
        if sum(1 for dim in dims if dim < 0) > 1:
            raise invalid_arg(
                f"{prefix}The shape of the raw input '{input_name}' can not be deduced because "
                "there are more than one variable-sized dimension"
            )
        itemsize = to_numpy_dtype(datatype).itemsize
        count, remainder = divmod(len(body), itemsize)
        if remainder:
            raise invalid_arg(
                f"{prefix}raw binary data of {len(body)} bytes for input '{input_name}' is not a "
                f"whole number of {datatype} elements"
            )
        concrete = (*lead, *_infer_shape(input_name, datatype, tuple(dims), count))
        context = RequestContext(model_name, "")
        data = array_from_bytes(context, input_name, datatype, concrete, memoryview(body))
    request = InferenceRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=[Tensor(input_name, datatype, concrete, data)],
    )
    request.context[BINARY_DATA_OUTPUT] = True
    return request


def _infer_shape(name: str, datatype: str, shape: tuple[int, ...], count: int) -> tuple[int, ...]:
    """`shape` with its one -1 dimension set so that it holds `count` elements."""
    variable = [index for index, dim in enumerate(shape) if dim < 0]
    fixed = num_elements([dim for dim in shape if dim >= 0])
    if not variable:
        if fixed != count:
            raise invalid_arg(
                f"raw binary data for input '{name}' holds {count} {datatype} elements, "
                f"shape {list(shape)} needs {fixed}"
            )
        return tuple(shape)
    if fixed == 0 or count % fixed:
        raise invalid_arg(
            f"raw binary data for input '{name}' holds {count} {datatype} elements, which "
            f"do not fit shape {list(shape)}"
        )
    concrete = list(shape)
    concrete[variable[0]] = count // fixed
    return tuple(concrete)
