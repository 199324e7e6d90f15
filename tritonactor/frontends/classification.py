"""Triton's classification extension, applied where a response is encoded: an output requested
with `classification` = k is answered as BYTES strings `value:index[:label]`, its k highest
scores (fewer when the output holds fewer), highest first, per batch row when the model batches.

What a reader of the protocol alone would not guess (all as Triton 2.51 answers):

- Floating-point scores are written as C's `%f` (six decimals: `0.700000`, `-nan`, `inf`);
  integer scores in full.
- Equal scores are listed in the order Triton's sort leaves them (`ranking.top_k`).
- A label that is absent (index past the file's end) or empty is left out with its colon.
- The shape is `[k']`, or `[batch, k']` for a batching model, whatever the output's own rank:
  a row is everything after the batch dimension, flattened.
- Only numeric outputs can be ranked: BOOL, FP16, BF16 and BYTES are INVALID_ARG.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from tritonactor.core import offload
from tritonactor.core.datatypes import num_elements, to_numpy_dtype
from tritonactor.core.errors import invalid_arg
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.frontends.ranking import top_k
from tritonactor.scheduling.signature import CLASSIFICATION, Classification

__all__ = ["LARGE_OUTPUT", "classify", "classify_tensor", "encode_off_loop"]

T = TypeVar("T")

# Classified outputs of at least this many scores in all are ranked in a worker thread: ranking
# ties follows the sort step by step in Python (a million equal scores take most of a second),
# so a score counts as a Python-level step (`offload.ELEMENT_BYTES`).
LARGE_OUTPUT = offload.OFF_LOOP_BYTES // offload.ELEMENT_BYTES

_RANKED = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"}
)


def classify(response: InferenceResponse, request: InferenceRequest) -> InferenceResponse:
    """`response` with each output the request asked to classify replaced by its classes; the
    response itself is left as it was (it may be shared, e.g. by a cache)."""
    wanted: dict[str, Classification] | None = request.context.get(CLASSIFICATION)
    if not wanted:
        return response
    outputs = [
        classify_tensor(tensor, wanted[tensor.name]) if tensor.name in wanted else tensor
        for tensor in response.outputs
    ]
    return dataclasses.replace(response, outputs=outputs)


async def encode_off_loop(
    response: InferenceResponse, request: InferenceRequest, encode: Callable[[], T]
) -> T:
    """`encode()` (an encoder that classifies `response` for `request`), in a worker thread
    when the outputs to classify are large, so that the event loop goes on serving."""
    wanted = request.context.get(CLASSIFICATION)
    scores = 0
    if wanted:
        scores = sum(num_elements(t.shape) for t in response.outputs if t.name in wanted)
    return await offload.off_loop(encode, scores * offload.ELEMENT_BYTES)


def classify_tensor(tensor: Tensor, spec: Classification) -> Tensor:
    """The BYTES tensor of `tensor`'s top `spec.count` classes."""
    if tensor.datatype not in _RANKED:
        raise invalid_arg(
            f"class result not available for output due to unsupported type '{tensor.datatype}'"
        )
    shape = tuple(tensor.shape)
    batch = shape[0] if spec.batched and shape and shape[0] > 0 else 0
    row_size = num_elements(shape[1:] if batch else shape)
    rows = np.asarray(tensor.data, dtype=to_numpy_dtype(tensor.datatype)).reshape(
        max(batch, 1), row_size
    )
    count = min(spec.count, row_size)
    strings = np.empty((rows.shape[0], count), dtype=np.object_)
    for r, row in enumerate(rows):
        for c, index in enumerate(top_k(row, count)):
            strings[r, c] = _class_string(row[index], index, spec.labels)
    out_shape = (batch, count) if batch else (count,)
    return Tensor(tensor.name, "BYTES", out_shape, strings.reshape(out_shape), tensor.parameters)


def _class_string(value: np.generic, index: int, labels: tuple[bytes, ...]) -> bytes:
    text = f"{_score(value)}:{index}".encode()
    if index < len(labels) and labels[index]:
        return text + b":" + labels[index]
    return text


def _score(value: np.generic) -> str:
    """`std::to_string` of the score: `%f` for floating point, the integer in full."""
    if isinstance(value, np.floating):
        number = float(value)
        if math.isnan(number):
            return "-nan" if math.copysign(1.0, number) < 0 else "nan"
        return f"{number:f}"
    return str(int(value))
