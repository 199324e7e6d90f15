"""InferenceResponse -> the KServe v2 / Triton HTTP response body (JSON, or JSON followed by
binary outputs, Triton's binary tensor extension). Pure functions. What a reader of the wire
protocol alone would not guess:

- FP16 and BF16 have no JSON form (as in Triton): such outputs are always answered in binary
  whatever the client asked; every client reads binary outputs.
- A BYTES output asked for as JSON whose elements are not all UTF-8 is answered in binary,
  since JSON strings cannot carry arbitrary bytes.
- An output answered as JSON has a "parameters" key only when the tensor has parameters of its
  own: Triton's C++ client reads any output "parameters" as binary-data info.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
import orjson

from tritonactor.core.datatypes import BINARY_ONLY, is_datatype, num_elements, to_numpy_dtype
from tritonactor.core.errors import internal
from tritonactor.core.tensors import HeldView, owner_of, tensor_to_bytes
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.frontends.classification import classify
from tritonactor.frontends.http.codec import BINARY_DATA_OUTPUT
from tritonactor.frontends.http.json_body import encode_json

__all__ = ["encode_infer_response"]


def encode_infer_response(
    response: InferenceResponse,
    request: InferenceRequest,
    *,
    in_shared_memory: Collection[str] = (),
) -> tuple[bytes | tuple[bytes | memoryview, ...], int | None]:
    """Encode a response as the request asked: (body, JSON header length or None).

    The body is `bytes`, or a tuple of pieces to send one after another when a large output's
    data can be sent as it is (it lies in a slot of the engine's lane, or is a `bytes` object
    of its own) rather than copied into one body with the rest.

    The header length is not None when some output travels as binary data after the JSON; the
    front end then sends it as `Inference-Header-Content-Length`. The outputs named in
    `in_shared_memory` were written into the client's shared memory: their entries carry no
    data, as in Triton.
    """
    response = classify(response, request)
    binary_by_default = request.context.get(BINARY_DATA_OUTPUT) is True
    # A listed output is binary only by its own binary_data (JSON without it, as Triton's);
    # binary_data_output decides for the others.
    binary_requested = {
        output.name: output.parameters.get("binary_data") is True for output in request.outputs
    }
    outputs: list[dict[str, Any]] = []
    chunks: list[Any] = []
    for tensor in response.outputs:
        if tensor.name in in_shared_memory:
            outputs.append(_shared_memory_output(tensor))
            continue
        wants_binary = binary_requested.get(tensor.name, binary_by_default)
        entry, chunk = _encode_output(tensor, wants_binary)
        outputs.append(entry)
        if chunk is not None:
            chunks.append(chunk)
    header = encode_json(_response_header(response, outputs))
    if not chunks:
        return header, None
    return _body([header, *chunks]), len(header)


# An output's data at least this large is sent as it is, not joined into the body (joining
# copies it; one more ASGI message costs a few µs), when it is a `bytes` object of its own or
# lies in a slot of the engine's lane (engine/lanes.py).
SEND_AS_IS = 64 * 1024


def _body(pieces: list[Any]) -> bytes | tuple[bytes | memoryview, ...]:
    """The pieces as one `bytes`, or as several where a large one can be sent as it is."""
    body: list[bytes | memoryview] = []
    joined: list[Any] = []
    for piece in pieces:
        whole = _as_is(piece) if len(piece) >= SEND_AS_IS else None
        if whole is None:
            joined.append(piece)
            continue
        if joined:
            body.append(b"".join(joined))
            joined = []
        body.append(whole)
    if not body:
        return b"".join(joined)
    if joined:
        body.append(b"".join(joined))
    return tuple(body)


def _as_is(piece: Any) -> bytes | memoryview | None:
    """`piece` (a contiguous uint8 view) to send as it is: the `bytes` object it is all of, or
    a view of it where it lies in a lane's slot (which stays the front end's until the ASGI
    server lets go of the view: an ASGI server that wants `bytes` copies it then, once; one
    that writes what it is given, as uvicorn's httptools protocol does, copies nothing). None
    for anything else, which is joined."""
    if type(piece) is bytes:
        return piece
    if not (isinstance(piece, np.ndarray) and piece.flags.c_contiguous):
        return None  # (a reversed view of a whole object holds its bytes in another order)
    owner = owner_of(piece)
    if type(owner) is HeldView:
        return memoryview(piece)
    if type(owner) is bytes and len(owner) == piece.nbytes:
        return owner
    return None


def _response_header(response: InferenceResponse, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    # Built key by key in Triton's order (orjson keeps insertion order): id first, when set.
    header: dict[str, Any] = {"id": response.id} if response.id else {}
    header["model_name"] = response.model_name
    header["model_version"] = response.model_version
    if response.parameters:
        header["parameters"] = response.parameters
    header["outputs"] = outputs
    return header


def _shared_memory_output(tensor: Tensor) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": list(tensor.shape),
    }
    if tensor.parameters:
        entry["parameters"] = tensor.parameters
    return entry


def _encode_output(tensor: Tensor, wants_binary: bool) -> tuple[dict[str, Any], Any]:
    """The output's JSON entry and, when it travels in binary, its data (a bytes-like object)."""
    array = _output_array(tensor)
    entry: dict[str, Any] = {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": list(tensor.shape),
    }
    if not wants_binary and tensor.datatype not in BINARY_ONLY:
        data = _json_data(tensor.datatype, array)
        if data is not None:
            if tensor.parameters:
                entry["parameters"] = tensor.parameters
            entry["data"] = data
            return entry, None
    chunk = tensor_to_bytes(tensor.datatype, array)
    entry["parameters"] = {**tensor.parameters, "binary_data_size": len(chunk)}
    return entry, chunk


