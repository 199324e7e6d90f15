"""JSON tensor data (an input's `"data"` array in a KServe v2 / Triton HTTP request) -> a numpy
array of the input's datatype and shape, or INVALID_ARG saying why not.

- FP16 and BF16 have no JSON form (as in Triton): such inputs must be binary.
- Nested arrays are read in their flat order, ragged nesting included: only the element count
  must fit the shape.
- Integers are checked against the datatype's range (a value outside it is an error, never
  wrapped); BOOL takes JSON booleans only, the numeric types numbers only (a boolean among
  them is refused); BYTES takes strings, encoded as UTF-8.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonactor.core.datatypes import BINARY_ONLY, num_elements, to_numpy_dtype
from tritonactor.core.errors import TritonError, invalid_arg
from tritonactor.core.tensors import RequestContext, shaped, string_count_error

_INTEGER_KINDS = "iu"
_FLOAT_KINDS = "iuf"


def array_from_json(
    context: RequestContext, name: str, datatype: str, shape: tuple[int, ...], data: Any
) -> np.ndarray:
    if datatype in BINARY_ONLY:
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}"
        )
    if not isinstance(data, list):
        raise invalid_arg(f"'data' of input '{name}' must be a JSON array")
    flat = _json_strings(name, data) if datatype == "BYTES" else _json_numbers(name, datatype, data)
    count = num_elements(shape)
    if flat.size != count:
        if datatype == "BYTES":
            raise string_count_error(context, name, flat.size, count)
        raise invalid_arg(
            f"unexpected shape for input '{name}' for model '{context.model}': shape "
            f"{list(shape)} holds {count} elements, 'data' has {flat.size}"
        )
    return shaped(flat, shape)


def _json_numbers(name: str, datatype: str, data: list[Any]) -> np.ndarray:
    flat: list[Any] | None = None
    try:
        parsed = np.array(data)
    except ValueError:
        # Ragged nesting: numpy refuses it, but the wire only cares about the flat order.
        flat = _flatten(data)
        parsed = np.array(flat)
    depth = parsed.ndim
    parsed = parsed.reshape(-1)
    dtype = to_numpy_dtype(datatype)
    if parsed.size == 0:
        return parsed.astype(dtype)
    if parsed.dtype.kind != "b" and datatype != "BOOL" and _holds_a_bool(data, depth, flat):
        # numpy reads [1.5, true] as [1.5, 1.0]: a JSON boolean is no number (Triton refuses it).
        raise invalid_arg(f"'data' of input '{name}' must hold {datatype} values")
    if dtype.kind in _INTEGER_KINDS:
        return _json_integers(name, datatype, parsed, data)
    allowed = "b" if datatype == "BOOL" else _FLOAT_KINDS
    if parsed.dtype.kind not in allowed:
        raise invalid_arg(f"'data' of input '{name}' must hold {datatype} values")
    if dtype.itemsize < parsed.dtype.itemsize:
        with np.errstate(over="ignore"):  # a value past FP32's range is its infinity, as in Triton
            return parsed.astype(dtype, copy=False)
    return parsed.astype(dtype, copy=False)


def _json_integers(name: str, datatype: str, parsed: np.ndarray, data: list[Any]) -> np.ndarray:
    dtype = to_numpy_dtype(datatype)
    if parsed.dtype.kind in _INTEGER_KINDS:
        if not np.can_cast(parsed.dtype, dtype):
            limits = np.iinfo(dtype)
            if int(parsed.min()) < limits.min or int(parsed.max()) > limits.max:
                raise _out_of_range(name, datatype)
        return parsed.astype(dtype, copy=False)
    # numpy infers float64 for a list that mixes values above the int64 range with others
    # (UINT64 data), so only then are the values checked one by one.
    values = _flatten(data)
    if not all(type(value) is int for value in values):
        raise invalid_arg(f"'data' of input '{name}' must hold {datatype} values")
    try:
        return np.array(values, dtype=dtype)
    except OverflowError:
        raise _out_of_range(name, datatype) from None


def _out_of_range(name: str, datatype: str) -> TritonError:
    limits = np.iinfo(to_numpy_dtype(datatype))
    return invalid_arg(
        f"'data' of input '{name}' holds a value outside the {datatype} range "
        f"[{limits.min}, {limits.max}]"
    )


def _json_strings(name: str, data: list[Any]) -> np.ndarray:
    try:
        try:
            items = [value.encode() for value in data]
        except AttributeError:
            items = [value.encode() for value in _flatten(data)]
    except (AttributeError, UnicodeEncodeError):
        raise invalid_arg(f"'data' of BYTES input '{name}' must hold strings") from None
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def _holds_a_bool(data: list[Any], depth: int, flat: list[Any] | None) -> bool:
    """Whether a JSON boolean is among `data`'s values, nested `depth` deep (`flat`: them in
    one list, when made already); a list or a list of lists is looked at in C, a row at a
    time."""
    if flat is not None:
        return bool in map(type, flat)
    if depth == 1:
        return bool in map(type, data)
    if depth == 2:
        return any(bool in map(type, row) for row in data)
    return bool in map(type, _flatten(data))


def _flatten(data: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for value in data:
        if isinstance(value, list):
            flat.extend(_flatten(value))
        else:
            flat.append(value)
    return flat


__all__ = ["array_from_json"]
