"""Tensors as raw bytes, the way both wire protocols carry them: row-major element data, BYTES
elements each behind a 4-byte little-endian length. Shared by the HTTP binary extension and
gRPC's raw contents, so that both report the same errors in the same words."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from tritonactor.core.datatypes import (
    deserialize_bytes,
    num_elements,
    serialize_bytes,
    to_numpy_dtype,
)
from tritonactor.core.errors import TritonError, invalid_arg
from tritonactor.core.types import InferenceRequest


class HeldView(np.ndarray):
    """Bytes that lie in memory lent by another process (a slot of the engine's lane,
    engine/lanes.py), which stays lent for as long as this array lives: every view of it
    leads back to it (an array's `base`, a memoryview's `obj`), so a writer may keep such a
    view until it has written it, with no copy made first (frontends/http/responses.py).
    Read-only."""


def owner_of(data: object) -> object:
    """What the memory `data` views belongs to: the first `HeldView` on the way through the
    views it is of (an array's `base`, a memoryview's `obj`), or the object they end at."""
    while True:
        if isinstance(data, np.ndarray):
            if type(data) is HeldView:
                return data
            base = data.base
            if base is None:
                return data
            data = base
        elif isinstance(data, memoryview):
            data = data.obj
        else:
            return data


def unchanging(data: object) -> bool:
    """Whether nothing can change `data`'s bytes while it lives: `bytes`, or a view of `bytes`
    or of a `HeldView` (a writer may then keep it, uncopied, until it has written it)."""
    owner = owner_of(data)
    return type(owner) is bytes or type(owner) is HeldView


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What error messages about one request name: its model, and its id as Triton's
    "[request id: ...] " prefix."""

    model: str
    request_id: str

    @property
    def prefix(self) -> str:
        return f"[request id: {self.request_id or '<id_unknown>'}] "


def array_from_bytes(
    context: RequestContext,
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    buffer: memoryview,
    declared: int | None = None,
) -> np.ndarray:
    """The tensor held in `buffer`, a read-only zero-copy view for fixed-size types.
    `declared`: the byte size a shared-memory input was given, which Triton holds against the
    tensor's (a size past the region that its unsigned bounds check let through is not the
    region's bytes that `buffer` holds)."""
    count = num_elements(shape)
    got = len(buffer) if declared is None else declared
    if datatype == "BYTES":
        if got != len(buffer):
            raise _size_mismatch(context, name, len(buffer), got)
        try:
            array = deserialize_bytes(buffer, count)
        except ValueError:
            raise _bytes_error(context, name, count, buffer) from None
        return shaped(array, shape)
    dtype = to_numpy_dtype(datatype)
    expected = count * dtype.itemsize
    if got != expected:  # (`declared` is the buffer's length, but where it wrapped)
        raise _size_mismatch(context, name, expected, got)
    array = np.frombuffer(buffer, dtype=dtype)
    if datatype == "BOOL":
        array = normalize_bools(array)
    return shaped(array, shape)


# The most dimensions a numpy array has. A request's tensor with more keeps its data flat: no
# model's config may have that many (config/validate.py refuses it at load), so the model's
# signature refuses it, with Triton's words, from the tensor's shape (reshaping would fail
# first, as an internal error).
MAX_DIMS = 64


def shaped(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`array` in `shape`, or as it is where `shape` has more than MAX_DIMS dimensions."""
    return array.reshape(shape) if len(shape) <= MAX_DIMS else array


# The request context's key of the first error found holding an input's data against its shape,
# kept for the model's signature to raise once the request's names, datatypes and shapes pass:
# Triton checks those first, so a request wrong in both is told of its shape or datatype.
DATA_ERROR = "data_error"
# The data of an input whose bytes did not fit its shape: never read (the request is refused).
UNREAD = np.empty(0, dtype=np.uint8)
UNREAD.flags.writeable = False


def array_or_later(
    errors: list[TritonError],
    context: RequestContext,
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    buffer: memoryview,
    declared: int | None = None,
) -> np.ndarray:
    """`array_from_bytes`, or UNREAD with its error added to `errors` (for `keep_data_error`)."""
    try:
        return array_from_bytes(context, name, datatype, shape, buffer, declared)
    except TritonError as error:
        errors.append(error)
        return UNREAD


def keep_data_error(request: InferenceRequest, errors: list[TritonError]) -> InferenceRequest:
    """`request`, holding the first of `errors` for its model's signature to raise."""
    if errors:
        request.context[DATA_ERROR] = errors[0]
    return request


def _size_mismatch(context: RequestContext, name: str, expected: int, got: int) -> TritonError:
    return invalid_arg(
        f"{context.prefix}input byte size mismatch for input '{name}' for model "
        f"'{context.model}'. Expected {expected}, got {got}"
    )


def _bytes_error(context: RequestContext, name: str, count: int, buffer: memoryview) -> TritonError:
    """What is wrong with BYTES data that does not hold `count` length-prefixed elements, told
    as Triton's walk over them tells it: a length prefix cut short first, then an element past
    the count, then the count; a last element longer than its bytes only where the count is
    right."""
    offset, found, short = 0, 0, 0
    while offset < len(buffer):
        if len(buffer) - offset < 4:
            return invalid_arg(
                f"{context.prefix}incomplete string length indicator for inference input "
                f"'{name}' for model '{context.model}', expecting 4 bytes but only "
                f"{len(buffer) - offset} bytes available. Please make sure the string length "
                "indicator is in one buffer."
            )
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        found += 1
        if found > count:
            return string_count_error(context, name, found, count)
        available = len(buffer) - offset
        if length > available:
            short = length
            break
        offset += length
    if found != count:
        return string_count_error(context, name, found, count)
    return invalid_arg(
        f"incomplete string data for inference input '{name}', expecting string of "
        f"length {short} but only {len(buffer) - offset} bytes available"
    )


def string_count_error(context: RequestContext, name: str, found: int, count: int) -> TritonError:
    """`found` elements where the shape holds `count`, in Triton's words: it stops counting at
    one past the count, so too many are told as `count + 1`."""
    if found < count:
        return invalid_arg(
            f"{context.prefix}expected {count} string elements for inference input '{name}' "
            f"for model '{context.model}', got {found}"
        )
    return invalid_arg(
        f"{context.prefix}unexpected number of string elements {min(found, count + 1)} for "
        f"inference input '{name}' for model '{context.model}', expecting {count}"
    )


def normalize_bools(array: np.ndarray) -> np.ndarray:
    # A byte other than 0/1 would make a numpy bool that compares unequal to True.
    raw = array.view(np.uint8)
    if raw.size and raw.max() > 1:
        return raw != 0
    return array


def tensor_to_bytes(datatype: str, array: np.ndarray) -> bytes | np.ndarray:
    """The wire bytes of a tensor: `bytes` for BYTES, else a uint8 view of the data in the
    datatype's dtype (no copy when it already is, contiguous)."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    # A uint8 view exports a plain byte buffer (BF16 has no buffer format of its own), which the
    # caller copies once into its message.
    return np.ascontiguousarray(array, dtype=to_numpy_dtype(datatype)).reshape(-1).view(np.uint8)