def _output_array(tensor: Tensor) -> np.ndarray:
    if not is_datatype(tensor.datatype):
        raise internal(f"output '{tensor.name}' has unknown datatype '{tensor.datatype}'")
    if tensor.datatype == "BYTES":
        array = np.asarray(tensor.data)
    else:
        # A no-op for well-behaved backends; a wrong dtype would otherwise corrupt the body.
        array = np.asarray(tensor.data, dtype=to_numpy_dtype(tensor.datatype))
    expected = num_elements(tensor.shape)
    if array.size != expected:
        raise internal(
            f"output '{tensor.name}' holds {array.size} elements, its shape "
            f"{list(tensor.shape)} needs {expected}"
        )
    return array


def _json_data(datatype: str, array: np.ndarray) -> Any:
    """The flat JSON value of `array`, or None when it has no JSON form."""
    if datatype == "BYTES":
        return _utf8_strings(array)
    # orjson writes contiguous numeric and bool arrays as JSON lists without Python objects.
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        return with_non_finite(flat)
    return flat


# How Triton's JSON writes the floats JSON has no number for (orjson would write null).
_NON_FINITE = {"nan": b"NaN", "inf": b"Infinity", "-inf": b"-Infinity"}


def with_non_finite(flat: np.ndarray) -> orjson.Fragment:
    """A float array holding NaN or infinities as Triton writes it (`non_finite_values`)."""
    return orjson.Fragment(b"[" + b",".join(non_finite_values(flat)) + b"]")


def non_finite_values(flat: np.ndarray) -> list[bytes]:
    """The JSON of each value of a flat float array holding NaN or infinities, as Triton writes
    them: those as the literals `NaN`, `Infinity` and `-Infinity` (which Python's json and
    tritonclient read back), the other values as orjson writes them."""
    values = orjson.dumps(flat, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    for index in np.flatnonzero(~np.isfinite(flat)).tolist():
        values[index] = _NON_FINITE[str(flat[index])]
    return values


def _utf8_strings(array: np.ndarray) -> list[str] | None:
    strings: list[str] = []
    for item in array.reshape(-1).tolist():
        if isinstance(item, str):
            strings.append(item)
        elif isinstance(item, bytes | bytearray):
            try:
                strings.append(item.decode())
            except UnicodeDecodeError:
                return None
        else:
            raise internal(f"a BYTES output holds a {type(item).__name__}, not bytes or str")
    return strings
