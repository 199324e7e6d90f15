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

import numpy as np

from tritonactor.core import offload
from tritonactor.core.datatypes import serialize_bytes
from tritonactor.core.types import InferenceRequest, Tensor

_INTEGER = struct.Struct("<q")
DIGEST_BYTES = 16


# request.context key of the request's content digest, once worked out (`content_digest`).
CONTENT = "response_cache.content"


def request_key(model: str, version: int, request: InferenceRequest) -> bytes | None:
    """The cache key of `request` to `version` of `model`, or None when an input is not a numpy
    array in host memory (Triton hashes only inputs in CPU memory): such a request is neither
    looked up nor stored. Cheap once `content_digest` has run for the request."""
    content = content_digest(request)
    if content is None:
        return None
    # The content's 16 bytes and the version's 8, then the name: no two keys' bytes alike.
    hashed = content + _INTEGER.pack(version) + model.encode()
    return hashlib.blake2b(hashed, digest_size=DIGEST_BYTES).digest()


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
    not in host memory.

    What describes the request (each input's name, datatype, shape and data length, the
    requested outputs, the parameters) is hashed as one `repr` of plain values, which tells
    them apart as they are (True, 1, 1.0 and "1" differ; strings are quoted), then the inputs'
    data in the same order: their lengths come first, so no two requests' bytes run alike."""
    if CONTENT in request.context:
        known: bytes | None = request.context[CONTENT]
        return known
    inputs = sorted(request.inputs, key=_name) if len(request.inputs) > 1 else request.inputs
    described: list[tuple[str, str, tuple[int, ...], int]] = []
    payloads: list[bytes | np.ndarray] = []
    result: bytes | None = None
    for tensor in inputs:
        data = tensor.data
        if not isinstance(data, np.ndarray):
            break
        payload: bytes | np.ndarray
        if _is_bytes(tensor.datatype, data):
            payload = serialize_bytes(data)
            length = len(payload)
        else:
            payload = np.ascontiguousarray(data)
            length = payload.nbytes
        described.append((tensor.name, tensor.datatype, tuple(map(int, tensor.shape)), length))
        payloads.append(payload)
    else:
        parameters = request.model_parameters
        header = (
            described,
            sorted(request.requested_output_names),
            sorted(parameters.items()),  # (the names differ: values are never compared)
        )
        digest = hashlib.blake2b(repr(header).encode(), digest_size=DIGEST_BYTES)
        for payload in payloads:
            digest.update(payload)
        result = digest.digest()
    request.context[CONTENT] = result
    return result


def _name(tensor: Tensor) -> str:
    return tensor.name


def _is_bytes(datatype: str, data: np.ndarray) -> bool:
    return datatype == "BYTES" or data.dtype.hasobject
