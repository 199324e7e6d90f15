"""A response as the cache keeps it: its outputs copied into immutable bytes, so that nothing a
model, a front end or a later request does to its own arrays reaches the cache.

`byte_size` is what the response takes in Triton's `local` cache (`CacheEntry::SetBufferSize`):
4 bytes for the number of outputs, then per output 8 bytes for its packed size, its name and its
datatype each with a 4-byte length, its shape (a 4-byte length and 8 bytes a dimension), and its
data with an 8-byte length. BYTES data counts in its length-prefixed wire form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tritonactor.core.datatypes import deserialize_bytes, serialize_bytes
from tritonactor.core.types import InferenceResponse, ParameterValue, Tensor

# The fixed part of a response and of each output in Triton's packed form.
RESPONSE_HEADER_BYTES = 4
OUTPUT_HEADER_BYTES = 8 + 4 + 4 + 4 + 8


@dataclass(frozen=True, slots=True)
class CachedOutput:
    """One output: `data` is its elements in row-major order (BYTES: the wire form)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    dtype: np.dtype
    data: bytes
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)

    @property
    def byte_size(self) -> int:
        return (
            OUTPUT_HEADER_BYTES
            + len(self.name.encode())
            + len(self.datatype.encode())
            + 8 * len(self.shape)
            + len(self.data)
        )

    def tensor(self) -> Tensor:
        """A fresh tensor over the cached bytes (read-only; BYTES: a new object array)."""
        if self.dtype.hasobject:
            count = int(np.prod(self.shape)) if self.shape else 1
            array = deserialize_bytes(self.data, count).reshape(self.shape)
        else:
            array = np.frombuffer(self.data, dtype=self.dtype).reshape(self.shape)
        return Tensor(self.name, self.datatype, self.shape, array, dict(self.parameters))


@dataclass(frozen=True, slots=True)
class CachedResponse:
    """A successful response of a model that is not decoupled, as the cache keeps it."""

    outputs: tuple[CachedOutput, ...]
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)

    @property
    def byte_size(self) -> int:
        """What the entry takes in Triton's `local` cache (see the module's docstring)."""
        return RESPONSE_HEADER_BYTES + sum(output.byte_size for output in self.outputs)

    def response(self, model_name: str, model_version: str, request_id: str) -> InferenceResponse:
        """The answer to a request that hit this entry: a new response with the request's id."""
        return InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            id=request_id,
            outputs=[output.tensor() for output in self.outputs],
            parameters=dict(self.parameters),
        )


def freeze(response: InferenceResponse) -> CachedResponse | None:
    """A copy of `response` for the cache, or None when an output is not a numpy array in host
    memory (Triton caches only outputs in CPU memory)."""
    outputs = []
    for tensor in response.outputs:
        data = tensor.data
        if not isinstance(data, np.ndarray):
            return None
        if data.dtype.hasobject or tensor.datatype == "BYTES":
            payload = serialize_bytes(data)
            dtype = np.dtype(np.object_)
        else:
            payload = np.ascontiguousarray(data).tobytes()
            dtype = data.dtype
        outputs.append(
            CachedOutput(
                tensor.name,
                tensor.datatype,
                tuple(int(dim) for dim in tensor.shape),
                dtype,
                payload,
                dict(tensor.parameters),
            )
        )
    return CachedResponse(tuple(outputs), dict(response.parameters))
