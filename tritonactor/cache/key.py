"""What makes two requests the same request for the response cache.

Triton 2.51 (`TritonCache::Hash`) hashes only the model's name and version and, input by input in
name order, each input's name and bytes (a BYTES input's bytes are its length-prefixed wire form).
So on Triton the same bytes in another shape, other requested outputs or other parameters hit the
entry of the first request and are answered what it was answered (checked against Triton 2.51:
a [2, 2] request answered with the [1, 4] output of its twin, a request for every output answered
with the one output its twin asked for). Here the key holds everything the model sees of a
request, so a hit is always what the model would have answered:

- the model's name and version;
- each input, by name: its datatype, shape and data (BYTES elements as their length-prefixed
  wire form, so that ["ab", "c"] and ["a", "bc"] differ);
- the names of the requested outputs (none: every output);
- the request parameters the model sees (`InferenceRequest.model_parameters`: the scheduling
  ones such as `priority` and `timeout` are not among them; forwarded headers are).

It is a 128-bit BLAKE2b digest of those, so an entry's key costs 16 bytes whatever the inputs'
size. Which loaded copy of a version answered is not in the key: the router drops a version's
entries when that version leaves it or is replaced, and stores only the answers of the copy it
serves."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable

import numpy as np

from tritonactor.core import offload
from tritonactor.core.datatypes import serialize_bytes
from tritonactor.core.types import InferenceRequest, ParameterValue

_COUNT = struct.Struct("<Q")
_INTEGER = struct.Struct("<q")
_FLOAT = struct.Struct("<d")
DIGEST_BYTES = 16

_Update = Callable[[bytes | memoryview], object]


# request.context key of the request's content digest, once worked out (`content_digest`).
CONTENT = "response_cache.content"


def request_key(model: str, version: int, request: InferenceRequest) -> bytes | None:
    """The cache key of `request` to `version` of `model`, or None when an input is not a numpy
    array in host memory (Triton hashes only inputs in CPU memory): such a request is neither
    looked up nor stored. Cheap once `content_digest` has run for the request."""
    content = content_digest(request)
    if content is None:
        return None
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    _text(digest.update, model)
    digest.update(_INTEGER.pack(version))
    digest.update(content)
    return digest.digest()


def key_work(request: InferenceRequest) -> int:
    """What working out `request`'s key costs, in `offload` bytes (BYTES inputs: a step an
    element)."""
    work = 0
    for tensor in request.inputs:
        data = tensor.data
        if isinstance(data, np.ndarray):
            hashed = data.size * offload.ELEMENT_BYTES if _is_bytes(tensor.datatype, data) else 0
            work += hashed or data.nbytes
    return work


def content_digest(request: InferenceRequest) -> bytes | None:
    """The digest of what the model sees of `request` besides its own name and version (see
    the module's docstring), kept in `request.context` once worked out; None when an input is
    not in host memory."""
    if CONTENT in request.context:
        known: bytes | None = request.context[CONTENT]
        return known
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    update = digest.update
    inputs = sorted(request.inputs, key=lambda tensor: tensor.name)
    update(_COUNT.pack(len(inputs)))
    result: bytes | None = None
    for tensor in inputs:
        data = tensor.data
        if not isinstance(data, np.ndarray):
            break
        _text(update, tensor.name)
        _text(update, tensor.datatype)
        update(_COUNT.pack(len(tensor.shape)))
        for dim in tensor.shape:
            update(_INTEGER.pack(dim))
        if _is_bytes(tensor.datatype, data):
            payload: bytes | memoryview = serialize_bytes(data)
        else:
            payload = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        update(_COUNT.pack(len(payload)))
        update(payload)
    else:
        outputs = sorted(request.requested_output_names)
        update(_COUNT.pack(len(outputs)))
        for name in outputs:
            _text(update, name)
        parameters = request.model_parameters
        update(_COUNT.pack(len(parameters)))
        for key in sorted(parameters):
            _text(update, key)
            _value(update, parameters[key])
        result = digest.digest()
    request.context[CONTENT] = result
    return result


def _is_bytes(datatype: str, data: np.ndarray) -> bool:
    return datatype == "BYTES" or data.dtype.hasobject


def _text(update: _Update, text: str) -> None:
    data = text.encode()
    update(_COUNT.pack(len(data)))
    update(data)


def _value(update: _Update, value: ParameterValue) -> None:
    # Tagged by type: True, 1, 1.0 and "1" are four different parameters.
    if isinstance(value, bool):
        update(b"b1" if value else b"b0")
    elif isinstance(value, int):  # any size: gRPC's uint64 parameters do not fit an int64
        update(b"i")
        _text(update, str(value))
    elif isinstance(value, float):
        update(b"f" + _FLOAT.pack(value))
    else:
        update(b"s")
        _text(update, str(value))
