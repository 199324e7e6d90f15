"""Triton's tensor data types: wire names, config enum names, numpy dtypes, sizes."""

from __future__ import annotations

import struct

import numpy as np

# Wire name -> numpy dtype. BYTES tensors are numpy object arrays of `bytes`.
_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
try:  # BF16 needs ml_dtypes; a python model's own environment (EXECUTION_ENV_PATH) may lack it
    import ml_dtypes

    _NUMPY["BF16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    pass

DATATYPES: tuple[str, ...] = tuple(_NUMPY)

# Types whose JSON form is not allowed: they travel only as binary data.
BINARY_ONLY: frozenset[str] = frozenset({"FP16", "BF16"})

_BY_NUMPY: dict[np.dtype, str] = {dt: name for name, dt in _NUMPY.items()}

# What a tensor whose datatype names no type is called, as Triton's messages call it.
INVALID_DATATYPE = "<invalid>"


def is_datatype(name: str) -> bool:
    return name in _NUMPY


def to_numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype that holds a tensor of `datatype` (KeyError for an unknown name)."""
    return _NUMPY[datatype]


def from_numpy_dtype(dtype: np.dtype) -> str:
    """The wire data type of a numpy dtype; `str`/`bytes` arrays map to BYTES."""
    dtype = np.dtype(dtype)
    if dtype.kind in ("S", "U", "O"):
        return "BYTES"
    try:
        return _BY_NUMPY[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no Triton data type") from None


def element_size(datatype: str) -> int:
    """Bytes per element; 0 for BYTES, whose elements vary in size."""
    if datatype == "BYTES":
        return 0
    return _NUMPY[datatype].itemsize


def config_to_wire(config_type: str) -> str:
    """`TYPE_INT32` -> `INT32`; `TYPE_STRING` -> `BYTES` (config and wire names differ there)."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def wire_to_config(datatype: str) -> str:
    """`INT32` -> `TYPE_INT32`; `BYTES` -> `TYPE_STRING`."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def num_elements(shape: tuple[int, ...] | list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def dims_text(dims: tuple[int, ...] | list[int]) -> str:
    """A shape as Triton prints one: [-1,16]."""
    return "[" + ",".join(str(dim) for dim in dims) + "]"


_LENGTH = struct.Struct("<I")


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES elements in row-major order, each as a 4-byte little-endian length and its bytes."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        if isinstance(item, str):
            data = item.encode()
        elif isinstance(item, bytes | bytearray | memoryview | np.bytes_):
            data = bytes(item)
        else:  # a number or another object: its text, as Triton's python utils serialize it
            data = str(item).encode()
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Inverse of `serialize_bytes`: a 1-D object array. ValueError if the buffer is malformed
    or (when `count` is given) holds a different number of elements."""
    view = memoryview(buffer).cast("B")
    uniform = _uniform_bytes(view, count)
    if uniform is not None:
        items = uniform
    else:
        items = []
        offset, end = 0, len(view)
        limit = count if count is not None else end
        while offset < end:
            if offset + 4 > end:
                raise ValueError("BYTES data ends inside a 4-byte length prefix")
            (length,) = _LENGTH.unpack_from(view, offset)
            offset += 4
            if offset + length > end:
                raise ValueError(f"BYTES element of {length} bytes runs past the end of the data")
            if len(items) == limit:  # one past the count: the rest is not read (nor made)
                raise ValueError(f"BYTES data holds more than {limit} elements, expected {limit}")
            items.append(bytes(view[offset : offset + length]))
            offset += length
        if count is not None and len(items) != count:
            raise ValueError(f"BYTES data holds {len(items)} elements, expected {count}")
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


# The fewest elements read by numpy (below, its set-up costs more than the loop: ~5 µs).
_UNIFORM_FROM = 32


def _uniform_bytes(view: memoryview, count: int | None) -> list[bytes] | None:
    """The elements of BYTES data of many elements all as long as its first, read by numpy
    (strided views, no Python loop: many short elements cost a loop turn each otherwise); None
    for a few elements (the loop is quicker there) or ones not all that long. ValueError, before
    any element is made, when they are not `count`."""
    end = len(view)
    if end < 4 * _UNIFORM_FROM:
        return None
    (length,) = _LENGTH.unpack_from(view, 0)
    stride = 4 + length
    if end % stride:
        return None
    n = end // stride
    if n < _UNIFORM_FROM:
        return None
    prefixes = np.ndarray((n,), dtype="<u4", buffer=view, strides=(stride,))
    if not (prefixes == length).all():
        return None
    if count is not None and n != count:
        raise ValueError(f"BYTES data holds {n} elements, expected {count}")
    if length == 0:
        return [b""] * n
    elements = np.ndarray((n,), dtype=f"V{length}", buffer=view, offset=4, strides=(stride,))
    return elements.tolist()
