"""A response as the cache keeps it: one immutable `bytes` blob in Triton's packed form, so that
nothing a model, a front end or a later request does to its own arrays reaches the cache, and
an entry costs the same few Python objects whatever its outputs.

The blob is what a response takes in Triton's `local` cache (`CacheEntry::SetBufferSize`): 4
bytes for the number of outputs, then per output 8 bytes for its packed size, its name and its
datatype each with a 4-byte length, its shape (a 4-byte length and 8 bytes a dimension), and its
data with an 8-byte length (BYTES data in its length-prefixed wire form). Triton keeps no
parameters in its cache; here the response's and its outputs' parameters follow, as JSON (which
keeps bool, int, float and str apart), and are charged like the rest: a response with no
parameters takes exactly what it takes in Triton.

`measure` works out that size from shapes and lengths before anything is copied, so a response
that can never fit is never copied (`pack` is only called for one that can)."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tritonactor.core import offload
from tritonactor.core.datatypes import (
    deserialize_bytes,
    num_elements,
    serialize_bytes,
    to_numpy_dtype,
)
from tritonactor.core.types import InferenceResponse, ParameterValue, Tensor

# The fixed part of a response and of each output in Triton's packed form.
RESPONSE_HEADER_BYTES = 4
OUTPUT_HEADER_BYTES = 8 + 4 + 4 + 4 + 8

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


@dataclass(frozen=True, slots=True)
class Measure:
    """What caching a response takes: `size`, the bytes of its blob (what the cache charges
    before its own overhead), and `work`, what packing it costs in `offload` bytes."""

    size: int
    work: int


def measure(response: InferenceResponse) -> Measure | None:
    """The size of `response`'s blob and the work of packing it, without copying anything; None
    when an output is not a numpy array in host memory (Triton caches only outputs in CPU
    memory)."""
    size = RESPONSE_HEADER_BYTES
    work = 0
    for tensor in response.outputs:
        data = tensor.data
        if not isinstance(data, np.ndarray):
            return None
        header = OUTPUT_HEADER_BYTES + len(tensor.name.encode()) + len(tensor.datatype.encode())
        size += header + 8 * len(tensor.shape)
        if _is_bytes(tensor):
            items = data.reshape(-1)
            lengths = sum(len(_element(item)) for item in items)
            size += 4 * items.size + lengths
            work += items.size * offload.ELEMENT_BYTES + lengths
        else:
            size += data.nbytes
            work += data.nbytes
    parameters = len(_parameters(response))
    return Measure(size + parameters, work + parameters)


def rough_work(response: InferenceResponse) -> int:
    """What measuring and packing `response` costs at least, in `offload` bytes, worked out
    without looking at any element (so that a response with many BYTES elements is measured
    off the event loop too)."""
    return offload.tensors_work(response.outputs)


def pack(response: InferenceResponse) -> bytes:
    """`response`'s blob (see the module's docstring); its outputs must pass `measure`."""
    parts: list[bytes | memoryview] = [_U32.pack(len(response.outputs))]
    for tensor in response.outputs:
        name = tensor.name.encode()
        datatype = tensor.datatype.encode()
        data = tensor.data
        if _is_bytes(tensor):
            payload: bytes | memoryview = serialize_bytes(data)
        else:
            payload = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        packed = 4 + len(name) + 4 + len(datatype) + 4 + 8 * len(tensor.shape) + 8
        packed += len(payload)
        parts += [_U64.pack(packed), _U32.pack(len(name)), name]
        parts += [_U32.pack(len(datatype)), datatype, _U32.pack(len(tensor.shape))]
        parts += [_I64.pack(int(dim)) for dim in tensor.shape]
        parts += [_U64.pack(len(payload)), payload]
    parts.append(_parameters(response))
    return b"".join(parts)


def unpack(blob: bytes, model_name: str, model_version: str, request_id: str) -> InferenceResponse:
    """The answer to a request that hit `blob`: a new response with the request's id, its
    arrays read-only views of the blob (BYTES: new object arrays)."""
    view = memoryview(blob)
    (count,) = _U32.unpack_from(view, 0)
    offset = 4
    raw: list[tuple[str, str, tuple[int, ...], int, int]] = []
    for _ in range(count):
        offset += 8
        name, offset = _text(view, offset)
        datatype, offset = _text(view, offset)
        (rank,) = _U32.unpack_from(view, offset)
        offset += 4
        shape = tuple(_I64.unpack_from(view, offset + 8 * i)[0] for i in range(rank))
        offset += 8 * rank
        (length,) = _U64.unpack_from(view, offset)
        offset += 8
        raw.append((name, datatype, shape, offset, length))
        offset += length
    response_parameters: dict[str, ParameterValue] = {}
    output_parameters: list[dict[str, ParameterValue]] = [{} for _ in raw]
    if offset < len(view):
        response_parameters, output_parameters = json.loads(bytes(view[offset:]))
    outputs = []
    for (name, datatype, shape, start, length), parameters in zip(
        raw, output_parameters, strict=True
    ):
        if datatype == "BYTES":
            array = deserialize_bytes(view[start : start + length], num_elements(shape))
        else:
            array = np.frombuffer(
                blob, dtype=to_numpy_dtype(datatype), count=num_elements(shape), offset=start
            )
        outputs.append(Tensor(name, datatype, shape, array.reshape(shape), dict(parameters)))
    return InferenceResponse(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        outputs=outputs,
        parameters=dict(response_parameters),
    )


def _is_bytes(tensor: Tensor) -> bool:
    return tensor.datatype == "BYTES" or tensor.data.dtype.hasobject


def _element(item: object) -> bytes:
    # As `serialize_bytes` encodes one element (measured here without joining them).
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, bytes | bytearray | memoryview | np.bytes_):
        return bytes(item)
    return str(item).encode()


def _parameters(response: InferenceResponse) -> bytes:
    """The response's and its outputs' parameters as JSON, or nothing when there are none."""
    outputs: list[Mapping[str, ParameterValue]] = [t.parameters for t in response.outputs]
    if not response.parameters and not any(outputs):
        return b""
    encoded = [dict(response.parameters), [dict(p) for p in outputs]]
    return json.dumps(encoded, separators=(",", ":")).encode()


def _text(view: memoryview, offset: int) -> tuple[str, int]:
    (length,) = _U32.unpack_from(view, offset)
    start = offset + 4
    return bytes(view[start : start + length]).decode(), start + length
